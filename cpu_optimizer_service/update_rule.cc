// Shapes as in cpu_optimizer_service/update_rule.h.
#include "cpu_optimizer_service/update_rule.h"

#include "absl/strings/str_cat.h"
#include "offload/state_file.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"

namespace lspo::optimizer {

// Each rule's factory, defined in its own file.
std::unique_ptr<UpdateRule> MakeLspRule();            // lsp_rule.cc
std::unique_ptr<UpdateRule> MakeZeroRule();           // zero_rule.cc
std::unique_ptr<UpdateRule> MakeGaloreOffloadRule();  // galore_offload_rule.cc

namespace {

// The registry: the arena layout's mode -> its rule. A new offloaded mode is one line here
// (and its file).
struct Registration {
  lspo::v1::TrainingMode mode;
  std::unique_ptr<UpdateRule> (*make)();
};
constexpr Registration kRegistry[] = {
    {lspo::v1::MODE_LSP, &MakeLspRule},
    {lspo::v1::MODE_ZERO, &MakeZeroRule},
    {lspo::v1::MODE_GALORE_OFFLOAD, &MakeGaloreOffloadRule},
};

}  // namespace

absl::StatusOr<std::unique_ptr<UpdateRule>> MakeUpdateRule(lspo::v1::TrainingMode mode) {
  for (const Registration& r : kRegistry) {
    if (r.mode == mode) return r.make();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the arena layout's mode ", lspo::v1::TrainingMode_Name(mode),
                   " has no update rule on this optimizer: only the offloaded modes (lsp, zero, "
                   "galore-offload) use the optimizer service"));
}

bool StepVerdict::Peek() {
  if (!known_ && flags_->verdict_seq() >= step_) known_ = true;
  return known_;
}

absl::Status StepVerdict::Await() {
  if (known_) return absl::OkStatus();
  const double t0 = runtime::MonotonicSeconds();
  absl::Status st = flags_->WaitVerdict(step_, timeout_);
  waited_ += runtime::MonotonicSeconds() - t0;
  known_ = st.ok();
  return st;
}

absl::Status UpdateRule::SetProjectors(OptimizerJob* job, const std::vector<int>& indices) {
  return absl::FailedPreconditionError("SetProjectors needs MODE_LSP");
}

at::Tensor UpdateRule::MasterWeight(int i, const lspo::v1::LinearSlot& slot) const {
  at::Tensor w = at::empty({slot.m(), slot.n()}, at::kFloat);  // (m, n) fp32
  WriteMasterWeight(i, w);
  return w;
}

absl::StatusOr<SavedAdamState> ReadSavedAdamState(const model::SafetensorsFile& file,
                                                  const std::string& what,
                                                  const lspo::v1::LinearSlot& slot,
                                                  const std::vector<int64_t>& moment_shape) {
  const std::string& name = slot.name();
  SavedAdamState s;
  ASSIGN_OR_RETURN(s.master, offload::ViewStateTensor(file, what, name + ".master", at::kFloat,
                                                      {slot.m(), slot.n()}));
  ASSIGN_OR_RETURN(
      s.m, offload::ViewStateTensor(file, what, name + ".adam_m", at::kFloat, moment_shape));
  ASSIGN_OR_RETURN(
      s.v, offload::ViewStateTensor(file, what, name + ".adam_v", at::kFloat, moment_shape));
  // () int64
  ASSIGN_OR_RETURN(at::Tensor step,
                   offload::ReadStateTensor(file, what, name + ".adam_step", at::kLong, {}));
  s.step = step.item<int64_t>();
  if (s.step < 0 || (s.v < 0).any().item<bool>()) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", name, " has a negative Adam step or second moment"));
  }
  return s;
}

}  // namespace lspo::optimizer
