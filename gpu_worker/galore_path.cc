// MODE_GALORE on the worker (baselines/galore.h; docs/baselines.md "GaLore"): the linears
// compute densely and their full gradients G (m, n) form on the worker's device; GaLore's AdamW
// projects each G to rank r by the SVD of a recent gradient, keeps the Adam moments in that
// r x max(m, n) space and applies the projected-back step to W, all on the worker (as the
// galore-torch package does on a GPU). No offload. Checkpoint state: per matrix
// `<linear>.galore_projector`, `.galore_exp_avg`, `.galore_exp_avg_sq` (fp32) and the
// metadata key galore_step in worker_state.safetensors. Internal to gpu_worker/.
// Shapes: m out features, n in features, r GaLore's rank (galore.rank).
#include <chrono>
#include <map>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "baselines/galore.h"
#include "gpu_worker/update_path.h"
#include "gpu_worker/worker_adamw.h"
#include "gpu_worker/worker_job.h"
#include "offload/state_file.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

namespace {

// The galore update path (see the file comment).
class GalorePath final : public UpdatePath {
 public:
  const char* name() const override { return "galore"; }
  bool offloaded() const override { return false; }

  absl::Status Setup(WorkerJob* job, lspo::v1::LoadJobReply* reply) override {
    auto& model = *job->model;
    model.SetLinearMode(model::LinearMode::kDense);
    std::vector<at::Tensor> params;  // W (m, n) per linear, as stored
    std::vector<std::string> names;
    for (int64_t i = 0; i < model.num_linears(); ++i) {
      params.push_back(model.LinearWeight(i));
      names.push_back(job->linears[static_cast<size_t>(i)].name);
    }
    const auto& g = job->spec.galore();
    baselines::GaloreSettings s;
    s.rank = g.rank();
    s.update_proj_gap = g.update_proj_gap();
    s.scale = g.scale();
    const auto& o = job->spec.optim();
    baselines::GaloreAdamSettings adam;
    adam.beta1 = o.beta1();
    adam.beta2 = o.beta2();
    adam.eps = o.eps();
    adam.weight_decay = o.weight_decay();
    adam.max_grad_norm = o.max_grad_norm();
    absl::StatusOr<std::unique_ptr<baselines::GaloreAdamW>> made =
        baselines::GaloreAdamW::Create(std::move(params), std::move(names), s, adam);
    if (!made.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("job spec field ", made.status().message()));
    }
    opt_ = *std::move(made);
    return absl::OkStatus();
  }

  int64_t OptimizerStateBytes(const WorkerJob& job) const override { return opt_->StateBytes(); }

  void ZeroGrads(WorkerJob* job) override { job->model->ZeroLinearGrads(); }

  absl::Status FinishStep(WorkerJob* job, const StepContext& ctx,
                          lspo::v1::TrainStepReply* reply) override {
    const auto t0 = std::chrono::steady_clock::now();
    if (ctx.collective != nullptr && ctx.collective->world_size() > 1) {
      // Data parallel: GaLore's projector is the SVD of the gradient, so the ranks sum the
      // full gradients first (as galore-torch under DDP) and every rank projects the same G.
      std::vector<at::Tensor> params;  // W (m, n) per linear, as stored
      for (int64_t i = 0; i < job->model->num_linears(); ++i) {
        params.push_back(job->model->LinearWeight(i));
      }
      RETURN_IF_ERROR(SumGradientsAcrossRanks(params, ctx.collective));
    }
    double norm = 0;
    if (!opt_->Step(ctx.lr, &norm)) {
      reply->set_nonfinite(true);
      return absl::OkStatus();
    }
    auto* metrics = reply->mutable_metrics();
    // The norm of the full gradients before clipping, computed for every step (the finiteness
    // check needs it), as the offloaded modes report theirs.
    metrics->set_grad_norm(norm);
    metrics->set_update_seconds(runtime::SecondsSince(t0));
    return absl::OkStatus();
  }

  absl::Status SaveState(WorkerJob* job, const std::string& dir, offload::NamedTensors* tensors,
                         std::map<std::string, std::string>* metadata,
                         lspo::v1::StateReply* reply) override {
    opt_->AppendState(tensors, metadata);
    return absl::OkStatus();
  }

  absl::StatusOr<Commit> ReadState(WorkerJob* job, const model::SafetensorsFile& file,
                                   const std::string& what, const std::string& dir) override {
    const auto& meta = file.metadata();
    auto it = meta.find("galore_step");
    int64_t step = -1;
    if (it == meta.end() || !absl::SimpleAtoi(it->second, &step) || step < 0) {
      return absl::DataLossError(
          absl::StrCat(what, " has no valid galore_step: it is not the state of a galore job"));
    }
    // GaLore's step counts the job steps that updated: never more than the checkpoint's step
    // (a hand-edited value would move the projector refreshes and the bias corrections).
    int64_t job_step = -1;
    auto at = meta.find("step");
    if (at != meta.end() && absl::SimpleAtoi(at->second, &job_step) && step > job_step) {
      return absl::DataLossError(absl::StrCat(what, " has galore_step ", step,
                                              ", past the checkpoint's step ", job_step,
                                              ": the state is damaged"));
    }
    std::map<std::string, at::Tensor> tensors;  // fp32 CPU, shapes as below
    if (step > 0) {
      for (size_t i = 0; i < opt_->size(); ++i) {
        const std::string base = opt_->name(i) + ".galore_";
        const std::vector<int64_t> ps = opt_->ProjectorShape(i), ms = opt_->MomentShape(i);
        for (const auto& [key, shape] : {std::make_pair(std::string("projector"), ps),
                                         std::make_pair(std::string("exp_avg"), ms),
                                         std::make_pair(std::string("exp_avg_sq"), ms)}) {
          ASSIGN_OR_RETURN(tensors[base + key],
                           offload::ReadStateTensor(file, what, base + key, at::kFloat, shape));
        }
      }
    }
    if (absl::Status st = opt_->CheckState(tensors, step); !st.ok()) {
      return absl::DataLossError(absl::StrCat(what, ": ", st.message()));
    }
    return Commit([this, tensors = std::move(tensors), step]() -> absl::Status {
      return opt_->LoadState(tensors, step);
    });
  }

 private:
  std::unique_ptr<baselines::GaloreAdamW> opt_;
};

}  // namespace

std::unique_ptr<UpdatePath> MakeGalorePath() { return std::make_unique<GalorePath>(); }

}  // namespace lspo::worker
