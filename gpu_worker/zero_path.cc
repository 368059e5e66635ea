// MODE_ZERO on the worker (ZeRO-Offload's schedule, docs/method.md "Baselines"): the linears
// compute densely; each matrix's full gradient (m, n) goes to the optimizer service as bf16
// through the arena, which runs AdamW (weight decay included) on fp32 master weights and
// returns the bf16 parameters (m, n), copied into W. Internal to gpu_worker/.
// Shapes: W and G (m, n), m out features, n in features; W as stored (fp32 or bf16).
#include <algorithm>

#include "offload/training_mode.h"
#include "third_party/torch/torch_api.h"

#include "gpu_worker/device_offload.h"
#include "gpu_worker/offload_path.h"
#include "gpu_worker/worker_job.h"
#include "offload/arena_layout.h"
#include "offload/arena_tensors.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

namespace {

// The ZeRO update path (see the file comment).
class ZeroPath final : public OffloadPath {
 public:
  const char* name() const override { return "zero"; }

  void ZeroGrads(WorkerJob* job) override { job->model->ZeroLinearGrads(); }

 private:
  absl::StatusOr<lspo::v1::ArenaLayout> BuildLayout(const WorkerJob& job) override {
    // The mode's one layout builder, the planner's too (offload/training_mode.h).
    return offload::ModeOf(job.spec).layout(job.linears, model::kLinearsPerLayer, job.spec,
                                            runtime::ShmArena::UniqueName(job.id));
  }

  absl::Status AttachGradients(WorkerJob* job) override {
    auto& model = *job->model;
    model.SetLinearMode(model::LinearMode::kDense);
    for (int64_t i = 0; i < model.num_linears(); ++i) {
      // Fires with this micro-batch's gradient before it is accumulated into W.grad().
      // (m, n), W's dtype
      model.LinearWeight(i).register_hook([this, job, i](const at::Tensor& g) {
        if (job->progress.publish_step > 0 && !job->progress.publish_failed) {
          const at::Tensor& acc = job->model->LinearWeight(i).grad();  // (m, n) or undefined
          PublishGradient(job, i, acc.defined() ? acc + g : g, job->progress.publish_step);
        }
        return g;
      });
    }
    return absl::OkStatus();
  }

  size_t MaxUploadBytes(const WorkerJob& job) const override {
    // The upload is the largest matrix's bf16 parameters.
    size_t max_upload = 0;
    for (const auto& l : job.linears) {
      max_upload = std::max<size_t>(max_upload, static_cast<size_t>(l.m) * l.n * 2);
    }
    return max_upload;
  }

  at::Tensor Gradient(WorkerJob* job, int64_t i) override {
    return job->model->LinearWeight(i).grad();
  }

  absl::StatusOr<at::Tensor> GradientSlot(const WorkerJob& job, int64_t i) const override {
    return offload::ArenaBf16(job.plane.arena,
                              job.plane.layout.linears(static_cast<int>(i)).full_grad());
  }

  at::Tensor DeviceSnapshot(const at::Tensor& grad) const override {
    // The hooks hand over acc + g (a fresh tensor); the serial schedule W.grad() after the
    // last backward: neither changes while the copy runs.
    return grad.to(at::kBFloat16).contiguous();
  }

  absl::Status Land(WorkerJob* job, int64_t i, uint32_t step, at::Tensor& w,
                    double decay) override {
    // The optimizer applied the decay: W <- param.
    const auto& slot = job->plane.layout.linears(static_cast<int>(i));
    // (m, n) bf16, a view of the arena.
    ASSIGN_OR_RETURN(at::Tensor param, offload::ArenaBf16(job->plane.arena, slot.param()));
    if (!job->cuda) {
      w.copy_(param);
      return absl::OkStatus();
    }
    // (m, n) bf16 in a device staging slot.
    ASSIGN_OR_RETURN(at::Tensor dev,
                     job->plane.engine->UploadAsync(i / model::kLinearsPerLayer, param.data_ptr(),
                                                    param.nbytes(), at::kBFloat16, param.sizes()));
    w.copy_(dev);
    return job->plane.engine->ReleaseStaging();
  }
};

}  // namespace

std::unique_ptr<UpdatePath> MakeZeroPath() { return std::make_unique<ZeroPath>(); }

}  // namespace lspo::worker
