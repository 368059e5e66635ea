// Shapes as in gpu_worker/offload_path.h.
#include "gpu_worker/offload_path.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gpu_worker/device_offload.h"
#include "gpu_worker/worker_job.h"
#include "offload/arena_tensors.h"
#include "offload/collective.h"
#include "offload/overlap_reducer.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

using runtime::MonotonicSeconds;

namespace {

// How long the worker waits for an update (or the optimizer for a gradient) before deciding
// its peer is gone.
constexpr absl::Duration kPeerTimeout = absl::Minutes(10);

}  // namespace

absl::Status OffloadPath::Setup(WorkerJob* job, lspo::v1::LoadJobReply* reply) {
  ASSIGN_OR_RETURN(job->plane.layout, BuildLayout(*job));
  ASSIGN_OR_RETURN(job->plane.arena,
                   runtime::ShmArena::Create(job->plane.layout.name(), job->plane.layout.bytes()));
  ASSIGN_OR_RETURN(job->plane.flags, offload::ArenaFlags(job->plane.arena, job->plane.layout));
  RETURN_IF_ERROR(AttachGradients(job));
  *reply->mutable_arena() = job->plane.layout;
  if (job->cuda) {
    ASSIGN_OR_RETURN(job->plane.engine,
                     DeviceOffload::Create(job->plane.arena.data(), job->plane.arena.size(),
                                           MaxUploadBytes(*job), job->device));
  }
  return absl::OkStatus();
}

bool OffloadPath::PublishGradient(WorkerJob* job, int64_t i, const at::Tensor& formed,
                                  uint32_t step) {
  at::Tensor faulty;  // formed's shape and dtype, all NaN
  if (job->faults.nonfinite_linear.count({static_cast<int>(step), i}) > 0) {
    faulty = formed * std::numeric_limits<float>::quiet_NaN();  // Fault injection (tests).
  }
  const at::Tensor& grad = faulty.defined() ? faulty : formed;  // S (d_p, d_q) fp32 or G (m, n)
  if (job->ranks.reducer != nullptr) {
    // Data parallel, overlap schedule: the reducer's thread sums it across the ranks and
    // publishes the sum (PublishHostGradient), checking that sum.
    job->ranks.reducer->Stage(i, grad);
    return true;
  }
  const double t0 = MonotonicSeconds();
  const int64_t layer = i / model::kLinearsPerLayer;
  if (job->cuda) {
    // Asynchronous: a copy of the gradient (so later in-place accumulation cannot race the
    // copy) goes to the pinned arena on the d2h stream with a device-side finiteness verdict;
    // once both have landed (watcher thread) the flag is published. No host wait here.
    absl::StatusOr<at::Tensor> dst = GradientSlot(*job, i);
    CHECK(dst.ok()) << dst.status();        // The layout was validated at LoadJob.
    at::Tensor src = DeviceSnapshot(grad);  // grad's shape, the slot's dtype, on the device
    at::Tensor host = *dst;                 // the arena slot: (d_p, d_q) fp32 or (m, n) bf16
    CHECK_EQ(src.nbytes(), host.nbytes()) << job->linears[i].name << ": gradient vs arena slot";
    absl::Status st = job->plane.engine->OffloadAsync(
        layer, std::move(src), host.data_ptr(), [job, i, step, layer, t0](bool finite) {
          if (!finite) {
            LOG(WARNING) << "worker: non-finite gradient for " << job->linears[i].name
                         << " at step " << step << "; step skipped";
            job->plane.flags.Abort(step);
            job->progress.publish_failed = true;
            return;
          }
          job->plane.flags.PublishGrad(i, step);
          const double t1 = MonotonicSeconds();
          job->times.offload_done[layer] = t1;
          job->times.offload_secs[layer] = std::max(job->times.offload_secs[layer], t1 - t0);
        });
    if (!st.ok()) {
      LOG(ERROR) << "worker: offloading " << job->linears[i].name << ": " << st;
      job->plane.flags.Abort(step);
      job->progress.publish_failed = true;
      return false;
    }
    job->times.offload_seconds += MonotonicSeconds() - t0;
    return true;
  }
  return PublishHostGradient(job, i, grad, step);
}

bool OffloadPath::PublishHostGradient(WorkerJob* job, int64_t i, const at::Tensor& grad,
                                      uint32_t step) {
  const double t0 = MonotonicSeconds();
  const int64_t layer = i / model::kLinearsPerLayer;
  if (!at::isfinite(grad).all().item<bool>()) {
    LOG(WARNING) << "worker: non-finite gradient for " << job->linears[i].name << " at step "
                 << step << "; step skipped";
    job->plane.flags.Abort(step);
    job->progress.publish_failed = true;
    return false;
  }
  absl::StatusOr<at::Tensor> dst = GradientSlot(*job, i);
  CHECK(dst.ok()) << dst.status();  // The layout was validated at LoadJob.
  dst->copy_(grad);
  job->plane.flags.PublishGrad(i, step);
  const double t1 = MonotonicSeconds();
  job->times.offload_seconds += t1 - t0;
  job->times.offload_done[layer] = t1;
  job->times.offload_secs[layer] += t1 - t0;
  return true;
}

int64_t OffloadPath::OffloadBytesPerStep(const WorkerJob& job) const {
  auto bytes = [](const lspo::v1::TensorRef& t) -> int64_t {
    int64_t n = t.dtype() == lspo::v1::BF16 ? 2 : 4;  // F32, I32: 4 bytes
    for (int64_t d : t.shape()) n *= d;
    return t.shape().empty() ? 0 : n;
  };
  int64_t total = 0;
  for (const auto& slot : job.plane.layout.linears()) {
    total +=
        bytes(slot.grad()) + bytes(slot.step()) + bytes(slot.full_grad()) + bytes(slot.param());
  }
  return total;
}

absl::Status OffloadPath::ApplyUpdate(WorkerJob* job, int64_t i, uint32_t step, double decay) {
  const double t0 = MonotonicSeconds();
  absl::Status st = job->plane.flags.WaitStep(i, step, kPeerTimeout);
  if (!st.ok()) {
    return absl::Status(
        st.code(), absl::StrCat("optimizer update of ", job->linears[i].name, ": ", st.message()));
  }
  const double t1 = MonotonicSeconds();
  job->times.wait_seconds += t1 - t0;
  at::NoGradGuard no_grad;
  // CUDA: the apply's device time, after the host's wait for the update (StepMetrics
  // device_phase_seconds["apply"], "gpu" spans of the timeline).
  const int64_t layer = i / model::kLinearsPerLayer;
  if (job->plane.engine) job->plane.engine->MarkComputeBegin(layer, "apply");
  RETURN_IF_ERROR(Land(job, i, step, job->model->LinearWeight(i), decay));
  if (job->plane.engine) job->plane.engine->MarkComputeEnd(layer, "apply");
  job->times.offload_seconds += MonotonicSeconds() - t1;
  return absl::OkStatus();
}

absl::Status OffloadPath::FinishStep(WorkerJob* job, const StepContext& ctx,
                                     lspo::v1::TrainStepReply* reply) {
  const size_t n = job->linears.size();
  if (!ctx.overlap && ctx.collective != nullptr && ctx.collective->world_size() > 1) {
    // Serial schedule, data parallel: first sum every gradient across the ranks (on the host;
    // a CUDA worker's sums come back to the device), then publish as one rank does.
    bool missing = false;
    RETURN_IF_ERROR(SumAcrossRanks(job, ctx.collective, &missing));
    if (missing) {
      LOG(WARNING) << "worker: a rank formed no gradient for some matrix at step " << ctx.step
                   << "; step skipped on every rank";
      reply->set_nonfinite(true);
      return absl::OkStatus();
    }
  }
  if (!ctx.overlap && job->cuda) {
    // Serial schedule on CUDA: publish all (asynchronous copies, checked on the host copies
    // as they land), then wait for the verdict.
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor g = Gradient(job, static_cast<int64_t>(i));  // S (d_p, d_q) fp32 or G (m, n)
      if (!g.defined()) {
        LOG(WARNING) << "worker: missing gradient for " << job->linears[i].name << " at step "
                     << ctx.step << "; step skipped";
        reply->set_nonfinite(true);
        return absl::OkStatus();
      }
      PublishGradient(job, static_cast<int64_t>(i), g, ctx.step);
    }
    job->plane.engine->Drain();
    if (job->progress.publish_failed) reply->set_nonfinite(true);
    return absl::OkStatus();
  }
  if (!ctx.overlap) {
    // Serial schedule on the CPU: check every gradient, then publish them all.
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor g = Gradient(job, static_cast<int64_t>(i));  // S (d_p, d_q) fp32 or G (m, n)
      if (!g.defined() || !at::isfinite(g).all().item<bool>()) {
        LOG(WARNING) << "worker: non-finite or missing gradient for " << job->linears[i].name
                     << " at step " << ctx.step << "; step skipped";
        reply->set_nonfinite(true);
        return absl::OkStatus();
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (!PublishGradient(job, static_cast<int64_t>(i), Gradient(job, static_cast<int64_t>(i)),
                           ctx.step)) {
        reply->set_nonfinite(true);  // The optimizer has not started: nothing to undo.
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }
  // Overlap schedule (the gradients were published during the backward): layers >= split are
  // applied now, as their updates arrive (deepest first: that is the order the optimizer
  // finishes them); shallower layers just before their next forward.
  const double decay = WorkerDecay(job->spec, ctx.lr);
  for (size_t i = 0; i < n; ++i) {
    job->plane.pending_step[i] = ctx.step;
    job->plane.pending_decay[i] = decay;
  }
  const int64_t num_layers = job->model->config().num_layers;
  for (int64_t l = num_layers - 1; l >= ctx.split_layer; --l) {
    RETURN_IF_ERROR(ApplyPending(job, l));
  }
  return absl::OkStatus();
}

absl::Status OffloadPath::BeginRankSum(WorkerJob* job, offload::Collective* group, uint32_t step) {
  // On CUDA, Stage copies each S (or gradient) from the device into its host bucket on the
  // compute stream: the backward waits for that copy, and the sum goes to the arena from the
  // host (PublishHostGradient), as on the CPU.
  const size_t n = job->linears.size();
  std::vector<std::vector<int64_t>> shapes(n);
  for (size_t i = 0; i < n; ++i) {
    ASSIGN_OR_RETURN(at::Tensor slot, GradientSlot(*job, static_cast<int64_t>(i)));  // host slot
    shapes[i] = slot.sizes().vec();
  }
  job->ranks.reducer = std::make_unique<offload::OverlapReducer>(
      group, std::move(shapes), [this, job, step](int64_t i, const at::Tensor& sum) {
        return PublishHostGradient(job, i, sum, step);
      });
  return absl::OkStatus();
}

absl::Status OffloadPath::EndRankSum(WorkerJob* job) {
  if (job->ranks.reducer == nullptr) return absl::OkStatus();
  // A matrix this rank formed no gradient for goes as NaN: every rank's sum is then NaN, and
  // every rank skips the step (as SumAcrossRanks' missing count does in the serial schedule).
  const double t0 = MonotonicSeconds();
  absl::Status st = job->ranks.reducer->Finish(std::numeric_limits<float>::quiet_NaN());
  job->times.rank_sum_wait_seconds += MonotonicSeconds() - t0;
  job->times.rank_sum_hidden_seconds += job->ranks.reducer->collective_seconds();
  job->ranks.reducer.reset();
  return st;
}

absl::Status OffloadPath::SumAcrossRanks(WorkerJob* job, offload::Collective* group,
                                         bool* missing) {
  // One fp32 all-reduce of every gradient, as its arena slot holds it; a missing gradient
  // goes as zeros and is counted, so that every rank skips the step together.
  const size_t n = job->linears.size();
  std::vector<at::Tensor> grads(n);  // per linear: S (d_p, d_q) fp32 or G (m, n)
  std::vector<int64_t> numels(n);
  for (size_t i = 0; i < n; ++i) {
    grads[i] = Gradient(job, static_cast<int64_t>(i));
    ASSIGN_OR_RETURN(at::Tensor slot, GradientSlot(*job, static_cast<int64_t>(i)));  // host slot
    numels[i] = slot.numel();
  }
  ASSIGN_OR_RETURN(int64_t missing_count, offload::SumTensorsAcrossRanks(*group, grads, numels));
  *missing = missing_count > 0;
  return absl::OkStatus();
}

}  // namespace lspo::worker
