#include "model/llama_config.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "model/gguf.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

absl::Status Positive(const char* field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("LlamaConfig.", field, " is ", value,
                                                 "; expected a positive value"));
}

absl::Status TokenId(const char* field, int64_t value, int64_t vocab_size) {
  if (value >= 0 && value < vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("LlamaConfig.", field, " is ", value,
                                                 "; expected a token id in [0, vocab_size = ",
                                                 vocab_size, ")"));
}

// Optional integer key: `fallback` when absent, the accessor's error when mistyped.
absl::StatusOr<int64_t> IntOr(const GgufFile& gguf, const std::string& key, int64_t fallback) {
  if (!gguf.HasKey(key)) return fallback;
  return gguf.GetInt(key);
}

absl::StatusOr<double> FloatOr(const GgufFile& gguf, const std::string& key, double fallback) {
  if (!gguf.HasKey(key)) return fallback;
  return gguf.GetFloat(key);
}

}  // namespace

absl::Status LlamaConfig::Validate() const {
  RETURN_IF_ERROR(Positive("vocab_size", vocab_size));
  RETURN_IF_ERROR(Positive("hidden_size", hidden_size));
  RETURN_IF_ERROR(Positive("num_layers", num_layers));
  RETURN_IF_ERROR(Positive("num_heads", num_heads));
  RETURN_IF_ERROR(Positive("num_kv_heads", num_kv_heads));
  RETURN_IF_ERROR(Positive("head_dim", head_dim));
  RETURN_IF_ERROR(Positive("intermediate_size", intermediate_size));
  RETURN_IF_ERROR(Positive("max_position_embeddings", max_position_embeddings));
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.num_heads (", num_heads, ") is not a multiple of num_kv_heads (",
                     num_kv_heads, "); GQA needs num_heads % num_kv_heads == 0"));
  }
  if (num_heads * head_dim != hidden_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaConfig: num_heads * head_dim = ", num_heads, " * ", head_dim, " = ",
        num_heads * head_dim, " but hidden_size = ", hidden_size,
        "; this implementation needs num_heads * head_dim == hidden_size"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("LlamaConfig.head_dim is ", head_dim,
                                                   "; RoPE needs an even head_dim"));
  }
  if (!(rms_norm_eps > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.rms_norm_eps is ", rms_norm_eps, "; expected > 0"));
  }
  if (!(rope_theta > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.rope_theta is ", rope_theta, "; expected > 0"));
  }
  RETURN_IF_ERROR(TokenId("bos_token_id", bos_token_id, vocab_size));
  RETURN_IF_ERROR(TokenId("eos_token_id", eos_token_id, vocab_size));
  RETURN_IF_ERROR(TokenId("pad_token_id", pad_token_id, vocab_size));
  return absl::OkStatus();
}

int64_t LlamaConfig::NumParameters() const {
  const int64_t kv = num_kv_heads * head_dim;
  const int64_t attn = hidden_size * (num_heads * head_dim) * 2 + hidden_size * kv * 2;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  const int64_t per_layer = attn + mlp + 2 * hidden_size;
  int64_t total = vocab_size * hidden_size + num_layers * per_layer + hidden_size;
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

nlohmann::json LlamaConfig::ToHfConfigJson(absl::string_view torch_dtype) const {
  nlohmann::json j;
  j["architectures"] = nlohmann::json::array({"LlamaForCausalLM"});
  j["model_type"] = "llama";
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  j["rope_scaling"] = nullptr;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["initializer_range"] = 0.02;
  j["pretraining_tp"] = 1;
  j["use_cache"] = true;
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["bos_token_id"] = bos_token_id;
  j["eos_token_id"] = eos_token_id;
  j["pad_token_id"] = pad_token_id;
  j["torch_dtype"] = std::string(torch_dtype);
  return j;
}

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
  absl::Status valid = c.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF llama hyperparameters are inconsistent: ", valid.message()));
  }
  return c;
}

LlamaConfig TinyLlamaConfig(int64_t vocab_size) {
  LlamaConfig c;
  c.vocab_size = vocab_size;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 128;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = true;
  const int64_t last = std::max<int64_t>(vocab_size - 1, 0);
  c.bos_token_id = std::min<int64_t>(1, last);
  c.eos_token_id = std::min<int64_t>(2, last);
  c.pad_token_id = std::min<int64_t>(2, last);
  return c;
}

}  // namespace lspo::model
