// MODE_NATIVE on the worker: no offload; LibTorch's AdamW (decoupled weight decay,
// Loshchilov & Hutter 2019) steps every trainable matrix on the worker's device, with
// optional global gradient-norm clipping. The reference for the offloaded modes' accuracy.
// Its state is worker_adamw.pt beside worker_state.safetensors. Internal to gpu_worker/.
#include <unistd.h>

#include <chrono>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "gpu_worker/update_path.h"
#include "gpu_worker/worker_job.h"
#include "runtime/clock.h"

namespace lspo::worker {

namespace {

// The native update path (see the file comment).
class NativePath final : public UpdatePath {
 public:
  const char* name() const override { return "native"; }
  bool offloaded() const override { return false; }

  absl::Status Setup(WorkerJob* job, lspo::v1::LoadJobReply* reply) override {
    auto& model = *job->model;
    model.SetLinearMode(model::LinearMode::kDense);
    const auto& o = job->spec.optim();
    adamw_ = std::make_unique<torch::optim::AdamW>(
        Params(*job), torch::optim::AdamWOptions(o.lr())
                          .betas({o.beta1(), o.beta2()})
                          .eps(o.eps())
                          .weight_decay(o.weight_decay()));
    return absl::OkStatus();
  }

  void ZeroGrads(WorkerJob* job) override { adamw_->zero_grad(); }

  absl::Status FinishStep(WorkerJob* job, const StepContext& ctx,
                          lspo::v1::TrainStepReply* reply) override {
    auto t0 = std::chrono::steady_clock::now();
    for (auto& group : adamw_->param_groups()) {
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(ctx.lr);
    }
    auto* metrics = reply->mutable_metrics();
    if (job->spec.optim().max_grad_norm() > 0) {
      metrics->set_grad_norm(
          torch::nn::utils::clip_grad_norm_(Params(*job), job->spec.optim().max_grad_norm()));
    }
    adamw_->step();
    metrics->set_update_seconds(runtime::SecondsSince(t0));
    return absl::OkStatus();
  }

  absl::Status SaveState(WorkerJob* job, const std::string& dir, offload::NamedTensors* tensors,
                         std::map<std::string, std::string>* metadata,
                         lspo::v1::StateReply* reply) override {
    const std::string path = dir + "/worker_adamw.pt";
    torch::save(*adamw_, path);
    reply->add_files(path);
    return absl::OkStatus();
  }

  absl::StatusOr<Commit> ReadState(WorkerJob* job, const model::SafetensorsFile& file,
                                   const std::string& what, const std::string& dir) override {
    const std::string path = dir + "/worker_adamw.pt";
    if (access(path.c_str(), R_OK) != 0) {
      return absl::NotFoundError(absl::StrCat(
          "'", path, "' is missing: the checkpoint has no AdamW state for this native job"));
    }
    return Commit([this, path] {
      torch::load(*adamw_, path);
      return absl::OkStatus();
    });
  }

 private:
  static std::vector<at::Tensor> Params(WorkerJob& job) {
    std::vector<at::Tensor> params;
    for (int64_t i = 0; i < job.model->num_linears(); ++i) {
      params.push_back(job.model->LinearWeight(i));
    }
    return params;
  }

  std::unique_ptr<torch::optim::AdamW> adamw_;
};

}  // namespace

std::unique_ptr<UpdatePath> MakeNativePath() { return std::make_unique<NativePath>(); }

}  // namespace lspo::worker
