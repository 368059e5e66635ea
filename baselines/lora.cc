// Shapes as in baselines/lora.h (r: the LoRA rank).
#include "baselines/lora.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"

namespace lspo::baselines {

namespace {

constexpr char kConfigFile[] = "adapter_config.json";
constexpr char kWeightsFile[] = "adapter_model.safetensors";

// The module name of linear i's kind ("q_proj", ...).
const char* ModuleOf(int64_t i) { return kLoraModuleNames[i % model::kLinearsPerLayer]; }

bool KnownModule(const std::string& name) {
  return std::find_if(std::begin(kLoraModuleNames), std::end(kLoraModuleNames),
                      [&](const char* m) { return name == m; }) != std::end(kLoraModuleNames);
}

// Checks `s` (r, alpha, targets; empty targets become all seven) for a model with the given
// linear shapes. Errors: kInvalidArgument naming the setting.
absl::Status CheckSettings(LoraSettings* s, const model::LlamaModel& model) {
  if (s->r < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA rank r = ", s->r, " is invalid: it must be >= 1"));
  }
  if (!(std::isfinite(s->alpha) && s->alpha > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA lora_alpha = ", s->alpha, " is invalid: it must be finite and > 0"));
  }
  if (s->target_modules.empty()) {
    s->target_modules.assign(std::begin(kLoraModuleNames), std::end(kLoraModuleNames));
  }
  std::set<std::string> seen;
  for (const std::string& m : s->target_modules) {
    if (!KnownModule(m)) {
      return absl::InvalidArgumentError(absl::StrCat("LoRA target module '", m,
                                                     "' is not a linear of this model; use any of ",
                                                     absl::StrJoin(kLoraModuleNames, ", ")));
    }
    if (!seen.insert(m).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoRA target module '", m, "' is named twice"));
    }
  }
  // The largest rank every target allows, and the first matrix that r exceeds.
  int64_t limit = -1, first = -1;
  for (int64_t i = 0; i < model.num_linears(); ++i) {
    if (!seen.count(ModuleOf(i))) continue;
    const at::Tensor& w = model.LinearWeight(i);  // (m, n), as stored
    const int64_t side = std::min(w.size(0), w.size(1));
    limit = limit < 0 ? side : std::min(limit, side);
    if (first < 0 && s->r > side) first = i;
  }
  if (first >= 0) {
    const at::Tensor& w = model.LinearWeight(first);  // (m, n), as stored
    return absl::InvalidArgumentError(absl::StrCat(
        "LoRA rank r = ", s->r, " exceeds the smaller side of ", model.LinearName(first), " (",
        w.size(0), " x ", w.size(1), "): use r <= ", limit,
        " (the smallest side of the target modules) or leave the narrow modules out"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<LoraAdapter>> LoraAdapter::Create(const model::LlamaModel& model,
                                                                 LoraSettings settings,
                                                                 uint64_t seed) {
  RETURN_IF_ERROR(CheckSettings(&settings, model));
  std::shared_ptr<LoraAdapter> adapter(new LoraAdapter());
  adapter->settings_ = settings;
  adapter->scaling_ = settings.Scaling();
  const std::set<std::string> targets(settings.target_modules.begin(),
                                      settings.target_modules.end());
  const int64_t n_lin = model.num_linears();
  adapter->a_.resize(static_cast<size_t>(n_lin));
  adapter->b_.resize(static_cast<size_t>(n_lin));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const at::Device device = model.device();
  for (int64_t i = 0; i < n_lin; ++i) {
    if (!targets.count(ModuleOf(i))) continue;
    const int64_t m = model.LinearWeight(i).size(0), n = model.LinearWeight(i).size(1);
    // kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in)
    // = 1 / sqrt(n) (torch.nn.init; PEFT LoraLayer.reset_lora_parameters).
    const double bound = 1.0 / std::sqrt(static_cast<double>(n));
    at::Tensor a = at::empty({settings.r, n}, at::kFloat);  // (r, n) fp32 CPU
    a.uniform_(-bound, bound, gen);
    adapter->a_[static_cast<size_t>(i)] = a.to(device).requires_grad_(true);  // A (r, n) fp32
    // B (m, r) fp32, zeros.
    adapter->b_[static_cast<size_t>(i)] =
        at::zeros({m, settings.r}, at::TensorOptions().dtype(at::kFloat).device(device))
            .requires_grad_(true);
  }
  return adapter;
}

void LoraAdapter::Attach(model::LlamaModel* model) {
  for (int64_t i = 0; i < model->num_linears(); ++i) {
    model->SetLinearMode(i, targets(i) ? model::LinearMode::kCustom : model::LinearMode::kFrozen);
  }
  model->SetLinearImpl(shared_from_this());
}

at::Tensor LoraAdapter::Forward(const at::Tensor& x2d, const at::Tensor& w, int64_t linear_index) {
  at::Tensor y = model::UpcastLinear(x2d, w);  // (N, m) fp32; no upcast copy of 16-bit W kept
  if (!targets(linear_index)) return y;
  const at::Tensor& a = A(linear_index);  // (r, n) fp32
  const at::Tensor& b = B(linear_index);  // (m, r) fp32
  return y + at::mm(at::mm(x2d, a.t()), b.t()) * scaling_;
}

absl::Status LoraAdapter::To(const at::Device& device) {
  std::vector<at::Tensor> a(a_.size()), b(b_.size());  // A (r, n), B (m, r) fp32 on `device`
  try {
    for (size_t i = 0; i < a_.size(); ++i) {
      if (!a_[i].defined()) continue;
      a[i] = a_[i].detach().to(device).requires_grad_(true);
      b[i] = b_[i].detach().to(device).requires_grad_(true);
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot move the LoRA adapters to ",
                                                   device.str(), ": ", e.what_without_backtrace()));
  }
  a_ = std::move(a);
  b_ = std::move(b);
  return absl::OkStatus();
}

std::vector<at::Tensor> LoraAdapter::Parameters() const {
  std::vector<at::Tensor> params;  // A (r, n), B (m, r) fp32 per target
  for (size_t i = 0; i < a_.size(); ++i) {
    if (!a_[i].defined()) continue;
    params.push_back(a_[i]);
    params.push_back(b_[i]);
  }
  return params;
}

int64_t LoraAdapter::NumParameters() const {
  int64_t n = 0;
  for (const at::Tensor& p : Parameters()) n += p.numel();  // A (r, n) or B (m, r)
  return n;
}

at::Tensor LoraAdapter::MergedWeight(int64_t i, const at::Tensor& w) const {
  at::NoGradGuard no_grad;
  at::Tensor merged = w.detach().to(at::kFloat).clone();  // (m, n) fp32 on w's device
  if (targets(i)) merged.add_(at::mm(B(i).detach(), A(i).detach()), scaling_);
  return merged;
}

std::vector<std::pair<std::string, at::Tensor>> LoraAdapter::MergedTensors(
    const model::LlamaModel& model) const {
  std::vector<std::pair<std::string, at::Tensor>> tensors = model.NamedTensors();
  for (int64_t i = 0; i < model.num_linears(); ++i) {
    if (!targets(i)) continue;
    const std::string name = model.LinearName(i);
    for (auto& [n, t] : tensors) {
      if (n == name) t = MergedWeight(i, t);
    }
  }
  return tensors;
}

std::string LoraAdapter::PeftKey(const std::string& hf_weight_name, char which) {
  std::string module = hf_weight_name;
  if (absl::EndsWith(module, ".weight")) module.resize(module.size() - 7);
  return absl::StrCat("base_model.model.", module, which == 'A' ? ".lora_A" : ".lora_B", ".weight");
}

absl::StatusOr<std::vector<std::string>> WritePeftAdapter(const LoraAdapter& adapter,
                                                          const model::LlamaModel& model,
                                                          const std::string& base_model,
                                                          const std::string& dir) {
  RETURN_IF_ERROR(runtime::MakeDirs(dir));
  const LoraSettings& s = adapter.settings();
  const nlohmann::json config = PeftAdapterConfigJson(s, base_model);
  const std::string config_path = absl::StrCat(dir, "/", kConfigFile);
  RETURN_IF_ERROR(runtime::WriteFileAtomically(config_path, config.dump(2) + "\n"));
  std::vector<at::Tensor> host;  // fp32 CPU copies of A (r, n), B (m, r), alive during the write
  std::vector<model::SafetensorsEntry> entries;
  for (int64_t i = 0; i < adapter.num_linears(); ++i) {
    if (!adapter.targets(i)) continue;
    for (char which : {'A', 'B'}) {
      // A (r, n) or B (m, r) fp32
      const at::Tensor& t = which == 'A' ? adapter.A(i) : adapter.B(i);
      host.push_back(t.detach().to(at::kCPU, at::kFloat).contiguous());
      entries.push_back({LoraAdapter::PeftKey(model.LinearName(i), which), "F32",
                         host.back().sizes().vec(), host.back().data_ptr(),
                         static_cast<size_t>(host.back().nbytes())});
    }
  }
  const std::string weights_path = absl::StrCat(dir, "/", kWeightsFile);
  RETURN_IF_ERROR(model::WriteSafetensors(weights_path, entries, {{"format", "pt"}}));
  return std::vector<std::string>{config_path, weights_path};
}

absl::StatusOr<std::shared_ptr<LoraAdapter>> ReadPeftAdapter(const std::string& dir,
                                                             const model::LlamaModel& model) {
  const std::string config_path = absl::StrCat(dir, "/", kConfigFile);
  ASSIGN_OR_RETURN(std::string text, runtime::ReadFileToString(config_path, "adapter config"));
  ASSIGN_OR_RETURN(LoraSettings s, ParsePeftAdapterConfig(text, config_path));
  absl::StatusOr<std::shared_ptr<LoraAdapter>> made = LoraAdapter::Create(model, s, 0);
  if (!made.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("adapter config '", config_path, "': ", made.status().message()));
  }
  std::shared_ptr<LoraAdapter> adapter = *std::move(made);

  const std::string weights_path = absl::StrCat(dir, "/", kWeightsFile);
  ASSIGN_OR_RETURN(model::SafetensorsFile file, model::SafetensorsFile::Open(weights_path));
  std::set<std::string> expected;
  for (int64_t i = 0; i < adapter->num_linears(); ++i) {
    if (!adapter->targets(i)) continue;
    for (char which : {'A', 'B'}) {
      const std::string key = LoraAdapter::PeftKey(model.LinearName(i), which);
      expected.insert(key);
      at::Tensor& dst = which == 'A' ? adapter->A(i) : adapter->B(i);  // A (r, n) or B (m, r) fp32
      absl::StatusOr<std::vector<int64_t>> shape = file.shape(key);
      if (!shape.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("adapter '", weights_path, "' has no tensor ", key,
                         ", which the config's target ", "modules imply"));
      }
      if (*shape != dst.sizes().vec()) {
        return absl::InvalidArgumentError(
            absl::StrCat("adapter '", weights_path, "': tensor ", key, " has shape [",
                         absl::StrJoin(*shape, ", "), "] but the model needs [",
                         absl::StrJoin(dst.sizes().vec(), ", "), "] (r = ", s.r, ")"));
      }
      at::Tensor host = at::empty(dst.sizes(), at::kFloat);  // dst's shape, fp32 CPU
      RETURN_IF_ERROR(file.ReadF32Into(
          key, absl::Span<float>(host.data_ptr<float>(), static_cast<size_t>(host.numel()))));
      if (!at::isfinite(host).all().item<bool>()) {
        return absl::DataLossError(
            absl::StrCat("adapter '", weights_path, "': tensor ", key, " holds non-finite values"));
      }
      at::NoGradGuard no_grad;
      dst.copy_(host);
    }
  }
  for (const std::string& name : file.names()) {
    if (!expected.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adapter '", weights_path, "' has tensor ", name,
          " that belongs to no target module of its config (or to a model of another shape)"));
    }
  }
  return adapter;
}

}  // namespace lspo::baselines
