// Hyperparameters of a Llama-family decoder (SmolLM2, TinyLlama, Llama-2/3, Mistral without
// sliding window) and their two external spellings: GGUF metadata keys (read) and a
// Hugging Face `config.json` (written).
//
// Sources: docs/formats.md §3 (GGUF `llama.*` keys -> HF names), §5 (values of
// SmolLM2-135M-Instruct), §6 (config.json fields of a written checkpoint).
//
// Thread-safety: a plain value type.
#ifndef LSPO_MODEL_LLAMA_CONFIG_H_
#define LSPO_MODEL_LLAMA_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace lspo::model {

class GgufFile;

// Architecture hyperparameters. Field names follow HF `LlamaConfig`; units are element counts.
struct LlamaConfig {
  int64_t vocab_size = 0;               // V: rows of embed_tokens / lm_head.
  int64_t hidden_size = 0;              // H: model width.
  int64_t num_layers = 0;               // L: decoder blocks (HF num_hidden_layers).
  int64_t num_heads = 0;                // query heads (HF num_attention_heads).
  int64_t num_kv_heads = 0;             // key/value heads (GQA); divides num_heads.
  int64_t head_dim = 0;                 // hd: per-head width; num_heads * head_dim == H here.
  int64_t intermediate_size = 0;        // F: SwiGLU width.
  int64_t max_position_embeddings = 0;  // longest sequence the RoPE table is meant for.
  double rms_norm_eps = 1e-5;           // RMSNorm epsilon.
  double rope_theta = 10000.0;          // RoPE base θ: angle = pos · θ^(-2i/hd).
  bool tie_word_embeddings = true;      // lm_head.weight == embed_tokens.weight.
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 2;

  // Checks that every size is positive, num_heads % num_kv_heads == 0,
  // num_heads * head_dim == hidden_size (the layout this model code implements; HF allows
  // otherwise but no supported checkpoint uses it), head_dim even (RoPE pairs), eps > 0,
  // rope_theta > 0, and the special token ids lie in [0, vocab_size).
  // Returns kInvalidArgument naming the first offending field, its value and the requirement.
  absl::Status Validate() const;

  // Number of parameters (embedding counted once when tied). 134,515,008 for SmolLM2-135M.
  int64_t NumParameters() const;

  // HF `config.json` (docs/formats.md §6): architectures ["LlamaForCausalLM"], model_type "llama",
  // sizes, head_dim, hidden_act "silu", rms_norm_eps, rope_theta, rope_scaling null,
  // attention_bias/mlp_bias false, tie_word_embeddings, bos/eos/pad token ids,
  // `torch_dtype` as given (e.g. "float32", "bfloat16"), use_cache true,
  // attention_dropout 0, initializer_range 0.02, pretraining_tp 1.
  nlohmann::json ToHfConfigJson(absl::string_view torch_dtype) const;
};

// Reads the `llama.*` keys of a GGUF file (docs/formats.md §3): context_length,
// embedding_length, block_count, feed_forward_length, attention.head_count,
// attention.head_count_kv (defaults to head_count when absent), rope.freq_base (default
// 10000 when absent), attention.layer_norm_rms_epsilon, vocab_size (falls back to the length
// of tokenizer.ggml.tokens), rope.dimension_count (head_dim; defaults to H / heads),
// tokenizer.ggml.{bos,eos,padding}_token_id (defaults 1, 2, eos). tie_word_embeddings is true
// iff the file has no `output.weight` tensor.
// Errors: kUnimplemented when general.architecture is not "llama"; the accessor's code
// (kNotFound / kInvalidArgument) for a missing or mistyped required key; kInvalidArgument when
// the result fails Validate().
absl::StatusOr<LlamaConfig> LlamaConfigFromGguf(const GgufFile& gguf);

// A tiny config for unit tests: hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 16,
// ffn 128, 256 positions, eps 1e-5, θ 10000, tied embeddings; special ids 1, 2, 2 (clamped to
// vocab_size - 1 when the vocabulary is smaller).
LlamaConfig TinyLlamaConfig(int64_t vocab_size);

}  // namespace lspo::model

#endif  // LSPO_MODEL_LLAMA_CONFIG_H_
