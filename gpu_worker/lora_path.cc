// MODE_LORA on the worker (baselines/lora.h; docs/baselines.md): the base weights frozen,
// LoRA adapters A (r, n), B (m, r) on the target linears trained with AdamW on the worker's
// device (worker_adamw.h), no offload. The adapters are made at LoadJob with PEFT's
// initialisation from JobSpec.seed. Checkpoint state: `<linear>.lora_A` / `.lora_B` fp32 in
// worker_state.safetensors and the AdamW state in worker_adamw.pt. The job's output is the
// merged model (W + scaling B A, fp32) as model.safetensors and the PEFT adapter folder in
// `<dir>/adapter`. Internal to gpu_worker/.
// Shapes: m out features, n in features, r the LoRA rank (lora.r).
#include <filesystem>
#include <system_error>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/strings/str_cat.h"
#include "baselines/lora.h"
#include "gpu_worker/update_path.h"
#include "gpu_worker/worker_adamw.h"
#include "gpu_worker/worker_job.h"
#include "offload/state_file.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

namespace {

// The lora update path (see the file comment).
class LoraPath final : public UpdatePath {
 public:
  const char* name() const override { return "lora"; }
  bool offloaded() const override { return false; }

  absl::Status Setup(WorkerJob* job, lspo::v1::LoadJobReply* reply) override {
    const auto& spec = job->spec.lora();
    baselines::LoraSettings s;
    s.r = spec.r();
    s.alpha = spec.alpha();
    s.use_rslora = spec.use_rslora();
    s.target_modules.assign(spec.target_modules().begin(), spec.target_modules().end());
    absl::StatusOr<std::shared_ptr<baselines::LoraAdapter>> made =
        baselines::LoraAdapter::Create(*job->model, s, job->spec.seed());
    if (!made.ok()) {
      // Name the job spec fields (the adapter's message names the matrix).
      return absl::InvalidArgumentError(
          absl::StrCat("job spec field lora: ", made.status().message()));
    }
    adapter_ = *std::move(made);
    adapter_->Attach(job->model.get());
    adamw_ = std::make_unique<WorkerAdamW>(adapter_->Parameters(), job->spec.optim());
    return absl::OkStatus();
  }

  int64_t TrainableParameters(const WorkerJob& job) const override {
    return adapter_->NumParameters();
  }

  int64_t OptimizerStateBytes(const WorkerJob& job) const override { return adamw_->StateBytes(); }

  void ZeroGrads(WorkerJob* job) override { adamw_->ZeroGrad(); }

  absl::Status FinishStep(WorkerJob* job, const StepContext& ctx,
                          lspo::v1::TrainStepReply* reply) override {
    return adamw_->Step(ctx.lr, ctx.collective, reply);
  }

  offload::NamedTensors ExportedTensors(WorkerJob* job) override {
    return adapter_->MergedTensors(*job->model);
  }

  absl::StatusOr<std::vector<std::string>> WriteArtifacts(WorkerJob* job,
                                                          const std::string& dir) override {
    // PEFT loads the base from base_model_name_or_path: an absolute path works from any
    // working directory (a GGUF or tiny-random base has no HF folder: docs/baselines.md).
    const std::string& path = job->spec.model().path();
    std::error_code ec;
    const std::string base =
        path.empty() ? path : std::filesystem::absolute(path, ec).lexically_normal().string();
    return baselines::WritePeftAdapter(*adapter_, *job->model, ec ? path : base, dir + "/adapter");
  }

  absl::Status SaveState(WorkerJob* job, const std::string& dir, offload::NamedTensors* tensors,
                         std::map<std::string, std::string>* metadata,
                         lspo::v1::StateReply* reply) override {
    for (int64_t i = 0; i < adapter_->num_linears(); ++i) {
      if (!adapter_->targets(i)) continue;
      const std::string& name = job->linears[static_cast<size_t>(i)].name;
      tensors->emplace_back(name + ".lora_A", adapter_->A(i).detach().to(at::kCPU));
      tensors->emplace_back(name + ".lora_B", adapter_->B(i).detach().to(at::kCPU));
    }
    (*metadata)["lora_r"] = std::to_string(adapter_->settings().r);
    return adamw_->Save(dir, reply);
  }

  absl::StatusOr<Commit> ReadState(WorkerJob* job, const model::SafetensorsFile& file,
                                   const std::string& what, const std::string& dir) override {
    std::vector<std::pair<int64_t, std::pair<at::Tensor, at::Tensor>>> read;  // (i, (A, B)) views
    for (int64_t i = 0; i < adapter_->num_linears(); ++i) {
      if (!adapter_->targets(i)) continue;
      const std::string& name = job->linears[static_cast<size_t>(i)].name;
      // A (r, n) and B (m, r) fp32, read-only views of the file.
      ASSIGN_OR_RETURN(at::Tensor a, offload::ViewStateTensor(file, what, name + ".lora_A",
                                                              at::kFloat, adapter_->A(i).sizes()));
      ASSIGN_OR_RETURN(at::Tensor b, offload::ViewStateTensor(file, what, name + ".lora_B",
                                                              at::kFloat, adapter_->B(i).sizes()));
      read.push_back({i, {a, b}});
    }
    ASSIGN_OR_RETURN(Commit adamw, adamw_->Read(dir, "lora"));
    return Commit([this, read = std::move(read), adamw]() -> absl::Status {
      at::NoGradGuard no_grad;
      for (const auto& [i, ab] : read) {
        adapter_->A(i).copy_(ab.first);
        adapter_->B(i).copy_(ab.second);
      }
      return adamw();
    });
  }

 private:
  std::shared_ptr<baselines::LoraAdapter> adapter_;
  std::unique_ptr<WorkerAdamW> adamw_;
};

}  // namespace

std::unique_ptr<UpdatePath> MakeLoraPath() { return std::make_unique<LoraPath>(); }

}  // namespace lspo::worker
