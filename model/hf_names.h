// Hugging Face Llama tensor names <-> GGUF (llama.cpp) tensor names, and loading a GGUF tensor
// in the Hugging Face layout (torch-free).
//
// Source: docs/formats.md §3 (llama.cpp convert_hf_to_gguf.py, transformers
// integrations/ggml.py + modeling_gguf_pytorch_utils.py). Mapping (L = "model.layers.N."):
//   model.embed_tokens.weight             <-> token_embd.weight
//   L input_layernorm.weight              <-> blk.N.attn_norm.weight
//   L post_attention_layernorm.weight     <-> blk.N.ffn_norm.weight
//   L self_attn.{q,k,v,o}_proj.weight     <-> blk.N.attn_{q,k,v,output}.weight
//   L mlp.{gate,up,down}_proj.weight      <-> blk.N.ffn_{gate,up,down}.weight
//   model.norm.weight                     <-> output_norm.weight
//   lm_head.weight                        <-> output.weight (absent when embeddings are tied)
// The same names with ".bias" instead of ".weight" map alike.
//
// Q/K permutation: llama.cpp's converter reorders the rows of q_proj (per query head) and
// k_proj (per kv head) so that its "adjacent pairs" RoPE works. With head dim hd and
// half = hd / 2, for head h, i < half, j in {0, 1}:
//     GGUF row h*hd + 2*i + j  ==  HF row h*hd + half*j + i        (whole rows of `cols`)
// LoadHfTensor undoes this so the result matches the HF checkpoint (rotate_half RoPE).
//
// Thread-safety: pure functions (LoadHfTensor only reads the immutable GgufFile).
#ifndef LSPO_MODEL_HF_NAMES_H_
#define LSPO_MODEL_HF_NAMES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/gguf.h"

namespace lspo::model {

// HF name -> GGUF name, e.g. "model.layers.3.self_attn.k_proj.weight" -> "blk.3.attn_k.weight".
// kInvalidArgument if `hf_name` is not a Llama tensor name from the table above.
absl::StatusOr<std::string> HfToGgufName(absl::string_view hf_name);

// GGUF name -> HF name (inverse of HfToGgufName). kInvalidArgument for other names.
absl::StatusOr<std::string> GgufToHfName(absl::string_view gguf_name);

// HF state-dict names of a tied-embedding Llama with `n_layers` blocks, in transformers'
// state_dict order: model.embed_tokens.weight; per layer q,k,v,o_proj, gate,up,down_proj,
// input_layernorm, post_attention_layernorm; model.norm.weight (2 + 9 * n_layers names).
// lm_head.weight is not listed (add it when the GGUF has output.weight). Empty if n_layers < 0.
std::vector<std::string> LlamaHfTensorNames(int64_t n_layers);

// Un-permutes the rows of a GGUF-ordered Q or K weight/bias in place of `dst`:
//   src (rows, cols) f32 row-major in GGUF row order, rows = n_heads * hd
//   dst (rows, cols) f32 row-major in HF row order; dst[h*hd + half*j + i] = src[h*hd + 2i + j].
// kInvalidArgument if n_heads <= 0, rows % n_heads != 0, hd is odd, cols < 0, or the
// vector sizes are not rows * cols.
absl::Status UnpermuteQkRows(const std::vector<float>& src, int64_t rows, int64_t cols,
                             int64_t n_heads, std::vector<float>* dst);

// Inverse of UnpermuteQkRows (HF row order -> GGUF row order), e.g. to write a GGUF.
absl::Status PermuteQkRows(const std::vector<float>& src, int64_t rows, int64_t cols,
                           int64_t n_heads, std::vector<float>* dst);

// Loads tensor `hf_name` from `f` dequantised to f32 in the HF layout: shape is the torch
// shape (e.g. q_proj [n_head*hd, hidden]) written to *torch_shape (may be null); q_proj rows
// are un-permuted by `n_head`, k_proj rows by `n_head_kv` (weights and biases); all other
// tensors are returned as stored.
// Errors: kInvalidArgument for an unknown HF name, or for head counts that do not divide the
// q/k rows into even-sized heads; kNotFound if the file lacks the tensor (notably
// lm_head.weight of a tied-embedding model: use model.embed_tokens.weight);
// kUnimplemented for types that cannot be dequantised.
absl::StatusOr<std::vector<float>> LoadHfTensor(const GgufFile& f, const std::string& hf_name,
                                                int64_t n_head, int64_t n_head_kv,
                                                std::vector<int64_t>* torch_shape);

}  // namespace lspo::model

#endif  // LSPO_MODEL_HF_NAMES_H_
