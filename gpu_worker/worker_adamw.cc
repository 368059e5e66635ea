// Shapes as in gpu_worker/worker_adamw.h.
#include "gpu_worker/worker_adamw.h"

#include <torch/nn/utils/clip_grad.h>
#include <torch/serialize.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

WorkerAdamW::WorkerAdamW(std::vector<at::Tensor> params, const lspo::v1::OptimSpec& optim)
    : params_(std::move(params)), max_grad_norm_(optim.max_grad_norm()) {
  adamw_ = std::make_unique<torch::optim::AdamW>(params_, torch::optim::AdamWOptions(optim.lr())
                                                              .betas({optim.beta1(), optim.beta2()})
                                                              .eps(optim.eps())
                                                              .weight_decay(optim.weight_decay()));
}

int64_t WorkerAdamW::StateBytes() const {
  int64_t bytes = 0;
  for (const at::Tensor& p : params_)
    bytes += 2 * p.numel() * static_cast<int64_t>(p.element_size());
  return bytes;
}

absl::Status SumGradientsAcrossRanks(const std::vector<at::Tensor>& params,
                                     offload::Collective* group) {
  std::vector<at::Tensor> grads;  // per param: its shape and dtype, or undefined
  std::vector<int64_t> numels;
  for (const at::Tensor& p : params) {
    grads.push_back(p.grad());  // undefined where a parameter got none: summed as zeros
    numels.push_back(p.numel());
  }
  ASSIGN_OR_RETURN(int64_t missing, offload::SumTensorsAcrossRanks(*group, grads, numels));
  (void)missing;  // a parameter no rank touched gets a zero gradient, as under DDP
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor param = params[i];  // a handle: mutable_grad() sets the shared tensor's gradient
    if (!param.grad().defined()) {
      param.mutable_grad() = grads[i].view(param.sizes()).to(param.device(), param.scalar_type());
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerAdamW::Step(double lr, offload::Collective* collective,
                               lspo::v1::TrainStepReply* reply) {
  auto t0 = std::chrono::steady_clock::now();
  if (collective != nullptr && collective->world_size() > 1) {
    RETURN_IF_ERROR(SumGradientsAcrossRanks(params_, collective));
  }
  // One host synchronisation: the squared norms summed on the device, read once.
  at::Tensor sq;  // () fp64, sum of squared gradient entries
  for (const at::Tensor& p : params_) {
    if (!p.grad().defined()) continue;
    at::Tensor s = p.grad().to(at::kDouble).pow(2).sum();  // () fp64
    sq = sq.defined() ? sq + s : s;
  }
  const double norm = sq.defined() ? std::sqrt(sq.item<double>()) : 0.0;
  if (!std::isfinite(norm)) {  // A NaN or Inf anywhere makes the sum non-finite.
    reply->set_nonfinite(true);
    return absl::OkStatus();
  }
  for (auto& group : adamw_->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  auto* metrics = reply->mutable_metrics();
  if (max_grad_norm_ > 0) {
    metrics->set_grad_norm(torch::nn::utils::clip_grad_norm_(params_, max_grad_norm_));
  }
  adamw_->step();
  metrics->set_update_seconds(runtime::SecondsSince(t0));
  return absl::OkStatus();
}

absl::Status WorkerAdamW::Save(const std::string& dir, lspo::v1::StateReply* reply) {
  const std::string path = StatePath(dir);
  try {
    torch::save(*adamw_, path);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("cannot write the AdamW state '", path, "': ", e.what_without_backtrace()));
  }
  reply->add_files(path);
  return absl::OkStatus();
}

absl::StatusOr<std::function<absl::Status()>> WorkerAdamW::Read(const std::string& dir,
                                                                const std::string& mode) {
  const std::string path = StatePath(dir);
  if (access(path.c_str(), R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "'", path, "' is missing: the checkpoint has no AdamW state for this ", mode, " job"));
  }
  return std::function<absl::Status()>([this, path]() -> absl::Status {
    try {
      torch::load(*adamw_, path);
    } catch (const c10::Error& e) {
      return absl::DataLossError(
          absl::StrCat("cannot read the AdamW state '", path, "': ", e.what_without_backtrace()));
    }
    return absl::OkStatus();
  });
}

}  // namespace lspo::worker
