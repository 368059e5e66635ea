// The PEFT adapter_config.json of a LoRA adapter (peft/config.py, LoraConfig), torch-free: the
// settings this project uses (LoraSettings), the reader that checks a config against what
// baselines/lora.h implements, and the writer of the config that WritePeftAdapter saves.
// Split from baselines/lora.h (which links LibTorch) so that the reader can be fuzzed alone
// (fuzz/peft_config_fuzzer.cc).
//
// Thread-safety: plain values and stateless functions.
#ifndef LSPO_BASELINES_PEFT_CONFIG_H_
#define LSPO_BASELINES_PEFT_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace lspo::baselines {

// PEFT module names of a decoder layer's seven linears, in model::LinearKind order.
inline constexpr const char* kLoraModuleNames[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};

// PEFT LoraConfig's fields this project uses.
struct LoraSettings {
  int64_t r = 8;                            // rank (PEFT default 8)
  double alpha = 8;                         // lora_alpha (PEFT default 8)
  bool use_rslora = false;                  // scale alpha / sqrt(r) instead of alpha / r
  std::vector<std::string> target_modules;  // names from kLoraModuleNames; empty = all seven

  // alpha / r, or alpha / sqrt(r) with rsLoRA (PEFT LoraLayer.update_layer).
  double Scaling() const;
};

// Reads the text of an adapter_config.json (`config_path` names it in messages; nothing is
// read from disk). Accepted: peft_type "LORA", an integer "r", a number "lora_alpha",
// target_modules a list of strings (returned sorted in kLoraModuleNames order, names outside
// it last) or "all-linear" (returned empty = all seven), bias "none", fan_in_fan_out / use_dora
// / lora_bias / use_qalora false, and rank_pattern, alpha_pattern, layers_to_transform,
// layer_replication, exclude_modules, modules_to_save, target_parameters,
// trainable_token_indices absent, null or empty. The values of r, lora_alpha and the module
// names are not checked against a model here (LoraAdapter::Create does that).
// Errors, each naming `config_path` and the field: kInvalidArgument (not a JSON object, a
// missing or mistyped field, an empty target list, a target regular expression);
// kUnimplemented (a PEFT feature this reader does not implement).
absl::StatusOr<LoraSettings> ParsePeftAdapterConfig(absl::string_view text,
                                                    const std::string& config_path);

// The adapter_config.json object WritePeftAdapter saves for `s` (PEFT LoraConfig.to_dict's
// fields that matter for loading; the others at PEFT's defaults), naming `base_model` as
// base_model_name_or_path. For settings with a non-empty target list,
// ParsePeftAdapterConfig(PeftAdapterConfigJson(s, b).dump()) returns `s` (targets in
// kLoraModuleNames order).
nlohmann::json PeftAdapterConfigJson(const LoraSettings& s, const std::string& base_model);

}  // namespace lspo::baselines

#endif  // LSPO_BASELINES_PEFT_CONFIG_H_
