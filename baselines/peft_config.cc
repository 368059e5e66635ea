// PEFT adapter_config.json reader and writer; see peft_config.h.
#include "baselines/peft_config.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/json_text.h"

namespace lspo::baselines {
namespace {}  // namespace

double LoraSettings::Scaling() const {
  return use_rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

absl::StatusOr<LoraSettings> ParsePeftAdapterConfig(absl::string_view text,
                                                    const std::string& config_path) {
  nlohmann::json c =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& field, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter config '", config_path, "': ", field, " ", why));
  };
  if (!c.is_object()) return bad("the file", "is not a JSON object");
  auto field_is = [&](const char* key, const nlohmann::json& expected) {
    return !c.contains(key) || c[key].is_null() || c[key] == expected;
  };
  if (!c.contains("peft_type") || c["peft_type"] != "LORA") {
    return bad("peft_type", "must be \"LORA\" (this reader loads LoRA adapters only)");
  }
  if (!c.contains("r") || !c["r"].is_number_integer()) return bad("r", "must be an integer");
  if (!c.contains("lora_alpha") || !c["lora_alpha"].is_number()) {
    return bad("lora_alpha", "must be a number");
  }
  if (!field_is("bias", "none")) {
    return absl::UnimplementedError(absl::StrCat("adapter config '", config_path, "': bias ",
                                                 runtime::JsonForMessage(c["bias"]),
                                                 " is not supported; only \"none\""));
  }
  // PEFT features this reader does not implement must be off: false, null or empty.
  for (const char* off : {"fan_in_fan_out", "use_dora", "lora_bias", "use_qalora"}) {
    if (!field_is(off, false)) {
      return absl::UnimplementedError(absl::StrCat("adapter config '", config_path, "': ", off,
                                                   " = ", runtime::JsonForMessage(c[off]),
                                                   " is not supported"));
    }
  }
  for (const char* empty :
       {"rank_pattern", "alpha_pattern", "layers_to_transform", "layer_replication",
        "exclude_modules", "modules_to_save", "target_parameters", "trainable_token_indices"}) {
    if (c.contains(empty) && !c[empty].is_null() && !c[empty].empty()) {
      return absl::UnimplementedError(absl::StrCat("adapter config '", config_path, "': ", empty,
                                                   " = ", runtime::JsonForMessage(c[empty]),
                                                   " is not supported (leave it empty)"));
    }
  }
  LoraSettings s;
  s.r = c["r"].get<int64_t>();
  s.alpha = c["lora_alpha"].get<double>();
  s.use_rslora =
      c.contains("use_rslora") && c["use_rslora"].is_boolean() && c["use_rslora"].get<bool>();
  const nlohmann::json& tm = c.contains("target_modules") ? c["target_modules"] : nlohmann::json();
  if (tm.is_string() && tm == "all-linear") {
    // PEFT: every linear but the output layer.
  } else if (tm.is_array()) {
    for (const auto& m : tm) {
      if (!m.is_string()) return bad("target_modules", "must list module names (strings)");
      s.target_modules.push_back(m.get<std::string>());
    }
    if (s.target_modules.empty()) return bad("target_modules", "is empty");
    std::sort(s.target_modules.begin(), s.target_modules.end(), [](const auto& x, const auto& y) {
      auto rank = [](const std::string& m) {
        return std::find_if(std::begin(kLoraModuleNames), std::end(kLoraModuleNames),
                            [&](const char* k) { return m == k; }) -
               std::begin(kLoraModuleNames);
      };
      return rank(x) < rank(y);
    });
  } else {
    return bad("target_modules",
               "must be a list of module names or \"all-linear\" (a regular expression is not "
               "supported)");
  }
  return s;
}

nlohmann::json PeftAdapterConfigJson(const LoraSettings& s, const std::string& base_model) {
  return {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", s.r},
      {"lora_alpha", s.alpha},
      {"target_modules", s.target_modules},
      {"lora_dropout", 0.0},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_rslora", s.use_rslora},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
      {"layers_pattern", nullptr},
      {"rank_pattern", nlohmann::json::object()},
      {"alpha_pattern", nlohmann::json::object()},
      {"revision", nullptr},
  };
}

}  // namespace lspo::baselines
