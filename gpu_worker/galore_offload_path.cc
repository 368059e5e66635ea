// MODE_GALORE with galore.offload (GaLore-Offload; docs/baselines.md "GaLore"): GaLore's
// projected AdamW (baselines/galore.h) split as lsp mode splits LSP. The linears compute
// densely and each matrix's full gradient G (m, n) forms on the worker; the worker projects it
// with GaLore's rank-r projector, one-sided and dense, and publishes
//   m >= n (right):  S = G B^T (m, r)    (P = identity, Q = B^T (n, r) dense)
//   m <  n (left):   S = A^T G (r, n)    (P = A (m, r) dense, Q = identity)
// and |G|_F^2 (for clipping G as GaLore does) through the arena; the CPU optimizer service runs
// GaLore's Adam on S with fp32 master weights (cpu_optimizer_service/optimizer_core.h) and
// returns the step D of S's shape, which lands as W <- (1 - lr wd) W + P D Q^T exactly as in
// lsp mode (LspPath::Land; compensated into 16-bit weights). The projector is recomputed from
// the step's G (fp32 SVD, canonical signs: GaloreProjector) at job steps 1, 1 + gap, 1 + 2 gap,
// ... and written into the arena with that gradient; the optimizer sees the new projector,
// folds the old subspace's steps into its master and keeps the moments. What crosses the
// arena per step: S and D (4 r max(m, n) bytes each way per matrix) and, at a refresh, the
// projector (4 r min(m, n) bytes, plus its int32 positions).
//
// One difference from the worker-side mode: the refresh schedule counts job steps, where
// GaloreAdamW counts the steps that updated (galore-torch's per-parameter step); they differ
// only after a step skipped for a non-finite gradient. Internal to gpu_worker/.
//
// Shapes: W and G (m, n), m out features, n in features; r GaLore's rank (galore.rank), not
// lsp's non-zeros per projector row; S and D (m, r) when m >= n, (r, n) when m < n, fp32.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "offload/training_mode.h"
#include "third_party/torch/torch_api.h"

#include "absl/strings/str_cat.h"
#include "baselines/galore.h"
#include "glog/logging.h"
#include "gpu_worker/lsp_path.h"
#include "gpu_worker/worker_job.h"
#include "offload/arena_layout.h"
#include "offload/torch_call.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

namespace {

// The GaLore-Offload update path (see the file comment).
class GaloreOffloadPath final : public LspPath {
 public:
  const char* name() const override { return "galore"; }

  // No fit: the first step computes every projector from its own gradient.
  absl::Status CheckReady(const WorkerJob& job) const override { return absl::OkStatus(); }

  void ZeroGrads(WorkerJob* job) override {
    job->model->ZeroLinearGrads();
    std::fill(projected_.begin(), projected_.end(), 0u);
  }

  // The worker holds the projectors (the optimizer holds the master weights and moments):
  // 4 r min(m, n) bytes per matrix, the dense side's values.
  int64_t OptimizerStateBytes(const WorkerJob& job) const override {
    int64_t bytes = 0;
    for (const auto& l : job.linears) bytes += 4 * rank_ * std::min(l.m, l.n);
    return bytes;
  }

  absl::Status SaveState(WorkerJob* job, const std::string& dir, offload::NamedTensors* tensors,
                         std::map<std::string, std::string>* metadata,
                         lspo::v1::StateReply* reply) override {
    // "fitted" (every projector present) unless a skipped first step left some unset.
    fitted_ =
        std::all_of(p_.begin(), p_.end(), [](const lsp::SparseProjector& p) { return p.rows > 0; });
    return LspPath::SaveState(job, dir, tensors, metadata, reply);
  }

 private:
  absl::StatusOr<lspo::v1::ArenaLayout> BuildLayout(const WorkerJob& job) override {
    rank_ = job.spec.galore().rank() > 0 ? job.spec.galore().rank() : 128;
    gap_ = job.spec.galore().update_proj_gap() > 0 ? job.spec.galore().update_proj_gap() : 200;
    // The mode's one layout builder, the planner's too (offload/training_mode.h).
    absl::StatusOr<lspo::v1::ArenaLayout> layout = offload::ModeOf(job.spec).layout(
        job.linears, model::kLinearsPerLayer, job.spec, runtime::ShmArena::UniqueName(job.id));
    if (!layout.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("job spec field ", layout.status().message()));
    }
    return layout;
  }

  absl::Status AttachGradients(WorkerJob* job) override {
    const size_t n = job->linears.size();
    p_.assign(n, lsp::SparseProjector());
    q_.assign(n, lsp::SparseProjector());
    projected_.assign(n, 0u);
    s_accum_.resize(n);
    RETURN_IF_ERROR(offload::TorchCall("allocating the S buffers", [&]() -> absl::Status {
      for (size_t i = 0; i < n; ++i) {
        const auto& slot = job->plane.layout.linears(static_cast<int>(i));
        // S (d_p, d_q) = (m, r) or (r, n), fp32 on the job's device.
        s_accum_[i] = at::zeros({slot.d_p(), slot.d_q()},
                                at::TensorOptions().dtype(at::kFloat).device(job->device));
      }
      return absl::OkStatus();
    }));
    auto& model = *job->model;
    model.SetLinearMode(model::LinearMode::kDense);
    for (int64_t i = 0; i < model.num_linears(); ++i) {
      // Overlap schedule: fires with the last micro-batch's gradient before it is accumulated
      // into W.grad(), so acc + g is the step's G.
      // (m, n), W's dtype
      model.LinearWeight(i).register_hook([this, job, i](const at::Tensor& g) {
        if (job->progress.publish_step > 0 && !job->progress.publish_failed) {
          const at::Tensor& acc = job->model->LinearWeight(i).grad();  // (m, n) or undefined
          Project(job, i, acc.defined() ? acc + g : g, job->progress.publish_step);
          PublishGradient(job, i, s_accum_[i], job->progress.publish_step);
        }
        return g;
      });
    }
    return absl::OkStatus();
  }

  // Serial schedule: S of the step's accumulated G (projected once per step).
  at::Tensor Gradient(WorkerJob* job, int64_t i) override {
    const at::Tensor& g = job->model->LinearWeight(i).grad();  // G (m, n), W's dtype
    if (!g.defined()) return at::Tensor();
    if (projected_[i] != job->progress.step) Project(job, i, g, job->progress.step);
    return s_accum_[i];
  }

  // Linear i's S of gradient G (m, n) for `step` into s_accum_[i] and |G|_F^2 into its arena
  // slot, after a projector refresh when the step calls for one (or none was set yet). A
  // non-finite G makes S NaN (the schedules then skip the step) and refreshes nothing.
  void Project(WorkerJob* job, int64_t i, const at::Tensor& G, uint32_t step) {
    at::NoGradGuard no_grad;
    projected_[i] = step;
    const at::Tensor g = G.to(at::kFloat);  // (m, n) fp32
    const double sq = g.square().sum().item<double>();
    if (!std::isfinite(sq)) {
      s_accum_[i].fill_(std::numeric_limits<float>::quiet_NaN());
      return;
    }
    const auto& slot = job->plane.layout.linears(static_cast<int>(i));
    absl::StatusOr<float*> sq_slot = job->plane.arena.At<float>(slot.grad_sq().offset(), 1);
    CHECK(sq_slot.ok()) << sq_slot.status();  // The layout was validated at LoadJob.
    **sq_slot = static_cast<float>(sq);
    const bool right =
        baselines::GaloreSideOf(g.size(0), g.size(1)) == baselines::GaloreSide::kRight;
    if (p_[i].rows == 0 || (step - 1) % static_cast<uint32_t>(gap_) == 0) {
      absl::Status st = Refresh(job, i, g, right);
      if (!st.ok()) {
        LOG(ERROR) << "worker: GaLore projector of " << job->linears[i].name << " at step " << step
                   << ": " << st << "; step skipped";
        s_accum_[i].fill_(std::numeric_limits<float>::quiet_NaN());
        return;
      }
    }
    // S = P^T G Q with one side the identity: G B^T (m, r) or A^T G (r, n).
    if (right) {
      at::mm_out(s_accum_[i], g, q_[i].value);
    } else {
      at::mm_out(s_accum_[i], p_[i].value.t(), g);
    }
  }

  // The rank-r projector of G (baselines::GaloreProjector), installed on this side, in the
  // model and in the arena (where the optimizer reads it with this step's S). g: G (m, n) fp32.
  absl::Status Refresh(WorkerJob* job, int64_t i, const at::Tensor& g, bool right) {
    return offload::TorchCall("galore projector", [&]() -> absl::Status {
      // B (r, n) or A (m, r) fp32
      ASSIGN_OR_RETURN(at::Tensor proj, baselines::GaloreProjector(g, rank_));
      ASSIGN_OR_RETURN(lsp::SparseProjector dense,
                       lsp::SparseProjector::FromDense(right ? proj.t() : proj));
      ASSIGN_OR_RETURN(lsp::SparseProjector id,
                       lsp::SparseProjector::Identity(right ? g.size(0) : g.size(1)));
      id = id.To(job->device);
      if (right) return InstallProjectors(job, i, std::move(id), std::move(dense));
      return InstallProjectors(job, i, std::move(dense), std::move(id));
    });
  }

  int64_t rank_ = 128;
  int64_t gap_ = 200;
  std::vector<uint32_t> projected_;  // Per linear: the step whose S s_accum_ holds (0 = none).
};

}  // namespace

std::unique_ptr<UpdatePath> MakeGaloreOffloadPath() {
  return std::make_unique<GaloreOffloadPath>();
}

}  // namespace lspo::worker
