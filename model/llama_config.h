// Hyperparameters of a Llama-family decoder and their two external spellings: GGUF metadata
// keys (read) and a Hugging Face `config.json` (read and written).
//
// Families (HF `architectures[0]` / `model_type`), all the same pre-norm SwiGLU decoder with
// GQA and RoPE, differing only in:
//   LlamaForCausalLM / llama     (SmolLM2, TinyLlama, Llama 2, Llama 3.x): optional
//                                `attention_bias` (q, k, v and o biases), `rope_scaling` of
//                                type llama3 or linear, explicit `head_dim`.
//   Qwen2ForCausalLM / qwen2     (Qwen2, Qwen2.5): q, k and v biases always, no o bias; sliding
//                                window only when `use_sliding_window` (refused).
//   MistralForCausalLM / mistral (Mistral 7B): `sliding_window` (null = full causal attention).
//   Qwen3ForCausalLM / qwen3     (Qwen3 dense: 0.6B ... 32B): an RMSNorm over each head's
//                                query and key (q_norm, k_norm: (head_dim) weights, the
//                                config's eps) before RoPE; explicit `head_dim` (128 when
//                                absent, transformers' default); optional `attention_bias`;
//                                sliding window only when `use_sliding_window` (refused).
//   Gemma3ForCausalLM / gemma3_text (Gemma 3 text models: 270M, 1B, and the language model of
//                                the larger ones): RMSNorm as x̂ · (1 + w) with the product in
//                                fp32; "sandwich" norms (post_attention_layernorm on the
//                                attention output, pre_ / post_feedforward_layernorm around the
//                                MLP); q_norm / k_norm; GeGLU (gelu tanh); embeddings scaled by
//                                sqrt(hidden); attention scaled by query_pre_attn_scalar^-1/2;
//                                `layer_types` mixing sliding-window layers (RoPE base
//                                rope_local_base_freq, no scaling) and full layers (rope_theta
//                                and its scaling). Logit soft-capping (Gemma 2) is refused.
// Anything else (Gemma 1/2, Phi, MoE, ...) is refused by LlamaConfigFromHfJson.
//
// Sources: docs/formats.md §3 (GGUF `llama.*` keys -> HF names), §5 (values of
// SmolLM2-135M-Instruct), §6 (config.json fields of a written checkpoint), §7 (HF folders);
// transformers' configuration_{llama,qwen2,mistral,qwen3}.py for the field names and defaults
// (modeling_qwen3.py Qwen3Attention for q_norm / k_norm) and
// modeling_rope_utils.py for the llama3 / linear RoPE frequency rules.
//
// Thread-safety: a plain value type.
#ifndef LSPO_MODEL_LLAMA_CONFIG_H_
#define LSPO_MODEL_LLAMA_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace lspo::model {

class GgufFile;

// Which HF architecture a config describes (see the file comment).
enum class ModelFamily { kLlama, kQwen2, kMistral, kQwen3, kGemma3 };

// The MLP's gate activation: SwiGLU (silu) or GeGLU with the tanh approximation of GELU
// (transformers "gelu_pytorch_tanh": 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))).
enum class Activation { kSilu, kGeluTanh };

// HF `architectures[0]` of a family: "LlamaForCausalLM", "Qwen2ForCausalLM", ...
const char* HfArchitecture(ModelFamily family);
// HF `model_type` of a family: "llama", "qwen2", "mistral", "qwen3", "gemma3_text".
const char* HfModelType(ModelFamily family);

// RoPE frequency scaling (HF `rope_scaling` / `rope_parameters`). With inv_freq_i =
// θ^(-2i/hd):
//   kNone:   inv_freq unchanged.
//   kLinear: inv_freq_i / factor (positions interpolated by `factor`).
//   kLlama3: (transformers modeling_rope_utils._compute_llama3_parameters) with
//            wavelen_i = 2π / inv_freq_i, lo = original_max_position_embeddings /
//            low_freq_factor, hi = original_max_position_embeddings / high_freq_factor:
//              wavelen_i > lo            -> inv_freq_i / factor
//              wavelen_i < hi            -> inv_freq_i
//              otherwise (medium band)   -> (1 - s) inv_freq_i / factor + s inv_freq_i,
//                 s = (original_max_position_embeddings / wavelen_i - low_freq_factor)
//                     / (high_freq_factor - low_freq_factor).
//   The attention scaling factor of both types is 1.
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                  // llama3 only
  double high_freq_factor = 4.0;                 // llama3 only
  int64_t original_max_position_embeddings = 0;  // llama3 only (tokens)
};

// Architecture hyperparameters. Field names follow HF `LlamaConfig`; units are element counts.
// The most positions a config may declare (2^27, 134M: beyond every published context).
inline constexpr int64_t kMaxPositions = int64_t{1} << 27;

struct LlamaConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 0;               // V: rows of embed_tokens / lm_head.
  int64_t hidden_size = 0;              // H: model width.
  int64_t num_layers = 0;               // L: decoder blocks (HF num_hidden_layers).
  int64_t num_heads = 0;                // query heads (HF num_attention_heads).
  int64_t num_kv_heads = 0;             // key/value heads (GQA); divides num_heads.
  int64_t head_dim = 0;                 // hd: per-head width (num_heads * hd may differ from H).
  int64_t intermediate_size = 0;        // F: SwiGLU width.
  int64_t max_position_embeddings = 0;  // longest sequence the RoPE table is meant for.
  double rms_norm_eps = 1e-5;           // RMSNorm epsilon.
  double rope_theta = 10000.0;          // RoPE base θ: angle = pos · θ^(-2i/hd).
  RopeScaling rope_scaling;             // kNone unless the config.json asks for one.
  bool tie_word_embeddings = true;      // lm_head.weight == embed_tokens.weight.
  // q_proj/k_proj/v_proj carry a bias (Qwen2 always; Llama with attention_bias).
  bool qkv_bias = false;
  // o_proj carries a bias (Llama and Qwen3 with attention_bias).
  bool o_bias = false;
  // Per-head RMSNorm of queries and keys before RoPE (Qwen3): q_norm, k_norm (head_dim) per
  // layer.
  bool qk_norm = false;
  // Gemma 3 (each false / neutral for the other families):
  Activation hidden_act = Activation::kSilu;
  // RMSNorm weights are offsets: y = x̂ · (1 + w), x̂ and the product in fp32.
  bool norm_weight_offset = false;
  // post_attention_layernorm normalises the attention output, and pre_feedforward_layernorm /
  // post_feedforward_layernorm sit before / after the MLP (h += N_post(attn(N_in(h)));
  // h += N_post_ff(mlp(N_pre_ff(h)))).
  bool sandwich_norms = false;
  // Embedding rows are multiplied by this (Gemma: sqrt(hidden_size)); 1 = none.
  double embed_scale = 1.0;
  // Attention scores are scaled by attn_scalar^-1/2; 0 = head_dim (every other family).
  double attn_scalar = 0.0;
  // Per layer: 1 = a sliding-window layer (window sliding_window, RoPE base rope_local_theta
  // without scaling), 0 = full attention (rope_theta with rope_scaling). Empty = every layer
  // uses sliding_window and rope_theta (Mistral's uniform window, or none).
  std::vector<uint8_t> sliding_layers;
  double rope_local_theta = 10000.0;  // RoPE base of the sliding layers (Gemma 3)
  // Sliding-window attention (Mistral): token t attends to positions in (t - W, t]. 0 = full
  // causal attention (also when W >= the sequence length, where the two are the same).
  int64_t sliding_window = 0;
  // Special token ids; -1 = none (HF null). eos_token_ids lists every id that ends generation
  // (HF eos_token_id may be a list, e.g. Llama 3.1 Instruct); eos_token_id is its first entry.
  int64_t bos_token_id = 1;
  int64_t eos_token_id = 2;
  int64_t pad_token_id = 2;
  std::vector<int64_t> eos_token_ids;  // empty = {eos_token_id}

  // Checks that every size is positive and below a sanity bound far above any published
  // model (vocab_size <= 2^22, hidden_size <= 2^17, intermediate_size <= 2^20, num_layers,
  // num_heads, head_dim <= 4096, max_position_embeddings <= kMaxPositions), num_heads %
  // num_kv_heads == 0, head_dim even (RoPE pairs), eps > 0, rope_theta > 0, a rope scaling
  // factor >= 1 (llama3: high_freq_factor > low_freq_factor > 0 and
  // original_max_position_embeddings > 0), sliding_window >= 0, and the special token ids
  // are -1 or lie in [0, vocab_size).
  // Returns kInvalidArgument naming the first offending field, its value and the requirement.
  absl::Status Validate() const;

  // The sliding window of layer l (0 = full causal attention) and whether it uses the local
  // RoPE base (sliding_layers, else sliding_window for every layer).
  int64_t LayerWindow(int64_t layer) const {
    if (sliding_layers.empty()) return sliding_window;
    return sliding_layers[static_cast<size_t>(layer)] != 0 ? sliding_window : 0;
  }
  bool LayerUsesLocalRope(int64_t layer) const {
    return !sliding_layers.empty() && sliding_layers[static_cast<size_t>(layer)] != 0;
  }

  // Number of parameters (embedding counted once when tied; biases and q/k norms included).
  // 134,515,008 for SmolLM2-135M.
  int64_t NumParameters() const;

  // HF `config.json` (docs/formats.md §6) of this family: architectures, model_type, sizes,
  // head_dim, hidden_act "silu", rms_norm_eps, rope_theta and rope_scaling (null, or the
  // llama3 / linear object), attention_bias (llama, qwen3) / use_sliding_window false (qwen2,
  // qwen3) /
  // sliding_window (mistral, null when 0), mlp_bias false, tie_word_embeddings, bos/eos/pad
  // token ids (null when -1; eos a list when several), `torch_dtype` as given (e.g. "float32",
  // "bfloat16"), use_cache true, attention_dropout 0, initializer_range 0.02, pretraining_tp 1.
  // LlamaConfigFromHfJson(ToHfConfigJson(...)) returns this config.
  nlohmann::json ToHfConfigJson(absl::string_view torch_dtype) const;

  // HF `generation_config.json` with the special ids only (bos_token_id, eos_token_id as a
  // list when several, pad_token_id; -1 ids omitted), as transformers derives it from a
  // config ("_from_model_config": true). Greedy decoding is the default it implies.
  nlohmann::json ToHfGenerationConfigJson() const;
};

// Reads an HF `config.json` (already parsed; `source` names the file in messages) of a
// supported family. Accepts both spellings of RoPE settings: `rope_theta` + `rope_scaling`
// (transformers <= 4.x, and the published checkpoints) and `rope_parameters` (transformers
// 5.x). Defaults for absent fields are those of the family's transformers config class
// (num_key_value_heads = num_attention_heads, head_dim = hidden_size / num_attention_heads
// (Qwen3: 128),
// rms_norm_eps 1e-6, rope_theta 10000, tie_word_embeddings false, attention_bias false).
// Errors:
//   kUnimplemented: an architecture other than the four (message names it and lists the
//     supported ones), hidden_act other than silu, mlp_bias true, a rope type other than
//     default / linear / llama3, Qwen2 / Qwen3 use_sliding_window true, or a `layer_types` entry
//     other
//     than full_attention (sliding_attention is accepted only for Mistral's uniform window);
//   kInvalidArgument: a missing or mistyped required field (vocab_size, hidden_size,
//     intermediate_size, num_hidden_layers, num_attention_heads), or a config that fails
//     Validate(); each message names `source` and the field.
absl::StatusOr<LlamaConfig> LlamaConfigFromHfJson(const nlohmann::json& config,
                                                  absl::string_view source);

// Reads the `llama.*` keys of a GGUF file (docs/formats.md §3): context_length,
// embedding_length, block_count, feed_forward_length, attention.head_count,
// attention.head_count_kv (defaults to head_count when absent), rope.freq_base (default
// 10000 when absent), attention.layer_norm_rms_epsilon, vocab_size (falls back to the length
// of tokenizer.ggml.tokens), rope.dimension_count (head_dim; defaults to H / heads),
// tokenizer.ggml.{bos,eos,padding}_token_id (defaults 1, 2, eos), rope.scaling.type "none" or
// "linear" with rope.scaling.factor. tie_word_embeddings is true iff the file has no
// `output.weight` tensor; qkv_bias / o_bias iff blk.0.attn_q.bias / blk.0.attn_output.bias exist.
// rope_freqs.weight (llama.cpp's per-frequency divisors of Llama 3.1+) is read back as the llama3
// scaling that gives them (factor = the largest, low_freq_factor 1, high_freq_factor 2 / 4 / 8,
// a power-of-two original context; 1e-4 relative).
// Errors: kUnimplemented when general.architecture is not "llama", for another
// rope.scaling.type, or rope_freqs.weight that no such llama3 setting gives (refused rather than
// silently ignored); the accessor's code
// (kNotFound / kInvalidArgument) for a missing or mistyped required key; kInvalidArgument when
// the result fails Validate().
absl::StatusOr<LlamaConfig> LlamaConfigFromGguf(const GgufFile& gguf);

// A tiny config for unit tests: hidden 64, 2 layers, 4 heads, 2 kv heads, head_dim 16,
// ffn 128, 256 positions, eps 1e-5, θ 10000, tied embeddings; special ids 1, 2, 2 (clamped to
// vocab_size - 1 when the vocabulary is smaller).
LlamaConfig TinyLlamaConfig(int64_t vocab_size);

}  // namespace lspo::model

#endif  // LSPO_MODEL_LLAMA_CONFIG_H_
