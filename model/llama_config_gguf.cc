// LlamaConfigFromGguf: a GGUF file's `llama.*` hyperparameters (docs/formats.md §3) as a
// LlamaConfig. Contracts: model/llama_config.h.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/gguf.h"
#include "model/llama_config.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

// Optional integer key: `fallback` when absent, the accessor's error when mistyped.
absl::StatusOr<int64_t> IntOr(const GgufFile& gguf, const std::string& key, int64_t fallback) {
  if (!gguf.HasKey(key)) return fallback;
  return gguf.GetInt(key);
}

absl::StatusOr<double> FloatOr(const GgufFile& gguf, const std::string& key, double fallback) {
  if (!gguf.HasKey(key)) return fallback;
  return gguf.GetFloat(key);
}

// The divisor of each RoPE inverse frequency under llama3 scaling `s` (llama_config.h
// RopeScaling; llama.cpp's rope_freqs.weight holds these): 1 for the high band, `factor` for
// the low band, 1 / ((1 - smooth) / factor + smooth) between. In double.
std::vector<double> Llama3Divisors(double theta, int64_t head_dim, const RopeScaling& s) {
  std::vector<double> out;
  const double lo = s.original_max_position_embeddings / s.low_freq_factor;
  const double hi = s.original_max_position_embeddings / s.high_freq_factor;
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const double inv = std::pow(theta, -2.0 * static_cast<double>(i) / head_dim);
    const double wavelen = 2.0 * M_PI / inv;
    if (wavelen < hi) {
      out.push_back(1.0);
    } else if (wavelen > lo) {
      out.push_back(s.factor);
    } else {
      const double smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
      out.push_back(1.0 / ((1.0 - smooth) / s.factor + smooth));
    }
  }
  return out;
}

// Reads rope_freqs.weight (llama.cpp's per-frequency divisors) as the llama3 scaling that gives
// them: factor = the largest divisor, low_freq_factor 1, high_freq_factor 2, 4 or 8 and
// original_max_position_embeddings a power of two in [16, 2^20] (Llama 3.1 / 3.2: 1, 4, 8192),
// each divisor within 1e-4 relative. kUnimplemented when no such setting matches (the factors
// are then not representable here) or the tensor is not (head_dim / 2) values.
absl::Status Llama3ScalingFromFactors(const GgufFile& gguf, LlamaConfig* c) {
  ASSIGN_OR_RETURN(std::vector<float> f, gguf.ReadTensorF32("rope_freqs.weight"));
  if (static_cast<int64_t>(f.size()) != c->head_dim / 2 || f.empty()) {
    return absl::UnimplementedError(
        absl::StrCat("GGUF rope_freqs.weight has ", f.size(),
                     " values; expected head_dim / 2 = ", c->head_dim / 2));
  }
  RopeScaling s;
  s.type = RopeScaling::Type::kLlama3;
  s.factor = *std::max_element(f.begin(), f.end());
  s.low_freq_factor = 1.0;
  for (double high : {4.0, 2.0, 8.0}) {
    s.high_freq_factor = high;
    for (int64_t orig = 16; orig <= (int64_t{1} << 20); orig *= 2) {
      s.original_max_position_embeddings = orig;
      const std::vector<double> want = Llama3Divisors(c->rope_theta, c->head_dim, s);
      bool match = true;
      for (size_t i = 0; i < f.size() && match; ++i) {
        match = std::fabs(f[i] - want[i]) <= 1e-4 * want[i];
      }
      if (match) {
        c->rope_scaling = s;
        return absl::OkStatus();
      }
    }
  }
  return absl::UnimplementedError(
      "the GGUF's rope_freqs.weight (per-frequency RoPE divisors) matches no llama3 scaling "
      "(low_freq_factor 1, high_freq_factor 2 / 4 / 8, a power-of-two original context); this "
      "reader cannot apply it: use the model's Hugging Face folder");
}

}  // namespace

absl::StatusOr<LlamaConfig> LlamaConfigFromGguf(const GgufFile& gguf) {
  ASSIGN_OR_RETURN(std::string arch, gguf.GetString("general.architecture"));
  if (arch != "llama") {
    return absl::UnimplementedError(absl::StrCat(
        "GGUF general.architecture is \"", arch,
        "\"; only \"llama\" is supported by LlamaConfigFromGguf (convert a Llama-family model)"));
  }
  LlamaConfig c;
  ASSIGN_OR_RETURN(c.max_position_embeddings, gguf.GetInt("llama.context_length"));
  ASSIGN_OR_RETURN(c.hidden_size, gguf.GetInt("llama.embedding_length"));
  ASSIGN_OR_RETURN(c.num_layers, gguf.GetInt("llama.block_count"));
  ASSIGN_OR_RETURN(c.intermediate_size, gguf.GetInt("llama.feed_forward_length"));
  ASSIGN_OR_RETURN(c.num_heads, gguf.GetInt("llama.attention.head_count"));
  ASSIGN_OR_RETURN(c.num_kv_heads, IntOr(gguf, "llama.attention.head_count_kv", c.num_heads));
  ASSIGN_OR_RETURN(c.rope_theta, FloatOr(gguf, "llama.rope.freq_base", 10000.0));
  ASSIGN_OR_RETURN(c.rms_norm_eps, gguf.GetFloat("llama.attention.layer_norm_rms_epsilon"));
  if (gguf.HasKey("llama.vocab_size")) {
    ASSIGN_OR_RETURN(c.vocab_size, gguf.GetInt("llama.vocab_size"));
  } else {
    const GgufValue* tokens = gguf.FindKey("tokenizer.ggml.tokens");
    if (tokens == nullptr) {
      return absl::NotFoundError(
          "GGUF has neither llama.vocab_size nor tokenizer.ggml.tokens; cannot tell the "
          "vocabulary size (re-convert the model with llama.cpp's convert_hf_to_gguf.py)");
    }
    c.vocab_size = static_cast<int64_t>(tokens->size());
  }
  const int64_t default_head_dim = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  ASSIGN_OR_RETURN(c.head_dim, IntOr(gguf, "llama.rope.dimension_count", default_head_dim));
  ASSIGN_OR_RETURN(c.bos_token_id, IntOr(gguf, "tokenizer.ggml.bos_token_id", 1));
  ASSIGN_OR_RETURN(c.eos_token_id, IntOr(gguf, "tokenizer.ggml.eos_token_id", 2));
  ASSIGN_OR_RETURN(c.pad_token_id, IntOr(gguf, "tokenizer.ggml.padding_token_id", c.eos_token_id));
  c.tie_word_embeddings = gguf.FindTensor("output.weight") == nullptr;
  // Optional attention biases (llama.cpp's llama architecture loads them when present).
  c.qkv_bias = gguf.FindTensor("blk.0.attn_q.bias") != nullptr;
  c.o_bias = gguf.FindTensor("blk.0.attn_output.bias") != nullptr;
  if (gguf.HasKey("llama.rope.scaling.type")) {
    ASSIGN_OR_RETURN(std::string type, gguf.GetString("llama.rope.scaling.type"));
    if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      ASSIGN_OR_RETURN(c.rope_scaling.factor, gguf.GetFloat("llama.rope.scaling.factor"));
    } else if (type != "none") {
      return absl::UnimplementedError(
          absl::StrCat("GGUF llama.rope.scaling.type is \"", type,
                       "\"; only none and linear are read (use the model's Hugging Face folder)"));
    }
  }
  if (gguf.FindTensor("rope_freqs.weight") != nullptr) {
    RETURN_IF_ERROR(Llama3ScalingFromFactors(gguf, &c));
  }
  absl::Status valid = c.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF llama hyperparameters are inconsistent: ", valid.message()));
  }
  return c;
}

}  // namespace lspo::model
