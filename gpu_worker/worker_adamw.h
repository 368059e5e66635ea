// LibTorch's AdamW over tensors the worker trains on its own device (no offload): the
// optimizer of the native mode (every linear weight) and of the lora mode (the adapters),
// with the job's optim settings, global gradient-norm clipping, a finiteness check of the
// step's gradients, and its state file for checkpoints. Internal to gpu_worker/.
//
// AdamW: decoupled weight decay (Loshchilov & Hutter 2019, algorithm 2), as torch.optim.AdamW.
// Shapes: the parameters are of any shape (native: each linear's W (m, n), m out and n in
// features, as stored; lora: A (r, n) and B (m, r) fp32, r the LoRA rank).
// Thread-safety: none; used under WorkerCore's mutex.
#ifndef LSPO_GPU_WORKER_WORKER_ADAMW_H_
#define LSPO_GPU_WORKER_WORKER_ADAMW_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/optim/adamw.h>
#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/collective.h"
#include "proto/job_spec.pb.h"
#include "proto/worker.pb.h"

namespace lspo::worker {

// Data parallel: replaces the gradient of every tensor in `params` by its sum over the ranks
// of `group` (offload::SumTensorsAcrossRanks: one flat fp32 all-reduce of 1 + Σ numel values;
// a tensor without a gradient counts as zeros and gets the sum), in place, in each gradient's dtype
// and device. Each rank's loss was scaled by its share of the global loss tokens, so the sum is the
// gradient of the global token-mean loss. Errors: Collective::AllReduceSum's (kUnavailable naming
// the ranks).
absl::Status SumGradientsAcrossRanks(const std::vector<at::Tensor>& params,
                                     offload::Collective* group);

// AdamW on the worker (see the file comment).
class WorkerAdamW {
 public:
  // Trains `params` (leaf tensors with requires_grad, any shapes, on one device) with
  // optim.lr / beta1 / beta2 / eps / weight_decay of `optim`.
  WorkerAdamW(std::vector<at::Tensor> params, const lspo::v1::OptimSpec& optim);

  // Bytes of the moments (exp_avg, exp_avg_sq: two per parameter element, in its dtype).
  int64_t StateBytes() const;

  // Resets every parameter's gradient before a step's first micro-batch.
  void ZeroGrad() { adamw_->zero_grad(); }

  // The step's update with learning rate `lr`, after its last backward (UpdatePath::FinishStep).
  // With a `collective` of several ranks the gradients are first summed across the ranks (one
  // fp32 all-reduce of all of them, a parameter without a gradient counting as zeros; each
  // rank's loss was already scaled by its share of the global loss tokens, so the sum is the
  // gradient of the global token-mean loss). A non-finite
  // gradient (after the sum, so every rank agrees) sets reply->nonfinite and changes nothing.
  // Otherwise, with optim.max_grad_norm > 0 the gradients are clipped to that global L2 norm
  // (the norm before clipping goes to metrics.grad_norm); metrics.update_seconds gets the time
  // taken. Errors: the all-reduce's (kUnavailable naming the ranks).
  absl::Status Step(double lr, offload::Collective* collective, lspo::v1::TrainStepReply* reply);

  // The AdamW state file of a checkpoint directory.
  static std::string StatePath(const std::string& dir) { return dir + "/worker_adamw.pt"; }
  // Writes the state to StatePath(dir) and lists it in reply->files.
  // Errors: kInternal with LibTorch's message when the file cannot be written.
  absl::Status Save(const std::string& dir, lspo::v1::StateReply* reply);
  // Checks that StatePath(dir) exists, changing nothing; the returned commit loads it.
  // Errors: kNotFound naming the file and `mode`; the commit: kDataLoss when LibTorch cannot
  // read it.
  absl::StatusOr<std::function<absl::Status()>> Read(const std::string& dir,
                                                     const std::string& mode);

 private:
  std::vector<at::Tensor> params_;  // Any shapes, one device.
  double max_grad_norm_ = 0;
  std::unique_ptr<torch::optim::AdamW> adamw_;
};

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_WORKER_ADAMW_H_
