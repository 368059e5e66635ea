// MODE_NATIVE on the worker: no offload; LibTorch's AdamW (decoupled weight decay,
// Loshchilov & Hutter 2019) steps every trainable matrix on the worker's device, with
// optional global gradient-norm clipping (worker_adamw.h). The reference for the offloaded
// modes' accuracy. Its state is worker_adamw.pt beside worker_state.safetensors.
// Internal to gpu_worker/. Shapes: W (m, n), m out features, n in features.
#include <vector>

#include "third_party/torch/torch_api.h"

#include "gpu_worker/update_path.h"
#include "gpu_worker/worker_adamw.h"
#include "gpu_worker/worker_job.h"

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
    std::vector<at::Tensor> params;  // W (m, n) per linear, as stored
    for (int64_t i = 0; i < model.num_linears(); ++i) params.push_back(model.LinearWeight(i));
    adamw_ = std::make_unique<WorkerAdamW>(std::move(params), job->spec.optim());
    return absl::OkStatus();
  }

  int64_t OptimizerStateBytes(const WorkerJob& job) const override { return adamw_->StateBytes(); }

  void ZeroGrads(WorkerJob* job) override { adamw_->ZeroGrad(); }

  absl::Status FinishStep(WorkerJob* job, const StepContext& ctx,
                          lspo::v1::TrainStepReply* reply) override {
    return adamw_->Step(ctx.lr, ctx.collective, reply);
  }

  absl::Status SaveState(WorkerJob* job, const std::string& dir, offload::NamedTensors* tensors,
                         std::map<std::string, std::string>* metadata,
                         lspo::v1::StateReply* reply) override {
    return adamw_->Save(dir, reply);
  }

  absl::StatusOr<Commit> ReadState(WorkerJob* job, const model::SafetensorsFile& file,
                                   const std::string& what, const std::string& dir) override {
    return adamw_->Read(dir, "native");
  }

 private:
  std::unique_ptr<WorkerAdamW> adamw_;
};

}  // namespace

std::unique_ptr<UpdatePath> MakeNativePath() { return std::make_unique<NativePath>(); }

}  // namespace lspo::worker
