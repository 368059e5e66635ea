// The table of training modes (training_mode.h) and each mode's own settings: defaults,
// checks, arena layout and run-header words. The memory-plan terms are in mode_plans.cc.
#include "offload/training_mode.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <set>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"
#include "offload/mode_plans.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"

namespace lspo::offload {
namespace {

using lspo::v1::JobSpec;

// The HF module names of a decoder layer's seven trainable linears (model/llama.h LinearKind
// order): the lora.target_modules a job may name.
constexpr const char* kLinearModules[] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                          "gate_proj", "up_proj", "down_proj"};

absl::Status Bad(absl::string_view field, const std::string& value, absl::string_view fix) {
  return absl::InvalidArgumentError(
      absl::StrCat("job spec field ", field, " = ", value, " is invalid: ", fix));
}

// ---- lsp ----
}  // namespace

lspo::v1::ApplyRounding LspApplyRounding(const JobSpec& spec) {
  const lspo::v1::ApplyRounding r = spec.lsp().apply_rounding();
  return r == lspo::v1::APPLY_ROUNDING_UNSPECIFIED ? lspo::v1::APPLY_ROUNDING_STOCHASTIC : r;
}

bool SixteenBitWorkerWeights(const JobSpec& spec, bool cuda) {
  return spec.weight_dtype() == lspo::v1::WEIGHT_DTYPE_BF16 ||
         (cuda && spec.weight_dtype() == lspo::v1::WEIGHT_DTYPE_UNSPECIFIED);
}

int32_t LspRefreshEvery(const JobSpec& spec, bool sixteen_bit_weights) {
  if (spec.lsp().has_refresh_every()) return spec.lsp().refresh_every();
  const bool refresh_allowed = spec.lsp().master_refresh() != lspo::v1::MASTER_REFRESH_NEVER;
  return sixteen_bit_weights && refresh_allowed &&
                 LspApplyRounding(spec) != lspo::v1::APPLY_ROUNDING_COMPENSATED
             ? kDefaultRefreshEvery
             : 0;
}

namespace {

bool LspKeepsResidual(const JobSpec& spec) {
  return LspApplyRounding(spec) == lspo::v1::APPLY_ROUNDING_COMPENSATED;
}

absl::StatusOr<lspo::v1::ArenaLayout> LspLayout(const std::vector<LinearShape>& linears,
                                                int32_t linears_per_layer, const JobSpec& spec,
                                                const std::string& name) {
  ASSIGN_OR_RETURN(std::vector<lsp::MatrixSubspace> subspaces,
                   ResolveJobSubspaces(linears, spec.lsp()));
  return BuildArenaLayout(linears, linears_per_layer, subspaces, spec.lsp().d(), spec.lsp().r(),
                          name);
}

std::string LspDescribe(const JobSpec& spec) {
  return absl::StrCat(spec.lsp().d_ratio() > 0 ? absl::StrCat("d_ratio=", spec.lsp().d_ratio())
                                               : absl::StrCat("d=", spec.lsp().d()),
                      " r=", spec.lsp().r());
}

// ---- zero ----

bool Never(const JobSpec&) { return false; }

absl::StatusOr<lspo::v1::ArenaLayout> ZeroLayout(const std::vector<LinearShape>& linears,
                                                 int32_t linears_per_layer, const JobSpec&,
                                                 const std::string& name) {
  return BuildZeroArenaLayout(linears, linears_per_layer, name);
}

// ---- lora ----

void LoraDefaults(JobSpec* spec) {
  // PEFT's LoraConfig defaults (r 8, lora_alpha 8); the targets written out.
  auto* lora = spec->mutable_lora();
  if (lora->r() == 0) lora->set_r(8);
  if (lora->alpha() == 0) lora->set_alpha(8);
  if (lora->target_modules().empty()) {
    for (const char* m : kLinearModules) lora->add_target_modules(m);
  }
  // Layer order (q, k, v, o, gate, up, down), so that the same targets listed in another
  // order are the same training (fingerprint); names that are not modules stay last, for
  // the check to refuse.
  auto rank = [](const std::string& m) {
    return std::find_if(std::begin(kLinearModules), std::end(kLinearModules),
                        [&](const char* k) { return m == k; }) -
           std::begin(kLinearModules);
  };
  std::stable_sort(lora->mutable_target_modules()->begin(), lora->mutable_target_modules()->end(),
                   [&](const std::string& a, const std::string& b) { return rank(a) < rank(b); });
}

absl::Status LoraCheck(const JobSpec& spec) {
  const auto& lora = spec.lora();
  if (lora.r() < 1) {
    return Bad("lora.r", absl::StrCat(lora.r()),
               "the adapter rank must be >= 1 (PEFT's default is 8)");
  }
  if (!(std::isfinite(lora.alpha()) && lora.alpha() > 0)) {
    return Bad("lora.alpha", absl::StrCat(lora.alpha()), "lora_alpha must be a finite number > 0");
  }
  // The adapters' scaling alpha / r (rsLoRA: alpha / sqrt(r)) multiplies fp32 activations:
  // it must be a normal fp32 number (PEFT's usual alpha is r to 4 r).
  const double r = static_cast<double>(lora.r());
  const double scaling = lora.use_rslora() ? lora.alpha() / std::sqrt(r) : lora.alpha() / r;
  if (!(scaling >= std::numeric_limits<float>::min() &&
        scaling <= std::numeric_limits<float>::max())) {
    return Bad("lora.alpha", absl::StrCat(lora.alpha()),
               absl::StrCat("the scaling alpha / r = ", scaling,
                            " is not a normal fp32 number; use an alpha near r to 4 r"));
  }
  std::set<std::string> seen;
  for (const std::string& m : lora.target_modules()) {
    if (absl::c_find(kLinearModules, m) == std::end(kLinearModules)) {
      return Bad("lora.target_modules", absl::StrCat("[..., \"", m, "\", ...]"),
                 absl::StrCat("each target is one of ", absl::StrJoin(kLinearModules, ", ")));
    }
    if (!seen.insert(m).second) {
      return Bad("lora.target_modules", absl::StrCat("[..., \"", m, "\", ...]"),
                 "a module is named twice; name each once");
    }
  }
  return absl::OkStatus();
}

std::string LoraDescribe(const JobSpec& spec) {
  return absl::StrCat("lora r=", spec.lora().r(), " alpha=", spec.lora().alpha(), " on ",
                      absl::StrJoin(spec.lora().target_modules(), ","));
}

// ---- galore, galore-offload ----

void GaloreDefaults(JobSpec* spec) {
  // GaLore's usual settings (its README: rank 128, update_proj_gap 200, scale 0.25).
  auto* galore = spec->mutable_galore();
  if (galore->rank() == 0) galore->set_rank(128);
  if (galore->update_proj_gap() == 0) galore->set_update_proj_gap(200);
  if (galore->scale() == 0) galore->set_scale(0.25);
}

absl::Status GaloreCheck(const JobSpec& spec) {
  // The rank against each matrix's sides is checked when the model is loaded (the worker
  // names the matrix).
  const auto& galore = spec.galore();
  if (galore.rank() < 1) {
    return Bad("galore.rank", absl::StrCat(galore.rank()),
               "the projection rank must be >= 1 (GaLore uses 128)");
  }
  if (galore.update_proj_gap() < 1) {
    return Bad("galore.update_proj_gap", absl::StrCat(galore.update_proj_gap()),
               "the projector is recomputed every this many steps; use >= 1 (default 200)");
  }
  // The scale multiplies fp32 updates (a normal fp32 number), and scale x lr is the step
  // size, bounded like lr alone in the other modes.
  if (!(galore.scale() >= std::numeric_limits<float>::min() &&
        galore.scale() <= std::numeric_limits<float>::max())) {
    return Bad("galore.scale", absl::StrCat(galore.scale()),
               "must be a normal fp32 number > 0 (GaLore uses 0.25 to 4)");
  }
  if (galore.scale() * spec.optim().lr() > 1) {
    return Bad("galore.scale", absl::StrCat(galore.scale()),
               absl::StrCat("galore.scale x optim.lr = ", galore.scale() * spec.optim().lr(),
                            " is the step size and must be <= 1 (as optim.lr is in the other "
                            "modes); GaLore uses a scale of 0.25 to 4"));
  }
  return absl::OkStatus();
}

bool Always(const JobSpec&) { return true; }

absl::StatusOr<lspo::v1::ArenaLayout> GaloreOffloadLayout(const std::vector<LinearShape>& linears,
                                                          int32_t linears_per_layer,
                                                          const JobSpec& spec,
                                                          const std::string& name) {
  // ResolveDefaults' (GaLore's README) default where the spec is of another mode: 128.
  const int32_t rank = spec.galore().rank() > 0 ? spec.galore().rank() : 128;
  return BuildGaloreArenaLayout(linears, linears_per_layer, rank, name);
}

std::string GaloreDescribeAs(const JobSpec& spec, absl::string_view name) {
  return absl::StrCat(name, " rank=", spec.galore().rank(),
                      " gap=", spec.galore().update_proj_gap(), " scale=", spec.galore().scale());
}
std::string GaloreDescribe(const JobSpec& spec) { return GaloreDescribeAs(spec, "galore"); }
std::string GaloreOffloadDescribe(const JobSpec& spec) {
  return GaloreDescribeAs(spec, "galore-offload");
}

// The modes (training_mode.h ModeDescriptor). Adding one: an entry here.
const ModeDescriptor kModes[] = {
    {lspo::v1::MODE_LSP, "lsp", "subspace gradients down, subspace steps up", "lsp",
     OffloadKind::kSubspace, /*learned_projectors=*/true, /*data_parallel=*/true,
     /*resolve_defaults=*/nullptr, /*check=*/nullptr, &LspKeepsResidual, &PlanLspTerms, &LspLayout,
     &LspDescribe},
    {lspo::v1::MODE_ZERO, "zero", "full gradients down, full weights up", "", OffloadKind::kFull,
     false, true, nullptr, nullptr, &Never, &PlanZeroTerms, &ZeroLayout, nullptr},
    {lspo::v1::MODE_NATIVE, "native", "no offload", "", OffloadKind::kNone, false, true, nullptr,
     nullptr, &Never, &PlanNativeTerms, nullptr, nullptr},
    {lspo::v1::MODE_LORA, "lora", "no offload", "lora", OffloadKind::kNone, false, true,
     &LoraDefaults, &LoraCheck, &Never, &PlanLoraTerms, nullptr, &LoraDescribe},
    {lspo::v1::MODE_GALORE, "galore", "no offload", "galore", OffloadKind::kNone, false, true,
     &GaloreDefaults, &GaloreCheck, &Never, &PlanGaloreTerms, nullptr, &GaloreDescribe},
    // Data parallelism would need each rank's gradient summed before it is projected.
    {lspo::v1::MODE_GALORE_OFFLOAD, "galore-offload", "projected gradients down, steps up",
     "galore", OffloadKind::kSubspace, false, /*data_parallel=*/false, &GaloreDefaults,
     &GaloreCheck, &Always, &PlanGaloreOffloadTerms, &GaloreOffloadLayout, &GaloreOffloadDescribe},
};

// Whether the block `name` of `spec` sets anything (a present message of default values
// does not: `lora: {}` is the same spec as none).
bool BlockSet(const JobSpec& spec, absl::string_view name) {
  const google::protobuf::FieldDescriptor* f =
      JobSpec::descriptor()->FindFieldByName(std::string(name));
  if (f == nullptr) return false;
  const google::protobuf::Reflection* r = spec.GetReflection();
  return r->HasField(spec, f) && r->GetMessage(spec, f).ByteSizeLong() > 0;
}

}  // namespace

absl::Span<const ModeDescriptor> AllModes() { return kModes; }

bool ModeKnown(lspo::v1::TrainingMode mode) {
  return mode == lspo::v1::MODE_UNSPECIFIED ||
         absl::c_any_of(kModes, [&](const ModeDescriptor& m) { return m.mode == mode; });
}

const ModeDescriptor& DescriptorOf(lspo::v1::TrainingMode mode) {
  for (const ModeDescriptor& m : kModes) {
    if (m.mode == mode) return m;
  }
  return kModes[0];
}

const ModeDescriptor& ModeOf(const JobSpec& spec) {
  if (spec.mode() == lspo::v1::MODE_GALORE && spec.galore().offload()) {
    return DescriptorOf(lspo::v1::MODE_GALORE_OFFLOAD);
  }
  return DescriptorOf(spec.mode());
}

std::string ModeNames() {
  std::vector<std::string> names;
  for (const ModeDescriptor& m : kModes) names.emplace_back(m.name);
  const std::string last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

absl::StatusOr<const ModeDescriptor*> ModeByName(absl::string_view name) {
  std::string key = absl::AsciiStrToLower(name);
  if (absl::StartsWith(key, "mode_")) key = key.substr(5);
  absl::StrReplaceAll({{"_", "-"}}, &key);
  for (const ModeDescriptor& m : kModes) {
    if (m.name == key) return &m;
  }
  return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a mode: use ", ModeNames()));
}

void NormalizeMode(JobSpec* spec) {
  if (spec->mode() == lspo::v1::MODE_UNSPECIFIED) spec->set_mode(lspo::v1::MODE_LSP);
  if (spec->mode() == lspo::v1::MODE_GALORE && spec->galore().offload()) {
    spec->set_mode(lspo::v1::MODE_GALORE_OFFLOAD);
  }
  if (spec->mode() == lspo::v1::MODE_GALORE_OFFLOAD && spec->has_galore()) {
    spec->mutable_galore()->clear_offload();
  }
}

absl::Status CheckModeSettings(const JobSpec& spec) {
  if (!ModeKnown(spec.mode())) {
    return Bad("mode", runtime::EnumShortName(spec.mode()), absl::StrCat("use ", ModeNames()));
  }
  const ModeDescriptor& mode = ModeOf(spec);
  std::set<absl::string_view> blocks;
  for (const ModeDescriptor& m : kModes) {
    if (!m.settings_block.empty() && m.settings_block != "lsp") blocks.insert(m.settings_block);
  }
  for (absl::string_view block : blocks) {
    if (block == mode.settings_block || !BlockSet(spec, block)) continue;
    return Bad(block, "{...}",
               absl::StrCat("the ", block, " settings apply to mode ", block, " only, and mode is ",
                            mode.name, "; remove ", block, " or set mode: ", block));
  }
  if (mode.check != nullptr) RETURN_IF_ERROR(mode.check(spec));
  return absl::OkStatus();
}

std::vector<std::string> DropOtherModesSettings(const ModeDescriptor& mode, JobSpec* spec) {
  std::vector<std::string> dropped;
  const google::protobuf::Reflection* r = spec->GetReflection();
  for (const ModeDescriptor& m : kModes) {
    if (m.settings_block.empty() || m.settings_block == "lsp" ||
        m.settings_block == mode.settings_block ||
        absl::c_linear_search(dropped, m.settings_block)) {
      continue;
    }
    const google::protobuf::FieldDescriptor* f =
        JobSpec::descriptor()->FindFieldByName(std::string(m.settings_block));
    if (f == nullptr || !r->HasField(*spec, f)) continue;
    r->ClearField(spec, f);
    dropped.emplace_back(m.settings_block);
  }
  return dropped;
}

}  // namespace lspo::offload
