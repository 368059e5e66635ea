// Writing a Hugging Face model folder (docs/models.md "Outputs", docs/formats.md §6): a job's
// output_dir and the model of each training checkpoint (the worker's SaveArtifacts writes the
// config and tokenizer files, plus the weights in native mode; the optimizer writes its fp32
// master weights in the offloaded modes), and `lspctl convert` (a GGUF as such a folder).
// The folder loads with HfCheckpoint / LlamaModel::FromHfCheckpoint, BpeTokenizer::FromHfFolder
// and transformers' from_pretrained.
// Thread-safety: stateless functions; concurrent writers of one folder race as the OS lets them
// (each file is written atomically, so the last writer of a file wins, never a mix).
#ifndef LSPO_OFFLOAD_HF_EXPORT_H_
#define LSPO_OFFLOAD_HF_EXPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/llama_config.h"
#include "offload/state_file.h"
#include "proto/job_spec.pb.h"
#include "text/tokenizer.h"

namespace lspo::offload {

// Writes `path` (a model.safetensors) with every tensor of `tensors` in `dtype` (at::kFloat:
// F32, at::kBFloat16: BF16, each value rounded to nearest even from its fp32 value) under its
// name, in order, shapes kept; each is converted from its dtype (fp32, bf16, fp16, ...) and
// copied to the host when on a device. Metadata {"format": "pt"}, as transformers writes it.
// Errors: kInvalidArgument for another `dtype`; those of WriteTensorFile /
// model::WriteSafetensors (kPermissionDenied, kNotFound for a missing parent directory,
// kResourceExhausted, kInternal; the path named).
absl::Status WriteModelSafetensors(const NamedTensors& tensors, const std::string& path,
                                   at::ScalarType dtype = at::kFloat);

// The dtype a job's model is written in (JobSpec.save_dtype, resolved by spec::ResolveDefaults;
// unset reads as fp32): at::kBFloat16 or at::kFloat.
at::ScalarType SaveDtypeOf(const lspo::v1::JobSpec& spec);

// Writes an HF model folder into `dir` (created with its parents when missing; files already
// there are replaced one by one), its weights in `dtype` (at::kFloat or at::kBFloat16):
//   config.json             config.ToHfConfigJson("float32" or "bfloat16")
//   generation_config.json  a copy of `generation_config_source` when that names a regular file
//                           (an input folder's sampling defaults and eos list), else
//                           config.ToHfGenerationConfigJson() (the special ids)
//   tokenizer.json, tokenizer_config.json (with the chat template), special_tokens_map.json,
//                           chat_template.jinja: tokenizer.WriteHfFiles (which of them is
//                           written depends on the tokenizer's source; see its comment)
//   model.safetensors       WriteModelSafetensors(*weights, dtype) when `weights` is not null (the
//   HF
//                           names and shapes of LlamaModel::NamedTensors); null = the caller
//                           writes the weights itself (the optimizer's master weights)
// Returns the paths of the folder's files, in that order (of the tokenizer files, those
// present after WriteHfFiles).
// Errors: kPermissionDenied when `dir` cannot be created or written; kInvalidArgument when it
// is a file; the read error of `generation_config_source`; those of WriteHfFiles and
// WriteModelSafetensors. A failure leaves the files written before it in place.
absl::StatusOr<std::vector<std::string>> WriteHfModelFolder(
    const model::LlamaConfig& config, const model::BpeTokenizer& tokenizer,
    const std::string& generation_config_source, const NamedTensors* weights,
    const std::string& dir, at::ScalarType dtype = at::kFloat);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_HF_EXPORT_H_
