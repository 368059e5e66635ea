// A Hugging Face model folder as `save_pretrained` writes it (torch-free): config.json, the
// weights as one `model.safetensors` or as shards listed by `model.safetensors.index.json`,
// and the optional generation_config.json. Tokenizer files are read by text/tokenizer.h.
//
// Layout (docs/formats.md §7; transformers modeling_utils.py, huggingface/safetensors):
//   config.json                       architecture and sizes (model/llama_config.h)
//   model.safetensors                 every tensor, or
//   model.safetensors.index.json      {"metadata": {"total_size": bytes},
//                                      "weight_map": {tensor name: shard file name}}
//   model-0000K-of-0000N.safetensors  the shards (any names the index gives, in the folder)
//   generation_config.json            optional (eos_token_id, sampling defaults)
// As in transformers, a single model.safetensors wins over an index when both exist.
//
// Open maps every weight file and validates its header; no tensor bytes are read until
// ReadF32Into, which converts one tensor and then releases its pages, so a model can be
// streamed into fp32 with a peak near its fp32 size.
//
// Thread-safety: immutable after Open; const methods may be called concurrently.
#ifndef LSPO_MODEL_HF_CHECKPOINT_H_
#define LSPO_MODEL_HF_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

namespace lspo::model {

// The part of a model.safetensors.index.json that locates the tensors.
struct SafetensorsIndex {
  std::map<std::string, std::string> weight_map;  // tensor name -> shard file name
  std::vector<std::string> shards;                // the shard file names, sorted, no repeats
};

// Parses the text of a model.safetensors.index.json (`path` names it in messages; nothing is
// read from disk). Only "weight_map" is read ("metadata" is informational). Errors, each
// naming `path`: kDataLoss when the text is not valid JSON, is not an object with a
// "weight_map" object, or maps a tensor to anything but a file name in the folder (a
// non-empty string without '/').
absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view text,
                                                       const std::string& path);

// The end-of-sequence ids of a generation_config.json text (`path` names it in messages):
// "eos_token_id" as one integer or a list of integers, in the file's order. Entries that are
// not integers in [0, 2^63) are skipped (no token can have such an id); an absent or null key
// gives an empty list. Errors: kDataLoss naming `path` when the text is not valid JSON or not
// a JSON object.
absl::StatusOr<std::vector<int64_t>> GenerationConfigEosIds(absl::string_view text,
                                                            const std::string& path);

// True when `path` is a directory holding a config.json (what format detection calls an HF
// folder). Never fails: false for a missing path or a regular file.
bool IsHfModelFolder(const std::string& path);

class HfCheckpoint {
 public:
  HfCheckpoint(HfCheckpoint&&) = default;
  HfCheckpoint& operator=(HfCheckpoint&&) = default;
  HfCheckpoint(const HfCheckpoint&) = delete;
  HfCheckpoint& operator=(const HfCheckpoint&) = delete;

  // Opens the folder `dir`. Errors (each names the file):
  //   kNotFound: `dir` is not a directory, or lacks config.json, or has neither
  //     model.safetensors nor model.safetensors.index.json (a folder of pytorch_model.bin
  //     files is named as such: convert it with save_pretrained(safe_serialization=True)),
  //     or the index names a shard file that does not exist;
  //   kDataLoss: config.json / the index / generation_config.json is not valid JSON, the
  //     index lacks "weight_map", the index lists a tensor its shard does not contain, a
  //     tensor appears in two shards, or a weight file fails SafetensorsFile::Open's checks
  //     (truncated file, bad header, ...).
  static absl::StatusOr<HfCheckpoint> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Parsed config.json.
  const nlohmann::json& config() const { return config_; }
  // Parsed generation_config.json; null when the folder has none.
  const nlohmann::json& generation_config() const { return generation_config_; }

  // Every tensor name in the folder, sorted.
  std::vector<std::string> TensorNames() const;
  // Header entry of tensor `name` (dtype, torch shape, offsets); nullptr if absent.
  const SafetensorsTensorInfo* Find(absl::string_view name) const;
  // Path of the weight file holding `name` ("" if absent), for messages.
  std::string FileOf(absl::string_view name) const;

  // Converts tensor `name` (F32, BF16, F16 or F64) to fp32 into `dst` (numel floats), then
  // releases the source pages (SafetensorsFile::ReleasePages). Errors: kNotFound (absent),
  // kInvalidArgument (dst size differs from numel), kUnimplemented (other dtypes); each
  // message names the file.
  absl::Status ReadF32Into(absl::string_view name, absl::Span<float> dst) const;

 private:
  HfCheckpoint() = default;

  std::string dir_;
  nlohmann::json config_;
  nlohmann::json generation_config_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::string> file_paths_;
  absl::flat_hash_map<std::string, size_t> file_of_;  // tensor name -> index into files_
};

}  // namespace lspo::model

#endif  // LSPO_MODEL_HF_CHECKPOINT_H_
