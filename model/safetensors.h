// safetensors reader and crash-consistent writer (torch-free).
//
// Format (docs/formats.md §6; huggingface/safetensors README, src/tensor.rs):
//   u64 LE N | N bytes of UTF-8 JSON header | data
//   header = {"__metadata__": {str: str, ...},
//             name: {"dtype": "F32"|"BF16"|..., "shape": [d0, d1, ...],
//                    "data_offsets": [begin, end]}, ...}
// Offsets are bytes relative to the data start; end - begin = numel * dtype size; tensors are
// row-major little-endian, cover the data section with no gaps or overlaps; names are unique;
// N <= 100,000,000. This writer space-pads the JSON so that N % 8 == 0 (as the reference
// writer does) and always stores "__metadata__": {"format": "pt"} (transformers requires it).
//
// Supported dtypes (element bytes): F64 8, F32 4, F16 2, BF16 2, I64 8, I32 4, I16 2, I8 1,
// U8 1, BOOL 1. ReadF32 converts F32, F16, BF16 and F64.
//
// Thread-safety: SafetensorsFile is immutable after Open; const methods may be called
// concurrently. WriteSafetensors is reentrant (distinct paths).
#ifndef LSPO_MODEL_SAFETENSORS_H_
#define LSPO_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/mapped_file.h"

namespace lspo::model {

// Maximum JSON header size accepted by the reader (bytes), as in the reference reader.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// Element size in bytes of a safetensors dtype ("F32" -> 4); 0 if unsupported.
int64_t SafetensorsDtypeSize(absl::string_view dtype);

// One tensor to write. `data` (not owned, must stay valid during the call) holds `nbytes` =
// numel(shape) * dtype size bytes, row-major little-endian.
struct SafetensorsEntry {
  std::string name;            // e.g. "model.layers.0.self_attn.q_proj.weight"
  std::string dtype;           // "F32", "BF16", "F16", ... (see the file comment)
  std::vector<int64_t> shape;  // torch shape; {} for a scalar
  const void* data = nullptr;
  size_t nbytes = 0;
};

// Writes `entries` (in this order, contiguous) and `metadata` (plus format=pt) to `path`:
// writes `path`.tmp, fsyncs it, renames it over `path`, and fsyncs the directory, so a crash
// leaves either the old or the complete new file.
// Errors: kInvalidArgument for an empty, duplicate or "__metadata__" name, an unsupported
// dtype, a negative dimension, nbytes != numel * dtype size, null data with nbytes > 0,
// a "format" metadata value other than "pt", or a name/metadata that is not valid UTF-8;
// I/O failures map errno via absl::ErrnoToStatus (e.g. kNotFound for a missing directory,
// kPermissionDenied), and the .tmp file is removed.
absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                              const std::map<std::string, std::string>& metadata);

// Header entry of one stored tensor.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // bytes, relative to the data start
  uint64_t end = 0;
  int64_t numel() const;
};

// A memory-mapped safetensors file with a validated header. Movable, not copyable.
class SafetensorsFile {
 public:
  SafetensorsFile(SafetensorsFile&&) = default;
  SafetensorsFile& operator=(SafetensorsFile&&) = default;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // Maps and validates `path`. Errors: kNotFound (missing file); kDataLoss if the file is
  // shorter than 8 bytes, N > 100 MB or past the end of the file, the header is not a JSON
  // object, has duplicate keys, a malformed entry (dtype/shape/data_offsets), non-string
  // metadata, a negative or overflowing shape, end - begin != numel * size, offsets past the
  // data, or overlapping / gapped tensors; kUnimplemented for an unsupported dtype.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  // As Open, over an in-memory copy of a file's bytes; `name` is used in messages.
  static absl::StatusOr<SafetensorsFile> FromBytes(std::vector<uint8_t> bytes,
                                                   const std::string& name = "<memory>");

  // Tensor names in data-offset order.
  const std::vector<std::string>& names() const { return names_; }
  // "__metadata__" entries (empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr if absent.
  const SafetensorsTensorInfo* Find(absl::string_view name) const;

  // Torch shape / dtype of a tensor; kNotFound if absent.
  absl::StatusOr<std::vector<int64_t>> shape(absl::string_view name) const;
  absl::StatusOr<std::string> dtype(absl::string_view name) const;

  // Raw little-endian bytes of a tensor; kNotFound if absent.
  absl::StatusOr<absl::Span<const uint8_t>> RawData(absl::string_view name) const;

  // Tensor converted to f32 (numel values, row-major). kNotFound if absent; kUnimplemented
  // for a dtype other than F32/F16/BF16/F64.
  absl::StatusOr<std::vector<float>> ReadF32(absl::string_view name) const;

  // As ReadF32, into `dst` (exactly numel floats, caller-owned). kInvalidArgument when
  // dst.size() != numel; otherwise the errors of ReadF32.
  absl::Status ReadF32Into(absl::string_view name, absl::Span<float> dst) const;

  // Hints that the mapped bytes of tensor `name` will not be read again soon: their pages
  // leave this process's resident set (madvise MADV_DONTNEED on a read-only private mapping;
  // a later read maps them back from the file). No-op for an in-memory file or an unknown
  // name. Used to stream a checkpoint one tensor at a time.
  void ReleasePages(absl::string_view name) const;

 private:
  SafetensorsFile() = default;
  static absl::StatusOr<SafetensorsFile> Parse(MappedFile file, const std::string& name);

  MappedFile file_;
  std::string name_;
  uint64_t data_start_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
  absl::flat_hash_map<std::string, SafetensorsTensorInfo> tensors_;
};

}  // namespace lspo::model

#endif  // LSPO_MODEL_SAFETENSORS_H_
