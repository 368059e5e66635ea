// How an offloaded training mode turns the worker's published gradients into its optimizer
// state on the CPU optimizer service: one UpdateRule per arena layout mode, chosen once at
// LoadJob (MakeUpdateRule) and called by the mode-independent parts of OptimizerCore (LoadJob,
// Update's loop of waits, verdicts and roll-back, the master-weight exports, checkpoints).
// It mirrors the worker's update paths (gpu_worker/update_path.h): each offloaded path there
// has its rule here, and the pair agrees on what crosses the arena.
//
// The rules (docs/architecture.md "Training modes"):
//   lsp             (lsp_rule.cc)             subspace Adam on S (d_p, d_q), the step D up; the
//                   master kept as s base + P (sum D) Q^T (optimizer_core.h).
//   zero            (zero_rule.cc)            AdamW on the full fp32 master from the bf16 G,
//                   the bf16 parameters up.
//   galore-offload  (galore_offload_rule.cc)  GaLore's Adam on its one-sided projection, the
//                   projector read from the arena with each refresh step's gradient; derives
//                   from the lsp rule, as GaloreOffloadPath derives from LspPath.
// A new offloaded mode is one file and one line in the registry of update_rule.cc.
//
// Shapes: m out features, n in features of W (m, n); d_p, d_q the subspace dims of P (m, d_p)
// and Q (n, d_q) (S, D (d_p, d_q)); r non-zeros per projector row.
//
// Thread-safety: called under OptimizerCore's mutex, like the OptimizerJob it works on.
#ifndef LSPO_CPU_OPTIMIZER_SERVICE_UPDATE_RULE_H_
#define LSPO_CPU_OPTIMIZER_SERVICE_UPDATE_RULE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lsp/adam.h"
#include "model/safetensors.h"
#include "offload/state_file.h"
#include "proto/arena.pb.h"
#include "proto/job_spec.pb.h"
#include "runtime/completion_flags.h"

namespace lspo::optimizer {

struct OptimizerJob;

// One matrix's gradient in the arena as the worker published it: exactly one pointer is set.
struct MatrixGradient {
  const float* fp32 = nullptr;     // lsp, galore-offload: S (d_p, d_q) fp32 (grad slot).
  const uint16_t* bf16 = nullptr;  // zero: G (m, n) bf16 bits (full_grad slot).
  int64_t n = 0;                   // Its element count.
};

// The worker's verdict on the step in progress (issue 43; runtime/completion_flags.h
// WaitVerdict): known at once under the serial schedule (the worker checked every gradient
// before the Update), awaited at most once under the overlap schedule.
class StepVerdict {
 public:
  // `flags` (not owned) of the job; `step` 1-based; `timeout` of the wait; `known`: true when
  // the verdict needs no wait (serial schedule).
  StepVerdict(const runtime::CompletionFlags* flags, uint32_t step, absl::Duration timeout,
              bool known)
      : flags_(flags), step_(step), timeout_(timeout), known_(known) {}

  bool known() const { return known_; }

  // Takes the verdict as known, without waiting, when the worker has published it already;
  // returns known().
  bool Peek();

  // Waits for the verdict (once: OK at once when it is known). OK: keep the step; kAborted:
  // the worker abandoned it; kDeadlineExceeded: no verdict within the timeout.
  absl::Status Await();

  // Seconds spent in Await.
  double seconds_waited() const { return waited_; }

 private:
  const runtime::CompletionFlags* flags_;
  uint32_t step_;
  absl::Duration timeout_;
  bool known_;
  double waited_ = 0;
};

// What one matrix's update needs of its step (built by OptimizerCore::Update).
struct StepInputs {
  uint32_t step = 0;     // 1-based optimizer step.
  double lr = 0;         // This step's learning rate (UpdateRequest.lr).
  lsp::AdamHyper hyper;  // lr (fp32), optim.beta1, beta2, eps, weight_decay; validated.
  float clip = 1.0f;     // Global-norm clip coefficient applied to every gradient (1 = none).
  StepVerdict* verdict = nullptr;  // Never null during Update.
};

// One offloaded mode's optimizer (interface; see the file comment). Linear indices i are those
// of the job's arena layout (0 <= i < layout.linears_size(); the core checks them).
class UpdateRule {
 public:
  virtual ~UpdateRule() = default;

  // The mode's name in checkpoint metadata (optimizer_state.safetensors "mode"): "lsp",
  // "zero" or "galore".
  virtual const char* name() const = 0;

  // LoadJob, once per matrix in layout order: takes over `w0`, the matrix's (slot.m, slot.n)
  // fp32 contiguous weight as loaded (the model's own tensor, not copied), and sets up its
  // state. Returns the bytes of that state, its fp32 master included.
  // Errors: kInvalidArgument (a slot this rule cannot use: a worker of another version).
  virtual absl::StatusOr<int64_t> AddMatrix(const lspo::v1::LinearSlot& slot, at::Tensor w0) = 0;

  // LoadJob's log words for the state, e.g. "subspace Adam over 12345 elements (lsp.d = 64)".
  virtual std::string Describe(const lspo::v1::ArenaLayout& layout) const = 0;

  // OptimizerCore::SetProjectors: reads the listed matrices' new projectors from the arena.
  // Default: kFailedPrecondition (the mode has no learned projectors).
  virtual absl::Status SetProjectors(OptimizerJob* job, const std::vector<int>& indices);

  // Update's check of a task before anything is waited for. Errors: kFailedPrecondition when
  // matrix i cannot step yet (lsp: before SetProjectors). Default: OK.
  virtual absl::Status CheckReady(const OptimizerJob& job, int i) const { return absl::OkStatus(); }

  // Matrix i's gradient slot in the job's arena (published or not: the core waits first).
  // Errors: kOutOfRange (a slot outside the arena).
  virtual absl::StatusOr<MatrixGradient> Gradient(const OptimizerJob& job, int i) const = 0;

  // The squared norm that global-norm clipping counts for matrix i, given `sum_sq`, the sum
  // of squares of its published (finite) gradient. Default: sum_sq. Errors: kInvalidArgument
  // (a non-finite norm the worker published).
  virtual absl::StatusOr<double> NormSquared(const OptimizerJob& job, int i, double sum_sq) const {
    return sum_sq;
  }

  // True when, with every gradient in before the first update (clipping, serial schedule),
  // Update waits for the verdict before updating instead of keeping undo records (zero: they
  // would copy the whole state). Default: false.
  virtual bool AwaitVerdictBeforeUpdates() const { return false; }

  // Updates matrix i from its finite gradient `g` (g * in.clip) for step in.step, writes its
  // update into the arena's up slot (the core publishes the flag) and, unless the verdict is
  // known, keeps what RollBack needs. May wait for the verdict (in.verdict->Await).
  // Errors (the core then calls RollBack): the verdict's kAborted / kDeadlineExceeded,
  // kInvalidArgument (Adam's checks), kDataLoss (a malformed arena slot), kOutOfRange,
  // kInternal (LibTorch).
  virtual absl::Status UpdateMatrix(OptimizerJob* job, int i, const MatrixGradient& g,
                                    const StepInputs& in) = 0;

  // Restores every matrix UpdateMatrix changed since the last EndStep to its state before
  // (bitwise: master, moments, step counter, projectors).
  virtual void RollBack() = 0;

  // Ends Update (whatever its outcome): drops the records RollBack would have used.
  virtual void EndStep() = 0;

  // Writes matrix i's master weight W into `out` ((m, n) fp32, contiguous; may be a view, e.g.
  // of the arena's staging region).
  // LibTorch errors throw (callers run under offload::TorchCall).
  virtual void WriteMasterWeight(int i, at::Tensor out) const = 0;

  // The same, as a new (m, n) fp32 tensor. LibTorch errors throw.
  at::Tensor MasterWeight(int i, const lspo::v1::LinearSlot& slot) const;

  // ExportLayerWeights' precondition. Default OK; zero: kFailedPrecondition.
  virtual absl::Status CheckLayerExport() const { return absl::OkStatus(); }

  // SaveState: appends every matrix's tensors (named after its slot's HF name; see
  // OptimizerCore::SaveState) to `tensors`, aliasing the state (no copy). LibTorch errors throw.
  virtual void AppendState(const lspo::v1::ArenaLayout& layout, offload::NamedTensors* tensors) = 0;

  // LoadState: reads and validates every matrix's tensors from `file` (named `what` in
  // messages), changing nothing; returns the commit that installs them (it views `file`: run
  // it while `file` lives). Errors: kNotFound (a missing tensor), kDataLoss (shape, dtype,
  // non-finite, negative v or step; naming the tensor). LibTorch errors throw.
  using Commit = std::function<absl::Status()>;
  virtual absl::StatusOr<Commit> ReadState(const lspo::v1::ArenaLayout& layout,
                                           const model::SafetensorsFile& file,
                                           const std::string& what) = 0;
};

// The rule of an arena layout's mode (the registry in update_rule.cc): MODE_LSP -> lsp,
// MODE_ZERO -> zero, MODE_GALORE_OFFLOAD -> galore-offload.
// Errors: kInvalidArgument for a mode without one (not offloaded), naming it.
absl::StatusOr<std::unique_ptr<UpdateRule>> MakeUpdateRule(lspo::v1::TrainingMode mode);

// A matrix's Adam state in a checkpoint: views into the mapped file.
struct SavedAdamState {
  at::Tensor master;  // (m, n) fp32
  at::Tensor m, v;    // (moment_shape) fp32, v >= 0
  int64_t step = 0;   // >= 0
};

// Reads NAME.master (slot.m, slot.n), NAME.adam_m, NAME.adam_v (moment_shape) and
// NAME.adam_step () int64, NAME = slot.name(), from `file` (named `what` in messages).
// Errors: kNotFound, kDataLoss (as offload::ViewStateTensor; a negative step or second
// moment). LibTorch errors throw.
absl::StatusOr<SavedAdamState> ReadSavedAdamState(const model::SafetensorsFile& file,
                                                  const std::string& what,
                                                  const lspo::v1::LinearSlot& slot,
                                                  const std::vector<int64_t>& moment_shape);

}  // namespace lspo::optimizer

#endif  // LSPO_CPU_OPTIMIZER_SERVICE_UPDATE_RULE_H_
