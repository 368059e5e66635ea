// Shapes as in cpu_optimizer_service/optimizer_core.h.
#include "cpu_optimizer_service/optimizer_core.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "third_party/torch/torch_api.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cpu_optimizer_service/optimizer_job.h"
#include "cpu_optimizer_service/update_rule.h"
#include "glog/logging.h"
#include "lsp/adam.h"
#include "model/safetensors.h"
#include "offload/arena_layout.h"
#include "offload/arena_tensors.h"
#include "offload/hf_export.h"
#include "offload/job_assets.h"
#include "offload/memory_plan.h"
#include "offload/spec_paths.h"
#include "offload/state_file.h"
#include "offload/torch_call.h"
#include "offload/training_mode.h"
#include "runtime/clock.h"
#include "runtime/file_io.h"
#include "runtime/float16.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"
#include "tbb/global_control.h"

namespace lspo::optimizer {

namespace {

using runtime::MonotonicSeconds;

// Update's pass over the tasks of one request (see OptimizerCore::Update): the waits for the
// worker's gradients, their checks, the rule's per-matrix updates and the per-layer timeline.
// The caller holds the core's mutex; the rule's EndStep runs when the pass is destroyed.
class UpdatePass {
 public:
  UpdatePass(OptimizerJob* job, const lspo::v1::UpdateRequest& request, StepInputs inputs,
             absl::Duration timeout)
      : job_(job),
        rule_(*job->rule),
        request_(request),
        in_(inputs),
        timeout_(timeout),
        // All or nothing (issue 43): a step is kept only once the worker's verdict says the
        // loss and every gradient were finite. Serial schedule: the worker found them so
        // before this call. Overlap: the rule keeps undo records of the matrices it updates
        // before the verdict.
        verdict_(&job->flags, in_.step, timeout, /*known=*/!request.wait_for_grads()) {
    in_.verdict = &verdict_;
  }
  ~UpdatePass() { rule_.EndStep(); }

  // Runs the pass. The reply is aborted when the worker abandoned the step (no state
  // changed). Errors as OptimizerCore::Update, every matrix this step updated rolled back.
  absl::StatusOr<lspo::v1::UpdateReply> Run(double t_start);

 private:
  // Waits for linear i's gradient (overlap) or checks it is there (serial).
  absl::Status Wait(int i) const;
  // One read-only pass over linear i's gradient: finiteness (kInvalidArgument naming the
  // weight) and the squared norm clipping counts (UpdateRule::NormSquared).
  absl::StatusOr<double> NormSquared(int i, const MatrixGradient& g) const;
  // Clipping needs the global norm before any update: every gradient is waited for first.
  // The serial schedule checks every gradient first too, so that no bad gradient is found
  // after some matrices were updated. Sets *aborted when the worker abandoned the step.
  absl::Status Prepass(bool* aborted);
  // Linear i's turn: its wait and check (no prepass), its update, its step flag.
  absl::Status UpdateOne(int i, bool prepass);
  // Adds the event of the layer in progress (if any) to the reply, ending at `now`.
  void CloseLayer(double now);

  OptimizerJob* job_;
  UpdateRule& rule_;
  const lspo::v1::UpdateRequest& request_;
  StepInputs in_;
  const absl::Duration timeout_;
  StepVerdict verdict_;
  lspo::v1::UpdateReply reply_;
  double norm2_ = 0;
  double waited_ = 0;  // Seconds waiting for gradients.
  int current_layer_ = -1;
  double layer_start_ = 0;
};

absl::Status UpdatePass::Wait(int i) const {
  if (request_.wait_for_grads()) return job_->flags.WaitGrad(i, in_.step, timeout_);
  if (job_->flags.grad_seq(i) < in_.step) {
    return absl::FailedPreconditionError(
        absl::StrCat("Update: the worker has not published step ", in_.step, " of ",
                     job_->layout.linears(i).name(), " (TrainStep first)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> UpdatePass::NormSquared(int i, const MatrixGradient& g) const {
  const lsp::GradientStats gs = g.fp32 != nullptr ? lsp::ComputeGradientStats(g.fp32, g.n)
                                                  : lsp::ComputeGradientStats(g.bf16, g.n);
  if (gs.first_non_finite >= 0) {
    const int64_t k = gs.first_non_finite;
    return lsp::NonFiniteError(job_->layout.linears(i).name(), k, g.n,
                               g.fp32 != nullptr ? g.fp32[k] : runtime::Bf16ToFp32(g.bf16[k]));
  }
  return rule_.NormSquared(*job_, i, gs.sum_sq);
}

absl::Status UpdatePass::Prepass(bool* aborted) {
  const auto& o = job_->spec.optim();
  for (const auto& task : request_.tasks()) {
    absl::Status st = Wait(task.index());
    if (absl::IsAborted(st)) {
      *aborted = true;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(st);
    ASSIGN_OR_RETURN(const MatrixGradient g, rule_.Gradient(*job_, task.index()));
    ASSIGN_OR_RETURN(const double sq, NormSquared(task.index(), g));
    norm2_ += sq;
  }
  const double norm = std::sqrt(norm2_);
  if (o.max_grad_norm() > 0 && norm > o.max_grad_norm()) {
    in_.clip = static_cast<float>(o.max_grad_norm() / (norm + 1e-6));
  }
  if (rule_.AwaitVerdictBeforeUpdates()) {
    absl::Status vs = verdict_.Await();
    if (absl::IsAborted(vs)) {
      *aborted = true;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(vs);
  }
  return absl::OkStatus();
}

absl::Status UpdatePass::UpdateOne(int i, bool prepass) {
  if (!prepass) {
    const double tw = MonotonicSeconds();
    absl::Status ws = Wait(i);
    waited_ += MonotonicSeconds() - tw;
    RETURN_IF_ERROR(ws);
  }
  const int layer = i / job_->layout.linears_per_layer();
  if (layer != current_layer_) {
    const double now = MonotonicSeconds();
    CloseLayer(now);
    current_layer_ = layer;
    layer_start_ = now;
  }
  ASSIGN_OR_RETURN(const MatrixGradient g, rule_.Gradient(*job_, i));
  if (!prepass) {
    ASSIGN_OR_RETURN(const double sq, NormSquared(i, g));
    norm2_ += sq;
  }
  RETURN_IF_ERROR(rule_.UpdateMatrix(job_, i, g, in_));
  job_->flags.PublishStep(i, in_.step);
  return absl::OkStatus();
}

void UpdatePass::CloseLayer(double now) {
  if (current_layer_ < 0) return;
  lspo::v1::LayerEvent* e = reply_.add_events();
  e->set_layer(current_layer_);
  e->set_what("update");
  e->set_start(layer_start_);
  e->set_end(now);
  e->set_actor("optimizer");
}

absl::StatusOr<lspo::v1::UpdateReply> UpdatePass::Run(double t_start) {
  const bool prepass = job_->spec.optim().max_grad_norm() > 0 || !request_.wait_for_grads();
  if (prepass) {
    bool aborted = false;
    RETURN_IF_ERROR(Prepass(&aborted));
    if (aborted) {
      reply_.set_aborted(true);
      return reply_;
    }
  }
  // A failure after the first update undoes every matrix this step updated; an abandoned
  // step (kAborted: the worker's verdict, or a wait it ended) is a reply, not an error.
  auto fail = [&](absl::Status st) -> absl::StatusOr<lspo::v1::UpdateReply> {
    rule_.RollBack();
    if (!absl::IsAborted(st)) return st;
    reply_.set_aborted(true);
    return reply_;
  };
  for (const auto& task : request_.tasks()) {
    if (absl::Status st = UpdateOne(task.index(), prepass); !st.ok()) return fail(st);
  }
  CloseLayer(MonotonicSeconds());
  // Keep the step only on the worker's verdict (a non-finite loss seen after the backward, a
  // gradient of another rank): otherwise every matrix goes back to its state before it.
  if (absl::Status vs = verdict_.Await(); !vs.ok()) return fail(vs);
  reply_.set_grad_norm(std::sqrt(norm2_));
  reply_.set_peak_rss_bytes(runtime::PeakRssBytes());
  reply_.set_clip_coefficient(in_.clip);
  reply_.set_seconds(MonotonicSeconds() - t_start - waited_ - verdict_.seconds_waited());
  return reply_;
}

}  // namespace

OptimizerCore::OptimizerCore() : slot_(&mu_, "optimizer") {}
OptimizerCore::OptimizerCore(OptimizerOptions options)
    : roots_(std::move(options.allowed_roots), "optimizer", "lsp_cpu_optimizer"),
      slot_(&mu_, "optimizer") {}
OptimizerCore::~OptimizerCore() = default;

absl::StatusOr<lspo::v1::LoadJobReply> OptimizerCore::LoadJob(const std::string& job_id,
                                                              const lspo::v1::JobSpec& spec,
                                                              const lspo::v1::ArenaLayout& layout) {
  // The roots first, before anything is opened or looked for (and before a stale job goes):
  // an existence check would tell a client which files exist outside them.
  RETURN_IF_ERROR(offload::CheckJobSpecPaths(spec, roots_));
  absl::MutexLock lock(&mu_);
  if (const OptimizerJob* stale = slot_.get(); stale != nullptr) {
    LOG(WARNING) << "optimizer: replacing stale job " << stale->id << " with " << job_id;
    slot_.Evict();
  }
  // The spec's mode as its arena layout carries it (offload/training_mode.h: an unset mode is
  // lsp, galore with offload is galore-offload).
  const lspo::v1::TrainingMode spec_mode = offload::ModeOf(spec).mode;
  if (layout.mode() != spec_mode) {
    return absl::InvalidArgumentError(
        absl::StrCat("the worker's arena '", layout.name(), "' is laid out for ",
                     lspo::v1::TrainingMode_Name(layout.mode()), " but the job spec's mode is ",
                     lspo::v1::TrainingMode_Name(spec_mode),
                     ": load the job on the worker and the optimizer with the same spec"));
  }
  {
    // A host without the memory for the fp32 master and the optimizer state is refused
    // before a weight is read (issue 42). A config that cannot be read is left to
    // LoadJobModel below, which names the problem.
    absl::StatusOr<model::LlamaConfig> config = offload::LoadJobModelConfig(spec);
    if (config.ok()) {
      RETURN_IF_ERROR(offload::CheckOptimizerHostMemory(spec, *config, spec_mode, layout.bytes()));
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  at::set_num_threads(spec.num_threads());
  auto job = std::make_unique<OptimizerJob>();
  job->tbb_threads = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, std::max(1, spec.num_threads()));
  job->id = job_id;
  job->spec = spec;
  job->layout = layout;
  ASSIGN_OR_RETURN(job->arena, runtime::ShmArena::Attach(layout.name(), layout.bytes()));
  ASSIGN_OR_RETURN(job->flags, offload::ArenaFlags(job->arena, layout));
  RETURN_IF_ERROR(offload::NumLayers(layout).status());
  ASSIGN_OR_RETURN(job->rule, MakeUpdateRule(layout.mode()));
  ASSIGN_OR_RETURN(auto m, offload::LoadJobModel(spec));
  job->model = std::make_unique<model::LlamaModel>(std::move(m));
  if (layout.linears_size() != job->model->num_linears()) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena layout has ", layout.linears_size(), " matrices, the model ",
                     job->model->num_linears(), ": worker and optimizer loaded different models"));
  }
  int64_t params = 0, state_bytes = 0;
  for (int i = 0; i < layout.linears_size(); ++i) {
    const auto& slot = layout.linears(i);
    // (m, n) fp32. The master is the model's own tensor, moved out (the model keeps only the
    // embedding and norms, for the output folder): a clone held every matrix twice, Σ m n · 4
    // bytes more than the state (449 MiB of peak RSS on SmolLM2-135M; ~4 GB at 1.1B).
    at::Tensor w0 = std::move(job->model->LinearWeight(i)).detach().contiguous();
    if (w0.size(0) != slot.m() || w0.size(1) != slot.n()) {
      return absl::InvalidArgumentError(
          absl::StrCat("arena slot ", slot.name(), " shape differs from the model"));
    }
    params += w0.numel();
    ASSIGN_OR_RETURN(const int64_t bytes, job->rule->AddMatrix(slot, std::move(w0)));
    state_bytes += bytes;
  }
  lspo::v1::LoadJobReply reply;
  reply.set_trainable_parameters(params);
  reply.set_optimizer_state_bytes(state_bytes);
  reply.set_device("cpu");
  reply.set_seconds(runtime::SecondsSince(t0));
  LOG(INFO) << "optimizer: loaded job " << job_id << ": fp32 master weights of " << params
            << " parameters, " << job->rule->Describe(layout);
  runtime::CompletionFlags flags = job->flags;
  slot_.Install(std::move(job), flags);
  return reply;
}

absl::Status OptimizerCore::SetProjectors(const std::string& job_id,
                                          const std::vector<int>& indices) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, slot_.Find(job_id));
  return job->rule->SetProjectors(job, indices);
}

absl::StatusOr<lspo::v1::UpdateReply> OptimizerCore::Update(
    const lspo::v1::UpdateRequest& request) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, slot_.Find(request.job_id()));
  // Published for UnloadJob, which may abandon this step while we wait (see the header).
  const auto busy = slot_.MarkBusy(request.step());
  const double t_start = MonotonicSeconds();
  const auto& o = job->spec.optim();
  StepInputs in;
  in.step = static_cast<uint32_t>(request.step());
  in.lr = request.lr();
  in.hyper.lr = static_cast<float>(request.lr());
  in.hyper.beta1 = static_cast<float>(o.beta1());
  in.hyper.beta2 = static_cast<float>(o.beta2());
  in.hyper.eps = static_cast<float>(o.eps());
  in.hyper.weight_decay = static_cast<float>(o.weight_decay());
  RETURN_IF_ERROR(lsp::ValidateAdamHyper(in.hyper));
  const absl::Duration timeout =
      absl::Seconds(request.wait_timeout_seconds() > 0 ? request.wait_timeout_seconds() : 600);
  for (const auto& task : request.tasks()) {
    const int i = task.index();
    if (i < 0 || i >= job->layout.linears_size()) {
      return absl::InvalidArgumentError(absl::StrCat("Update: bad linear index ", i));
    }
    RETURN_IF_ERROR(job->rule->CheckReady(*job, i));
  }
  UpdatePass pass(job, request, in, timeout);
  return pass.Run(t_start);
}

absl::Status OptimizerCore::AbortStep(const std::string& job_id, int step) {
  return slot_.Abort(job_id, step);
}

absl::StatusOr<lspo::v1::LayerWeightsReply> OptimizerCore::ExportLayerWeights(
    const std::string& job_id, int layer) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, slot_.Find(job_id));
  RETURN_IF_ERROR(job->rule->CheckLayerExport());
  ASSIGN_OR_RETURN(const int num_layers, offload::NumLayers(job->layout));
  if (layer < 0 || layer >= num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("ExportLayerWeights: layer ", layer, " is not in [0, ", num_layers, ")"));
  }
  RETURN_IF_ERROR(offload::TorchCall("export layer weights", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    // (largest layer's sum of m n) fp32
    ASSIGN_OR_RETURN(at::Tensor staging, offload::ArenaF32(job->arena, job->layout.staging()));
    int64_t offset = 0;
    const int per_layer = job->layout.linears_per_layer();
    for (int k = 0; k < per_layer; ++k) {
      const int i = layer * per_layer + k;
      const auto& slot = job->layout.linears(i);
      // (m, n) fp32 view
      at::Tensor dst = staging.narrow(0, offset, slot.m() * slot.n()).view({slot.m(), slot.n()});
      offset += slot.m() * slot.n();
      job->rule->WriteMasterWeight(i, dst);
    }
    return absl::OkStatus();
  }));
  return lspo::v1::LayerWeightsReply();
}

absl::StatusOr<lspo::v1::SaveReply> OptimizerCore::SaveModel(const std::string& job_id,
                                                             const std::string& dir) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "SaveModel", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, slot_.Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, at::Tensor>> tensors;  // HF name -> fp32 CPU tensor
  RETURN_IF_ERROR(offload::TorchCall("materialise master weights", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    absl::flat_hash_map<std::string, int> linear_of;
    for (int i = 0; i < job->layout.linears_size(); ++i) {
      linear_of[job->layout.linears(i).name()] = i;
    }
    for (auto& [name, t] : job->model->NamedTensors()) {
      auto it = linear_of.find(name);
      if (it == linear_of.end()) {
        tensors.emplace_back(name, t.detach().to(at::kFloat).contiguous());
        continue;
      }
      tensors.emplace_back(name,
                           job->rule->MasterWeight(it->second, job->layout.linears(it->second)));
    }
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(runtime::MakeDirs(dir));
  const std::string path = dir + "/model.safetensors";
  RETURN_IF_ERROR(offload::WriteModelSafetensors(tensors, path, offload::SaveDtypeOf(job->spec)));
  lspo::v1::SaveReply reply;
  reply.add_files(path);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::StateReply> OptimizerCore::SaveState(const std::string& job_id,
                                                              const std::string& dir, int step) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "SaveState", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, slot_.Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  lspo::v1::StateReply reply;
  const std::string path = dir + "/optimizer_state.safetensors";
  RETURN_IF_ERROR(offload::TorchCall("save optimizer state", [&]() -> absl::Status {
    offload::NamedTensors tensors;
    job->rule->AppendState(job->layout, &tensors);
    return offload::WriteTensorFile(
        path, tensors,
        {{"job_id", job->id}, {"mode", job->rule->name()}, {"step", std::to_string(step)}});
  }));
  reply.add_files(path);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::StateReply> OptimizerCore::LoadState(const std::string& job_id,
                                                              const std::string& dir, int step) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "LoadState", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, slot_.Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  const std::string path = dir + "/optimizer_state.safetensors";
  ASSIGN_OR_RETURN(model::SafetensorsFile file, model::SafetensorsFile::Open(path));
  const std::string what = absl::StrCat("optimizer state '", path, "'");
  {
    const auto& meta = file.metadata();
    auto get = [&](const char* key) {
      auto it = meta.find(key);
      return it == meta.end() ? std::string() : it->second;
    };
    const std::string mode = job->rule->name();
    if (get("mode") != mode || get("step") != std::to_string(step)) {
      return absl::DataLossError(absl::StrCat(what, " holds the ", get("mode"), " state of step ",
                                              get("step"), ", expected ", mode, " at step ", step));
    }
  }
  RETURN_IF_ERROR(offload::TorchCall("load optimizer state", [&]() -> absl::Status {
    // Every tensor is read and validated before the commit changes anything.
    ASSIGN_OR_RETURN(UpdateRule::Commit commit, job->rule->ReadState(job->layout, file, what));
    return commit();
  }));
  LOG(INFO) << "optimizer: restored the state of step " << step << " from " << dir;
  lspo::v1::StateReply reply;
  reply.add_files(path);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::Status OptimizerCore::UnloadJob(const std::string& job_id) {
  // An Update waiting for gradients holds mu_: abandon its step first (a no-op for another
  // job's id or when none waits). An Update that starts between this and the lock below is
  // one the caller itself sent, and runs to its end as usual.
  slot_.AbandonBusy(job_id);
  absl::MutexLock lock(&mu_);
  slot_.Unload(job_id);
  return absl::OkStatus();
}

}  // namespace lspo::optimizer
