// The arena mechanics shared by the offloaded training modes (lsp, zero): the arena and its
// completion flags at LoadJob, the transfer engine on CUDA, publishing a linear's gradient
// into its arena slot (synchronously on the CPU, asynchronously with a device-side finiteness
// verdict on CUDA), waiting for and applying the optimizer's update, and the serial / overlap
// schedules of a step's end (docs/architecture.md "Step schedules"). A mode derives from
// OffloadPath and says only what it offloads and how an update lands in W.
// Internal to gpu_worker/.
//
// Shapes: W (m, n), m out features, n in features, as stored (fp32 or bf16) on the job's device.
// A linear's gradient and slots by mode: lsp S and D (d_p, d_q) fp32 (d_p, d_q the subspace
// dims; GaLore-Offload: (m, r) or (r, n), r its rank); zero G (m, n) in W's dtype, its
// full_grad and param slots (m, n) bf16.
#ifndef LSPO_GPU_WORKER_OFFLOAD_PATH_H_
#define LSPO_GPU_WORKER_OFFLOAD_PATH_H_

#include <cstddef>
#include <cstdint>

#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/update_path.h"
#include "proto/arena.pb.h"
#include "proto/peer.pb.h"
#include "proto/worker.pb.h"

namespace lspo::worker {

// Base of the offloaded modes (see the file comment).
class OffloadPath : public UpdatePath {
 public:
  bool offloaded() const final { return true; }

  // Builds the mode's layout (BuildLayout), creates the arena and its flags, lets the mode
  // attach its gradient sinks (AttachGradients), copies the layout into reply->arena and, on
  // CUDA, starts the transfer engine with staging slots of MaxUploadBytes.
  absl::Status Setup(WorkerJob* job, lspo::v1::LoadJobReply* reply) final;

  absl::Status FinishStep(WorkerJob* job, const StepContext& ctx,
                          lspo::v1::TrainStepReply* reply) final;

  absl::Status ApplyUpdate(WorkerJob* job, int64_t i, uint32_t step, double decay) final;

  absl::Status BeginRankSum(WorkerJob* job, offload::Collective* group, uint32_t step) final;
  absl::Status EndRankSum(WorkerJob* job) final;

  // The bytes of every linear's down slot (lsp grad, zero full_grad) and up slot (lsp step,
  // zero param) in the arena layout.
  int64_t OffloadBytesPerStep(const WorkerJob& job) const final;

 protected:
  // Writes linear i's gradient `grad` (what the mode's Gradient() returns: lsp S (d_p, d_q)
  // fp32, zero G (m, n) in W's dtype; on the job's device) for `step` into its arena slot and
  // publishes it. Returns false, having aborted the step in
  // the flags and set job->progress.publish_failed, when the gradient is non-finite (CPU: checked
  // here; CUDA: the verdict arrives on the watcher thread, which then aborts) or cannot be
  // enqueued. Data parallel under the overlap schedule (job->ranks.reducer set by BeginRankSum):
  // stages `grad` for the sum across the ranks instead; the reducer's thread publishes the sum.
  bool PublishGradient(WorkerJob* job, int64_t i, const at::Tensor& grad, uint32_t step);
  // The CPU part of PublishGradient: checks `grad` (any floating dtype, the slot's shape) is
  // finite, copies it into linear i's slot in the slot's dtype and publishes it; returns
  // false, having aborted the step and set job->progress.publish_failed, if it is not finite.
  // Called on the backward's thread, or on the reducer's for a data-parallel sum.
  bool PublishHostGradient(WorkerJob* job, int64_t i, const at::Tensor& grad, uint32_t step);

  // Data parallel, serial schedule on the CPU: replaces every linear's gradient
  // (Gradient(job, i), in place, in its dtype) by its sum over the ranks of `group`: one fp32
  // all-reduce of Σ (slot elements) + 1 values (offload::SumTensorsAcrossRanks). Sets *missing
  // when any rank formed no gradient for some linear (the caller then skips the step on every
  // rank). Errors: Collective::AllReduceSum's (kUnavailable naming the ranks), arena slot
  // errors.
  absl::Status SumAcrossRanks(WorkerJob* job, offload::Collective* group, bool* missing);

 private:
  // The mode's arena layout for job->linears (offload/arena_layout.h).
  virtual absl::StatusOr<lspo::v1::ArenaLayout> BuildLayout(const WorkerJob& job) = 0;
  // Sets the model's linear mode and the sinks or hooks that publish gradients during the
  // backward (job->progress.publish_step > 0), once the arena exists.
  virtual absl::Status AttachGradients(WorkerJob* job) = 0;
  // The largest host-to-device upload of one linear's update, in bytes (staging slot size).
  virtual size_t MaxUploadBytes(const WorkerJob& job) const = 0;
  // The step's accumulated gradient of linear i, as the optimizer receives it (undefined if
  // the backward formed none): lsp S (d_p, d_q) fp32, zero G (m, n) in W's dtype.
  virtual at::Tensor Gradient(WorkerJob* job, int64_t i) = 0;
  // Linear i's gradient slot in the arena: a host tensor of the published shape and dtype
  // (lsp grad (d_p, d_q) fp32, zero full_grad (m, n) bf16).
  virtual absl::StatusOr<at::Tensor> GradientSlot(const WorkerJob& job, int64_t i) const = 0;
  // CUDA: the device tensor the asynchronous copy reads, of grad's shape in the slot's dtype,
  // contiguous and not aliasing an accumulator that a later micro-batch updates in place.
  virtual at::Tensor DeviceSnapshot(const at::Tensor& grad) const = 0;
  // Lands linear i's published update of `step` (already waited for) in its weight `w` ((m, n),
  // as stored) with weight-decay factor `decay`. Errors: kDataLoss (non-finite), transfer errors.
  virtual absl::Status Land(WorkerJob* job, int64_t i, uint32_t step, at::Tensor& w,
                            double decay) = 0;
};

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_OFFLOAD_PATH_H_
