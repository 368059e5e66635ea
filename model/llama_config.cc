#include "model/llama_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "model/gguf.h"
#include "runtime/json_text.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

absl::Status Positive(const char* field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("LlamaConfig.", field, " is ", value, "; expected a positive value"));
}

// Upper bounds of a sane Llama-family config, far above any published model (Llama 3.1 405B:
// hidden 16384, intermediate 53248, 126 layers, 128 heads, vocabulary 128256; Gemma's
// vocabulary 256000), so that a hostile or corrupt config is refused before any size computed
// from it can overflow or reserve memory.
absl::Status AtMost(const char* field, int64_t value, int64_t limit) {
  if (value <= limit) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "LlamaConfig.", field, " is ", value, "; at most ", limit,
      " is accepted (no Llama-family model comes near it: a corrupt or hostile config?)"));
}

absl::Status TokenId(const char* field, int64_t value, int64_t vocab_size) {
  if (value == -1 || (value >= 0 && value < vocab_size)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("LlamaConfig.", field, " is ", value,
                                                 "; expected -1 (none) or a token id in "
                                                 "[0, vocab_size = ",
                                                 vocab_size, ")"));
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
  RETURN_IF_ERROR(AtMost("vocab_size", vocab_size, int64_t{1} << 22));
  RETURN_IF_ERROR(AtMost("hidden_size", hidden_size, int64_t{1} << 17));
  RETURN_IF_ERROR(AtMost("num_layers", num_layers, 4096));
  RETURN_IF_ERROR(AtMost("num_heads", num_heads, 4096));
  RETURN_IF_ERROR(AtMost("head_dim", head_dim, 4096));
  RETURN_IF_ERROR(AtMost("intermediate_size", intermediate_size, int64_t{1} << 20));
  RETURN_IF_ERROR(AtMost("max_position_embeddings", max_position_embeddings, kMaxPositions));
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.num_heads (", num_heads, ") is not a multiple of num_kv_heads (",
                     num_kv_heads, "); GQA needs num_heads % num_kv_heads == 0"));
  }
  if (head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.head_dim is ", head_dim, "; RoPE needs an even head_dim"));
  }
  if (!(rms_norm_eps > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.rms_norm_eps is ", rms_norm_eps, "; expected > 0"));
  }
  if (!(rope_theta > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.rope_theta is ", rope_theta, "; expected > 0"));
  }
  if (rope_scaling.type != RopeScaling::Type::kNone && !(rope_scaling.factor >= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("LlamaConfig.rope_scaling.factor is ",
                                                   rope_scaling.factor, "; expected >= 1"));
  }
  if (rope_scaling.type == RopeScaling::Type::kLlama3 &&
      !(rope_scaling.low_freq_factor > 0.0 &&
        rope_scaling.high_freq_factor > rope_scaling.low_freq_factor &&
        rope_scaling.original_max_position_embeddings > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaConfig.rope_scaling (llama3) has low_freq_factor ", rope_scaling.low_freq_factor,
        ", high_freq_factor ", rope_scaling.high_freq_factor, ", original_max_position_embeddings ",
        rope_scaling.original_max_position_embeddings,
        "; expected high_freq_factor > low_freq_factor > 0 and a positive context length"));
  }
  if (!sliding_layers.empty() && static_cast<int64_t>(sliding_layers.size()) != num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("LlamaConfig.sliding_layers has ",
                                                   sliding_layers.size(), " entries for ",
                                                   num_layers, " layers; expected one per layer"));
  }
  if (!(embed_scale > 0.0) || !(attn_scalar >= 0.0) || !(rope_local_theta > 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.embed_scale (", embed_scale, "), attn_scalar (", attn_scalar,
                     ") and rope_local_theta (", rope_local_theta, ") must be > 0, >= 0 and > 0"));
  }
  if (sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LlamaConfig.sliding_window is ", sliding_window, "; expected >= 0"));
  }
  RETURN_IF_ERROR(TokenId("bos_token_id", bos_token_id, vocab_size));
  RETURN_IF_ERROR(TokenId("eos_token_id", eos_token_id, vocab_size));
  RETURN_IF_ERROR(TokenId("pad_token_id", pad_token_id, vocab_size));
  for (int64_t id : eos_token_ids) RETURN_IF_ERROR(TokenId("eos_token_ids", id, vocab_size));
  return absl::OkStatus();
}

const char* HfArchitecture(ModelFamily family) {
  switch (family) {
    case ModelFamily::kQwen2:
      return "Qwen2ForCausalLM";
    case ModelFamily::kMistral:
      return "MistralForCausalLM";
    case ModelFamily::kQwen3:
      return "Qwen3ForCausalLM";
    case ModelFamily::kGemma3:
      return "Gemma3ForCausalLM";
    case ModelFamily::kLlama:
      break;
  }
  return "LlamaForCausalLM";
}

const char* HfModelType(ModelFamily family) {
  switch (family) {
    case ModelFamily::kQwen2:
      return "qwen2";
    case ModelFamily::kMistral:
      return "mistral";
    case ModelFamily::kQwen3:
      return "qwen3";
    case ModelFamily::kGemma3:
      return "gemma3_text";
    case ModelFamily::kLlama:
      break;
  }
  return "llama";
}

int64_t LlamaConfig::NumParameters() const {
  const int64_t kv = num_kv_heads * head_dim;
  const int64_t attn = hidden_size * (num_heads * head_dim) * 2 + hidden_size * kv * 2;
  const int64_t mlp = 3 * hidden_size * intermediate_size;
  const int64_t biases =
      (qkv_bias ? num_heads * head_dim + 2 * kv : 0) + (o_bias ? hidden_size : 0);
  const int64_t norms = (sandwich_norms ? 4 : 2) * hidden_size + (qk_norm ? 2 * head_dim : 0);
  const int64_t per_layer = attn + mlp + norms + biases;
  int64_t total = vocab_size * hidden_size + num_layers * per_layer + hidden_size;
  if (!tie_word_embeddings) total += vocab_size * hidden_size;
  return total;
}

nlohmann::json LlamaConfig::ToHfConfigJson(absl::string_view torch_dtype) const {
  nlohmann::json j;
  j["architectures"] = nlohmann::json::array({HfArchitecture(family)});
  j["model_type"] = HfModelType(family);
  j["vocab_size"] = vocab_size;
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_layers;
  j["num_attention_heads"] = num_heads;
  j["num_key_value_heads"] = num_kv_heads;
  j["head_dim"] = head_dim;
  j["max_position_embeddings"] = max_position_embeddings;
  j["hidden_act"] = hidden_act == Activation::kGeluTanh ? "gelu_pytorch_tanh" : "silu";
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  if (family == ModelFamily::kGemma3) {
    // transformers 4.x spelling (the published checkpoints'), which 5.x reads as well.
    j["hidden_activation"] = j["hidden_act"];
    j["rope_local_base_freq"] = rope_local_theta;
    j["query_pre_attn_scalar"] = attn_scalar;
    j["sliding_window"] = sliding_window > 0 ? nlohmann::json(sliding_window) : nlohmann::json();
    nlohmann::json types = nlohmann::json::array();
    for (int64_t l = 0; l < num_layers; ++l) {
      types.push_back(LayerUsesLocalRope(l) ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = types;
    j["final_logit_softcapping"] = nullptr;
    j["attn_logit_softcapping"] = nullptr;
    j["attention_bias"] = qkv_bias;
  }
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", rope_scaling.factor}};
      break;
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", rope_scaling.factor},
          {"low_freq_factor", rope_scaling.low_freq_factor},
          {"high_freq_factor", rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
      break;
  }
  if (family == ModelFamily::kLlama || family == ModelFamily::kQwen3) {
    j["attention_bias"] = qkv_bias;
  }
  if (family == ModelFamily::kQwen2 || family == ModelFamily::kQwen3) {
    j["use_sliding_window"] = false;
  }
  if (family == ModelFamily::kMistral) {
    j["sliding_window"] = sliding_window > 0 ? nlohmann::json(sliding_window) : nlohmann::json();
  }
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["initializer_range"] = 0.02;
  j["pretraining_tp"] = 1;
  j["use_cache"] = true;
  j["tie_word_embeddings"] = tie_word_embeddings;
  auto id_or_null = [](int64_t id) { return id >= 0 ? nlohmann::json(id) : nlohmann::json(); };
  j["bos_token_id"] = id_or_null(bos_token_id);
  j["eos_token_id"] =
      eos_token_ids.size() > 1 ? nlohmann::json(eos_token_ids) : id_or_null(eos_token_id);
  j["pad_token_id"] = id_or_null(pad_token_id);
  j["torch_dtype"] = std::string(torch_dtype);
  return j;
}

nlohmann::json LlamaConfig::ToHfGenerationConfigJson() const {
  nlohmann::json j;
  j["_from_model_config"] = true;
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_ids.size() > 1) {
    j["eos_token_id"] = eos_token_ids;
  } else if (eos_token_id >= 0) {
    j["eos_token_id"] = eos_token_id;
  }
  if (pad_token_id >= 0) j["pad_token_id"] = pad_token_id;
  return j;
}

namespace {

// Reads fields of one config.json; every error names the file and the field.
class HfConfigReader {
 public:
  HfConfigReader(const nlohmann::json& j, absl::string_view source) : j_(j), source_(source) {}

  bool Has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  absl::StatusOr<int64_t> Int(const char* key) const {
    if (!Has(key)) {
      return absl::InvalidArgumentError(absl::StrCat(source_, ": required field \"", key,
                                                     "\" is missing; the file is not a "
                                                     "complete transformers config.json"));
    }
    return IntValue(j_[key], key);
  }
  absl::StatusOr<int64_t> IntOr(const char* key, int64_t fallback) const {
    if (!Has(key)) return fallback;
    return IntValue(j_[key], key);
  }
  absl::StatusOr<double> NumberOr(const nlohmann::json& obj, const char* key,
                                  double fallback) const {
    if (!obj.contains(key) || obj[key].is_null()) return fallback;
    if (!obj[key].is_number()) return Mistyped(key, obj[key], "a number");
    return obj[key].get<double>();
  }
  absl::StatusOr<bool> BoolOr(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!j_[key].is_boolean()) return Mistyped(key, j_[key], "true or false");
    return j_[key].get<bool>();
  }
  absl::StatusOr<std::string> StringOr(const char* key, std::string fallback) const {
    if (!Has(key)) return fallback;
    if (!j_[key].is_string()) return Mistyped(key, j_[key], "a string");
    return j_[key].get<std::string>();
  }
  // A token id field: -1 when absent or null; a list keeps every entry in `all` (if given).
  absl::Status TokenIds(const char* key, int64_t fallback, int64_t* first,
                        std::vector<int64_t>* all) const {
    *first = fallback;
    if (!Has(key)) return absl::OkStatus();
    const nlohmann::json& v = j_[key];
    if (v.is_array()) {
      if (v.empty()) return absl::OkStatus();
      std::vector<int64_t> ids;
      for (const auto& e : v) {
        ASSIGN_OR_RETURN(int64_t id, IntValue(e, key));
        ids.push_back(id);
      }
      *first = ids.front();
      if (all != nullptr) *all = ids;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(*first, IntValue(v, key));
    return absl::OkStatus();
  }
  const nlohmann::json& json() const { return j_; }
  absl::string_view source() const { return source_; }

  absl::Status Mistyped(absl::string_view key, const nlohmann::json& v,
                        absl::string_view expected) const {
    return absl::InvalidArgumentError(absl::StrCat(
        source_, ": field \"", key, "\" is ", runtime::JsonForMessage(v), "; expected ", expected));
  }

 private:
  absl::StatusOr<int64_t> IntValue(const nlohmann::json& v, const char* key) const {
    // Integers a config holds are sizes and token ids: anything beyond +-2^53 (where doubles
    // stop being exact) is refused rather than converted (a huge double or an unsigned above
    // INT64_MAX has no int64 value: the conversion would be undefined or wrap).
    constexpr double kLimit = 9007199254740992.0;  // 2^53
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() <= static_cast<uint64_t>(kLimit)) {
        return static_cast<int64_t>(v.get<uint64_t>());
      }
      return Mistyped(key, v, "an integer of magnitude at most 2^53");
    }
    if (v.is_number_integer()) {
      const int64_t i = v.get<int64_t>();
      if (i >= -static_cast<int64_t>(kLimit) && i <= static_cast<int64_t>(kLimit)) return i;
      return Mistyped(key, v, "an integer of magnitude at most 2^53");
    }
    if (v.is_number_float()) {
      const double d = v.get<double>();
      if (std::isfinite(d) && std::floor(d) == d && std::fabs(d) <= kLimit) {
        return static_cast<int64_t>(d);
      }
      return Mistyped(key, v, "an integer of magnitude at most 2^53");
    }
    return Mistyped(key, v, "an integer");
  }

  const nlohmann::json& j_;
  std::string source_;
};

constexpr absl::string_view kSupportedArchitectures =
    "LlamaForCausalLM (model_type llama: SmolLM2, TinyLlama, Llama 2, Llama 3.x), "
    "Qwen2ForCausalLM (qwen2: Qwen2, Qwen2.5), MistralForCausalLM (mistral), Qwen3ForCausalLM "
    "(qwen3: Qwen3 dense), Gemma3ForCausalLM (gemma3_text: Gemma 3 270M, 1B)";

absl::StatusOr<ModelFamily> FamilyOf(const HfConfigReader& r) {
  ASSIGN_OR_RETURN(std::string model_type, r.StringOr("model_type", ""));
  std::string arch;
  if (r.Has("architectures")) {
    const nlohmann::json& a = r.json()["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string()) {
      return r.Mistyped("architectures", a, "a list of architecture names");
    }
    arch = a[0].get<std::string>();
  }
  for (ModelFamily f : {ModelFamily::kLlama, ModelFamily::kQwen2, ModelFamily::kMistral,
                        ModelFamily::kQwen3, ModelFamily::kGemma3}) {
    const bool arch_match = arch == HfArchitecture(f);
    const bool type_match = model_type == HfModelType(f);
    if ((arch_match && (model_type.empty() || type_match)) || (arch.empty() && type_match)) {
      return f;
    }
  }
  return absl::UnimplementedError(absl::StrCat(
      r.source(), ": architecture \"", arch.empty() ? "(none)" : arch, "\" (model_type \"",
      model_type, "\") is not supported; supported: ", kSupportedArchitectures,
      arch == "Gemma3ForConditionalGeneration"
          ? " (this Gemma 3 checkpoint is multimodal; its language model alone is not read yet: "
            "use a text-only Gemma 3, 270M or 1B)"
          : ""));
}

// rope_theta and the scaling rule from `rope_parameters` (transformers 5) or
// `rope_theta` + `rope_scaling` (transformers 4 and the published checkpoints).
absl::Status ReadRope(const HfConfigReader& r, LlamaConfig* c) {
  const nlohmann::json& j = r.json();
  nlohmann::json scaling;  // null = none
  const char* scaling_key = "rope_scaling";
  if (r.Has("rope_parameters")) {
    scaling = j["rope_parameters"];
    scaling_key = "rope_parameters";
    if (!scaling.is_object()) return r.Mistyped(scaling_key, scaling, "an object");
    ASSIGN_OR_RETURN(c->rope_theta, r.NumberOr(scaling, "rope_theta", 10000.0));
  } else {
    ASSIGN_OR_RETURN(c->rope_theta, r.NumberOr(j, "rope_theta", 10000.0));
    if (r.Has("rope_scaling")) scaling = j["rope_scaling"];
  }
  if (scaling.is_null()) return absl::OkStatus();
  if (!scaling.is_object()) return r.Mistyped(scaling_key, scaling, "an object or null");
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (scaling.contains(key) && scaling[key].is_string()) {
      type = scaling[key].get<std::string>();
      break;
    }
  }
  RopeScaling& s = c->rope_scaling;
  if (type == "default") return absl::OkStatus();
  ASSIGN_OR_RETURN(s.factor, r.NumberOr(scaling, "factor", 1.0));
  if (type == "linear") {
    s.type = RopeScaling::Type::kLinear;
    return absl::OkStatus();
  }
  if (type == "llama3") {
    s.type = RopeScaling::Type::kLlama3;
    ASSIGN_OR_RETURN(s.low_freq_factor, r.NumberOr(scaling, "low_freq_factor", 1.0));
    ASSIGN_OR_RETURN(s.high_freq_factor, r.NumberOr(scaling, "high_freq_factor", 4.0));
    ASSIGN_OR_RETURN(double original,
                     r.NumberOr(scaling, "original_max_position_embeddings", 8192.0));
    if (!(original >= 1.0 && original <= static_cast<double>(kMaxPositions)) ||
        std::floor(original) != original) {
      return absl::InvalidArgumentError(absl::StrCat(
          r.source(), ": ", scaling_key, ".original_max_position_embeddings is ", original,
          "; expected a whole number of positions in [1, ", kMaxPositions, "]"));
    }
    s.original_max_position_embeddings = static_cast<int64_t>(original);
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat(r.source(), ": ", scaling_key, ".rope_type \"", type,
                   "\" is not supported; supported: default, linear, llama3"));
}

// Gemma 3's settings (llama_config.h): the norm and embedding conventions, the attention
// scale, the per-layer sliding / full attention with their RoPE bases, and the refusals (logit
// soft-capping, bidirectional attention). RoPE: transformers 5's rope_parameters keyed by
// layer type ({"full_attention": {...}, "sliding_attention": {...}}), or the 4.x spelling
// rope_theta (default 1e6) + rope_scaling (full layers) + rope_local_base_freq (default 1e4).
// Defaults are Gemma3TextConfig's.
absl::Status ReadGemma3(const HfConfigReader& r, LlamaConfig* c) {
  const nlohmann::json& j = r.json();
  c->hidden_act = Activation::kGeluTanh;
  c->norm_weight_offset = true;
  c->sandwich_norms = true;
  c->qk_norm = true;
  c->embed_scale = std::sqrt(static_cast<double>(c->hidden_size));
  ASSIGN_OR_RETURN(bool attention_bias, r.BoolOr("attention_bias", false));
  c->qkv_bias = c->o_bias = attention_bias;
  ASSIGN_OR_RETURN(c->attn_scalar, r.NumberOr(j, "query_pre_attn_scalar", 256.0));
  for (const char* key : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    if (r.Has(key)) {
      return absl::UnimplementedError(absl::StrCat(
          r.source(), ": ", key, " is set; logit soft-capping (Gemma 2) is not supported"));
    }
  }
  ASSIGN_OR_RETURN(bool bidirectional, r.BoolOr("use_bidirectional_attention", false));
  if (bidirectional) {
    return absl::UnimplementedError(absl::StrCat(
        r.source(), ": use_bidirectional_attention true (an encoder) is not supported"));
  }
  ASSIGN_OR_RETURN(c->sliding_window, r.IntOr("sliding_window", 4096));
  c->sliding_layers.assign(static_cast<size_t>(std::max<int64_t>(c->num_layers, 0)), 0);
  if (r.Has("layer_types")) {
    const nlohmann::json& types = j["layer_types"];
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c->num_layers) {
      return r.Mistyped("layer_types", types, "a list with one entry per layer");
    }
    for (size_t l = 0; l < types.size(); ++l) {
      if (types[l] != "sliding_attention" && types[l] != "full_attention") {
        return absl::UnimplementedError(
            absl::StrCat(r.source(), ": layer_types entry ", runtime::JsonForMessage(types[l]),
                         " is not supported; expected sliding_attention or full_attention"));
      }
      c->sliding_layers[l] = types[l] == "sliding_attention" ? 1 : 0;
    }
  } else {
    ASSIGN_OR_RETURN(int64_t pattern, r.IntOr("sliding_window_pattern", 6));
    if (pattern < 1)
      return r.Mistyped("sliding_window_pattern", j["sliding_window_pattern"], ">= 1");
    for (size_t l = 0; l < c->sliding_layers.size(); ++l) {
      c->sliding_layers[l] = (static_cast<int64_t>(l) + 1) % pattern != 0 ? 1 : 0;
    }
  }
  // RoPE: full layers through the common reader (a flat rope_parameters / rope_scaling), the
  // sliding layers' base from their own entry.
  if (r.Has("rope_parameters") && j["rope_parameters"].is_object() &&
      j["rope_parameters"].contains("full_attention")) {
    nlohmann::json flat = j;
    flat["rope_parameters"] = j["rope_parameters"]["full_attention"];
    HfConfigReader full(flat, r.source());
    RETURN_IF_ERROR(ReadRope(full, c));
    const nlohmann::json& local = j["rope_parameters"].value("sliding_attention", nlohmann::json());
    if (local.is_object()) {
      ASSIGN_OR_RETURN(c->rope_local_theta, r.NumberOr(local, "rope_theta", 10000.0));
      const std::string type = local.value("rope_type", std::string("default"));
      if (type != "default") {
        return absl::UnimplementedError(
            absl::StrCat(r.source(), ": rope_parameters.sliding_attention.rope_type \"", type,
                         "\" is not supported; the sliding layers' RoPE is unscaled in Gemma 3"));
      }
    }
  } else {
    nlohmann::json flat = j;
    if (!r.Has("rope_parameters") && !r.Has("rope_theta")) flat["rope_theta"] = 1000000.0;
    HfConfigReader full(flat, r.source());
    RETURN_IF_ERROR(ReadRope(full, c));
    ASSIGN_OR_RETURN(c->rope_local_theta, r.NumberOr(j, "rope_local_base_freq", 10000.0));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LlamaConfig> LlamaConfigFromHfJson(const nlohmann::json& config,
                                                  absl::string_view source) {
  if (!config.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": expected a JSON object (a transformers config.json)"));
  }
  HfConfigReader r(config, source);
  LlamaConfig c;
  ASSIGN_OR_RETURN(c.family, FamilyOf(r));
  const bool gemma = c.family == ModelFamily::kGemma3;
  // Gemma's configs name it hidden_activation (hidden_act in older ones).
  const char* act_key = gemma && r.Has("hidden_activation") ? "hidden_activation" : "hidden_act";
  ASSIGN_OR_RETURN(std::string act, r.StringOr(act_key, gemma ? "gelu_pytorch_tanh" : "silu"));
  const std::string want_act = gemma ? "gelu_pytorch_tanh" : "silu";
  if (act != want_act) {
    return absl::UnimplementedError(absl::StrCat(source, ": ", act_key, " \"", act,
                                                 "\" is not supported; ", HfArchitecture(c.family),
                                                 " uses ", want_act));
  }
  ASSIGN_OR_RETURN(bool mlp_bias, r.BoolOr("mlp_bias", false));
  if (mlp_bias) {
    return absl::UnimplementedError(
        absl::StrCat(source, ": mlp_bias true is not supported (no supported family uses it)"));
  }
  ASSIGN_OR_RETURN(c.vocab_size, r.Int("vocab_size"));
  ASSIGN_OR_RETURN(c.hidden_size, r.Int("hidden_size"));
  ASSIGN_OR_RETURN(c.intermediate_size, r.Int("intermediate_size"));
  ASSIGN_OR_RETURN(c.num_layers, r.Int("num_hidden_layers"));
  ASSIGN_OR_RETURN(c.num_heads, r.Int("num_attention_heads"));
  ASSIGN_OR_RETURN(c.num_kv_heads, r.IntOr("num_key_value_heads", c.num_heads));
  const int64_t default_head_dim = gemma                             ? 256  // Gemma3TextConfig's
                                   : c.family == ModelFamily::kQwen3 ? 128  // Qwen3Config's
                                   : c.num_heads > 0                 ? c.hidden_size / c.num_heads
                                                                     : 0;
  ASSIGN_OR_RETURN(c.head_dim, r.IntOr("head_dim", default_head_dim));
  const int64_t default_positions = c.family == ModelFamily::kLlama ? 2048 : gemma ? 131072 : 32768;
  ASSIGN_OR_RETURN(c.max_position_embeddings,
                   r.IntOr("max_position_embeddings", default_positions));
  ASSIGN_OR_RETURN(c.rms_norm_eps, r.NumberOr(config, "rms_norm_eps", 1e-6));
  if (!gemma) RETURN_IF_ERROR(ReadRope(r, &c));
  ASSIGN_OR_RETURN(c.tie_word_embeddings, r.BoolOr("tie_word_embeddings", gemma));
  switch (c.family) {
    case ModelFamily::kLlama: {
      ASSIGN_OR_RETURN(bool attention_bias, r.BoolOr("attention_bias", false));
      c.qkv_bias = c.o_bias = attention_bias;
      break;
    }
    case ModelFamily::kQwen2:
    case ModelFamily::kQwen3: {
      if (c.family == ModelFamily::kQwen2) {
        c.qkv_bias = true;
      } else {
        ASSIGN_OR_RETURN(bool attention_bias, r.BoolOr("attention_bias", false));
        c.qkv_bias = c.o_bias = attention_bias;
        c.qk_norm = true;
      }
      ASSIGN_OR_RETURN(bool sliding, r.BoolOr("use_sliding_window", false));
      if (sliding) {
        return absl::UnimplementedError(absl::StrCat(
            source, ": use_sliding_window true (per-layer sliding-window attention of ",
            HfArchitecture(c.family),
            ") is not supported; set it to false (the published Qwen2.5 and Qwen3 checkpoints "
            "do)"));
      }
      break;
    }
    case ModelFamily::kMistral: {
      ASSIGN_OR_RETURN(c.sliding_window, r.IntOr("sliding_window", 0));
      break;
    }
    case ModelFamily::kGemma3:
      RETURN_IF_ERROR(ReadGemma3(r, &c));
      break;
  }
  if (!gemma && r.Has("layer_types")) {
    const nlohmann::json& types = config["layer_types"];
    if (!types.is_array()) return r.Mistyped("layer_types", types, "a list");
    for (const auto& t : types) {
      const bool full = t == "full_attention";
      const bool sliding_ok = t == "sliding_attention" && c.sliding_window > 0;
      if (!full && !sliding_ok) {
        return absl::UnimplementedError(
            absl::StrCat(source, ": layer_types entry ", runtime::JsonForMessage(t),
                         " is not supported; every layer must be full_attention (or, for Mistral, "
                         "sliding_attention with a sliding_window)"));
      }
    }
  }
  RETURN_IF_ERROR(r.TokenIds("bos_token_id", -1, &c.bos_token_id, nullptr));
  RETURN_IF_ERROR(r.TokenIds("eos_token_id", -1, &c.eos_token_id, &c.eos_token_ids));
  RETURN_IF_ERROR(r.TokenIds("pad_token_id", -1, &c.pad_token_id, nullptr));
  if (c.eos_token_ids.size() == 1) c.eos_token_ids.clear();
  absl::Status valid = c.Validate();
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", valid.message()));
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
