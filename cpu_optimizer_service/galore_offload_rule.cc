// The GaLore-Offload update rule (arena layout mode MODE_GALORE_OFFLOAD; the
// optimizer's half of gpu_worker/galore_offload_path.cc): the lsp rule's state and arena slots
// (lsp_rule.h) with GaLore's one-sided dense projection of rank r (offload/arena_layout.h
// BuildGaloreArenaLayout) and GaLore's form of Adam (baselines/galore.h):
//   * no SetProjectors: the worker writes each new projector into the arena with the gradient
//     of its refresh step; before that matrix's Adam step the rule sees it changed, folds the
//     old subspace's steps into the master's base and starts a new zero sum, keeping the Adam
//     moments as they are (galore-torch keeps them);
//   * clipping counts |G|_F^2 of the full gradient (the slot grad_sq), not |S|^2;
//   * the subspace step is galore-torch's AdamW step (GaloreHyper below).
// Shapes: as lsp_rule.h, with r here GaLore's rank: for m >= n P is the identity (m, m) and Q
// dense (n, r), S (m, r); for m < n P dense (m, r), Q the identity (n, n), S (r, n).
// Internal to cpu_optimizer_service/.
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cpu_optimizer_service/lsp_rule.h"
#include "cpu_optimizer_service/optimizer_job.h"
#include "offload/arena_layout.h"
#include "offload/arena_tensors.h"
#include "offload/torch_call.h"
#include "runtime/status_macros.h"

namespace lspo::optimizer {

namespace {

// True when the projector a worker wrote into `value` (its value slot) differs from `held`
// (or nothing is held yet): GaLore-Offload's refresh signal. Compares the bytes, without a copy.
// held.value: (rows, r) fp32 on the CPU (a copy read from the arena or a checkpoint).
absl::StatusOr<bool> ProjectorChanged(const runtime::ShmArena& arena,
                                      const lspo::v1::TensorRef& value,
                                      const lsp::SparseProjector& held) {
  const int64_t n = offload::Numel(value);
  ASSIGN_OR_RETURN(const float* now, arena.At<float>(value.offset(), n));
  if (held.rows == 0 || held.value.numel() != n) return true;
  return std::memcmp(now, held.value.data_ptr<float>(), static_cast<size_t>(n) * 4) != 0;
}

// The subspace-Adam hyper-parameters that give galore-torch's AdamW step (baselines/galore.h)
// at Adam step t (1-based, after the increment), from the job's `base` (lr = this step's lr):
//   galore-torch: W <- (W - lr sqrt(bc2)/bc1 * scale * back(m / (sqrt(v) + eps))) (1 - lr wd)
//   SubspaceAdam: D = -lr' m_hat / (sqrt(v_hat) + eps') = -lr' sqrt(bc2)/bc1 m / (sqrt(v) +
//                 eps' sqrt(bc2)),  with bc1 = 1 - b1^t, bc2 = 1 - b2^t,
// so eps' = eps / sqrt(bc2) and lr' = lr scale (1 - lr wd); the master and the worker apply the
// decay (1 - lr wd) to W before adding P D Q^T (LspRule::UpdateMatrix, LspPath::WorkerDecay),
// which completes the product. scale: galore.scale (0 = 0.25, proto/job_spec.proto).
lsp::AdamHyper GaloreHyper(const lspo::v1::JobSpec& spec, const lsp::AdamHyper& base, double lr,
                           int64_t t) {
  const double scale = spec.galore().scale() > 0 ? spec.galore().scale() : 0.25;
  const double bc2 = 1.0 - std::pow(static_cast<double>(base.beta2), static_cast<double>(t));
  lsp::AdamHyper h = base;
  h.eps = static_cast<float>(static_cast<double>(base.eps) / std::sqrt(bc2));
  h.lr = static_cast<float>(lr * scale * (1.0 - lr * spec.optim().weight_decay()));
  return h;
}

// The GaLore-Offload rule (see the file comment).
class GaloreOffloadRule final : public LspRule {
 public:
  const char* name() const override { return "galore"; }

  std::string Describe(const lspo::v1::ArenaLayout& layout) const override {
    return absl::StrCat("GaLore-Offload Adam over ", subspace_elements_,
                        " elements (galore.rank = ", layout.d(), ")");
  }

  absl::Status SetProjectors(OptimizerJob* job, const std::vector<int>& indices) override {
    return absl::FailedPreconditionError(
        "SetProjectors needs MODE_LSP: GaLore-Offload reads each projector from the arena with "
        "the gradient of its refresh step");
  }

  // No fit: the first step's gradient comes with the first projector.
  absl::Status CheckReady(const OptimizerJob& job, int i) const override {
    return absl::OkStatus();
  }

  // |G|_F^2 of the full gradient, from the grad_sq slot: clipping is GaLore's, of G.
  absl::StatusOr<double> NormSquared(const OptimizerJob& job, int i, double sum_sq) const override {
    const auto& slot = job.layout.linears(i);
    ASSIGN_OR_RETURN(const float* sq, job.arena.At<float>(slot.grad_sq().offset(), 1));
    if (!std::isfinite(*sq) || *sq < 0) {
      return lsp::NonFiniteError(absl::StrCat(slot.name(), " (|G|^2)"), 0, 1, *sq);
    }
    return static_cast<double>(*sq);
  }

 protected:
  // A new projector came with this gradient (a refresh step): fold the old subspace's steps
  // into the base, keep the moments as they are (galore-torch does), start a new sum (new
  // tensors: the undo record keeps the old ones). Then GaLore's hyper-parameters.
  absl::StatusOr<lsp::AdamHyper> BeforeStep(OptimizerJob* job, int i,
                                            const StepInputs& in) override {
    RETURN_IF_ERROR(RefreshProjector(job, i));
    return GaloreHyper(job->spec, in.hyper, in.lr, matrices_[i].adam->step() + 1);
  }

 private:
  // Matrix i, before its Adam step: when the worker wrote a new projector with this gradient,
  // folds the old subspace's steps into the master's base (base + P (sum D) Q^T, a new
  // tensor), starts a new zero sum and installs the new projectors.
  // Errors: kDataLoss (a malformed projector in the arena), LibTorch errors.
  absl::Status RefreshProjector(OptimizerJob* job, int i) {
    const auto& slot = job->layout.linears(i);
    Matrix& st = matrices_[i];
    ASSIGN_OR_RETURN(const bool p_changed, ProjectorChanged(job->arena, slot.p_value(), st.p));
    ASSIGN_OR_RETURN(const bool q_changed, ProjectorChanged(job->arena, slot.q_value(), st.q));
    if (!p_changed && !q_changed) return absl::OkStatus();
    return offload::TorchCall("galore projector refresh", [&]() -> absl::Status {
      at::NoGradGuard no_grad;
      ASSIGN_OR_RETURN(lsp::SparseProjector p, offload::ReadProjector(job->arena, slot.p_index(),
                                                                      slot.p_value(), slot.d_p()));
      ASSIGN_OR_RETURN(lsp::SparseProjector q, offload::ReadProjector(job->arena, slot.q_index(),
                                                                      slot.q_value(), slot.d_q()));
      if (!(p.identity || p.dense) || !(q.identity || q.dense) ||
          !at::isfinite(p.value).all().item<bool>() || !at::isfinite(q.value).all().item<bool>()) {
        return absl::DataLossError(absl::StrCat(
            "GaLore-Offload: the projector of ", slot.name(),
            " in the arena is not a finite dense / identity pair (a worker of another version?)"));
      }
      if (st.p.rows > 0 || st.base_scale != 1.0) {
        at::Tensor w = at::empty_like(st.base, at::MemoryFormat::Contiguous);  // (m, n) fp32
        WriteMasterWeight(i, w);
        st.base = w;
      }
      st.base_scale = 1.0;
      st.sum_d = at::zeros_like(st.sum_d);
      st.p = std::move(p);
      st.q = std::move(q);
      return absl::OkStatus();
    });
  }
};

}  // namespace

std::unique_ptr<UpdateRule> MakeGaloreOffloadRule() {
  return std::make_unique<GaloreOffloadRule>();
}

}  // namespace lspo::optimizer
