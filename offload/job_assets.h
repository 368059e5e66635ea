// Loading what a job names: the model (HF folder, GGUF or seeded tiny random Llama) and its
// tokenizer.
// Shared by the worker (training copy) and the optimizer service (fp32 master weights), so
// both start from bit-identical W0.
// Shapes: a linear's W (m, n), m out features, n in features.
#ifndef LSPO_OFFLOAD_JOB_ASSETS_H_
#define LSPO_OFFLOAD_JOB_ASSETS_H_

#include "absl/status/statusor.h"
#include "model/llama.h"
#include "proto/job_spec.pb.h"
#include "text/tokenizer.h"

namespace lspo::offload {

// The tokenizer of spec.model.tokenizer_path: an HF folder (BpeTokenizer::FromHfFolder:
// tokenizer.json, tokenizer_config.json) or a GGUF file (BpeTokenizer::FromGguf).
// Errors: those of the reader, prefixed with the path.
absl::StatusOr<model::BpeTokenizer> LoadJobTokenizer(const lspo::v1::JobSpec& spec);

// The config of a "tiny-random" model: TinyLlamaConfig(vocab_size) when shape.hidden_size is 0,
// else the given HF-named sizes (head_dim = hidden_size / num_attention_heads, 2048 positions).
// Errors: kInvalidArgument naming model.random_shape when LlamaConfig::Validate rejects it.
absl::StatusOr<model::LlamaConfig> RandomLlamaConfig(const lspo::v1::LlamaShape& shape,
                                                     int64_t vocab_size);

// The shape of spec.model without reading a weight, for the memory planner
// (offload/memory_plan.h) and the worker's check before it loads: "hf" -> the folder's
// config.json (the weight files need not be there yet), "gguf" -> the file's llama.* metadata,
// "tiny-random" -> RandomLlamaConfig with the vocabulary of the tokenizer file (read).
// Errors: as LlamaConfigFromHfJson / LlamaConfigFromGguf / LoadJobTokenizer, prefixed with
// the path; kInvalidArgument for an unknown format.
absl::StatusOr<model::LlamaConfig> LoadJobModelConfig(const lspo::v1::JobSpec& spec);

// The model: "hf" -> the folder's weights converted to fp32 (LlamaModel::FromHfCheckpoint);
// "gguf" -> dequantised fp32 weights of spec.model.path; "tiny-random" ->
// RandomLlamaConfig(spec.model.random_shape, vocab of the tokenizer file) initialised from
// spec.model.init_seed. Then, with spec.model.adapter_path, that PEFT LoRA adapter merged into
// the weights (W += scaling B A in fp32; baselines/lora.h ReadPeftAdapter), so the worker and
// the optimizer start from the same merged weights.
// Errors: kInvalidArgument (unknown format), file errors prefixed with the path; the adapter's
// errors (ReadPeftAdapter) prefixed with "job spec field model.adapter_path".
absl::StatusOr<model::LlamaModel> LoadJobModel(const lspo::v1::JobSpec& spec);

// Checks that every id the tokenizer can produce is a row of the model's embedding:
// tokenizer.vocab_size() <= config.vocab_size (a smaller tokenizer is normal: checkpoints pad
// the embedding, e.g. Qwen2.5's 151,936 rows for 151,665 tokens).
// Errors: kInvalidArgument naming spec.model.tokenizer_path and spec.model.path, both sizes and
// the fix.
absl::Status CheckTokenizerFitsModel(const model::BpeTokenizer& tokenizer,
                                     const model::LlamaConfig& config,
                                     const lspo::v1::JobSpec& spec);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_JOB_ASSETS_H_
