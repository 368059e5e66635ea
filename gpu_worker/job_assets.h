// Loading what a job names: the model (GGUF or seeded tiny random Llama) and its tokenizer.
// Shared by the worker (training copy) and the optimizer service (fp32 master weights), so
// both start from bit-identical W0.
#ifndef LSPO_GPU_WORKER_JOB_ASSETS_H_
#define LSPO_GPU_WORKER_JOB_ASSETS_H_

#include "absl/status/statusor.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "proto/lsp_offload.pb.h"

namespace lspo::worker {

// The tokenizer of spec.model.tokenizer_path (a GGUF file).
// Errors: those of GgufFile::Open and BpeTokenizer::FromGguf, prefixed with the path.
absl::StatusOr<model::BpeTokenizer> LoadJobTokenizer(const lspo::v1::JobSpec& spec);

// The model: "gguf" -> dequantised fp32 weights of spec.model.path; "tiny-random" ->
// TinyLlamaConfig(vocab of the tokenizer file) initialised from spec.model.init_seed.
// Errors: kInvalidArgument (unknown format), file errors prefixed with the path.
absl::StatusOr<model::LlamaModel> LoadJobModel(const lspo::v1::JobSpec& spec);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_JOB_ASSETS_H_
