// `lspctl export --format=gguf`: a Hugging Face model folder (a job's output_dir, or any folder
// of a supported family) written as one GGUF file that llama.cpp / Ollama load, and that this
// product's own reader (model/gguf.h, LlamaModel::FromGguf, BpeTokenizer::FromGguf) loads back.
//
// What is written (the layout of llama.cpp's convert_hf_to_gguf.py for its LlamaModel, with
// the key and tensor names of docs/formats.md §3-§4; gguf-py constants.py):
//   general.architecture "llama", general.type "model", general.name (the folder's name),
//   general.file_type (llama_ftype: 0 all F32, 1 mostly F16, 7 mostly Q8_0, 32 mostly BF16),
//   general.quantization_version 2;
//   llama.context_length, embedding_length, block_count, feed_forward_length,
//   rope.dimension_count (head_dim), attention.head_count, attention.head_count_kv,
//   rope.freq_base, attention.layer_norm_rms_epsilon, vocab_size, attention.key_length and
//   value_length (when head_dim != hidden / heads), rope.scaling.type "linear" and
//   rope.scaling.factor (linear RoPE scaling);
//   tokenizer.ggml.model "gpt2", tokenizer.ggml.pre (see below), tokens, token_type (3 control
//   for special added tokens, 4 user-defined for other added tokens, 1 normal, 5 unused for
//   the "[PAD<i>]" rows a vocabulary larger than the tokenizer gets), merges ("A B"),
//   bos/eos/unknown/padding_token_id (those the tokenizer has), add_bos_token, add_eos_token,
//   tokenizer.chat_template (when the tokenizer has one);
//   tensors token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
//   ffn_gate, ffn_up, ffn_down}.weight (+ attn_q/k/v/output.bias when the model has biases),
//   output_norm, output (absent when the embeddings are tied), and rope_freqs.weight (per
//   frequency divisors, llama3 RoPE scaling only, as llama.cpp's converter writes them). q and
//   k rows (weights and biases) are permuted into llama.cpp's adjacent-pair RoPE order
//   (model/hf_names.h PermuteQkRows). One-dimensional tensors (norms, biases, rope_freqs) are
//   F32; matrices take the chosen type, except that a Q8_0 matrix whose rows are not a whole
//   number of 32-element blocks is written F16 (as llama.cpp falls back), which a note says.
// Families: LlamaForCausalLM and MistralForCausalLM (llama.cpp's "llama" architecture; a
// Mistral sliding window is not representable there and gets a note). Tokenizers: byte-level
// BPE tokenizer.json files whose pre-tokenizer llama.cpp knows by name: "smollm" (Digits
// individual + ByteLevel, SmolLM2), "gpt2" (ByteLevel alone), "llama-bpe" (the Llama 3 split
// regex), "qwen2" (the Qwen2 split regex).
//
// Thread-safety: stateless functions.
#ifndef LSPO_OFFLOAD_GGUF_EXPORT_H_
#define LSPO_OFFLOAD_GGUF_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/dequant.h"

namespace lspo::offload {

// The element type of the exported matrices (llama.cpp's --outtype names).
enum class GgufOutType { kAuto, kF32, kF16, kBF16, kQ8_0 };

// "auto", "f32", "f16", "bf16", "q8_0" (case-insensitive) -> the type.
// Errors: kInvalidArgument naming the value and the accepted names.
absl::StatusOr<GgufOutType> ParseGgufOutType(absl::string_view name);

struct GgufExportResult {
  std::string path;                                     // the file written
  model::GgmlType matrix_type = model::GgmlType::kF16;  // what kAuto resolved to, or the choice
  int64_t num_tensors = 0;
  uint64_t file_bytes = 0;
  std::string tokenizer_pre;       // the tokenizer.ggml.pre written
  std::vector<std::string> notes;  // what the file cannot say exactly (one line each)
};

// Writes the HF model folder `model_dir` as the GGUF file `out_path` (see the file comment).
// kAuto = BF16 when config.json's torch_dtype (or dtype) is "bfloat16", else F16 (llama.cpp's
// default). An empty `out_path` means llama.cpp's default name, <folder name>-<TYPE>.gguf (e.g.
// smol-Q8_0.gguf), in the current folder. The file is written as PATH.partial and renamed when
// complete; an existing file is refused, never overwritten.
// Errors: kAlreadyExists when out_path exists; kInvalidArgument when model_dir is not an HF model
// folder or out_path's folder is missing; the folder's config and tensor errors
// (LlamaConfigFromHfJson, HfCheckpoint; kUnimplemented for a tensor dtype other than F32 / BF16
// / F16); kUnimplemented, naming the family or the tokenizer part and what is supported, for
// a Qwen2 or Qwen3 model (llama.cpp's "qwen2" / "qwen3" architectures are not written yet), a
// tokenizer that is not
// byte-level BPE (SentencePiece-style Metaspace / byte_fallback, e.g. Llama 2's and Mistral's)
// or whose pre-tokenizer has no llama.cpp name here; kDataLoss for a malformed
// tokenizer.json; GgufWriter::WriteFile's write errors.
absl::StatusOr<GgufExportResult> ExportGguf(const std::string& model_dir,
                                            const std::string& out_path, GgufOutType type);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_GGUF_EXPORT_H_
