// Shapes: W (m, n), m out features, n in features, as stored (fp32 or bf16).
#include "gpu_worker/worker_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "third_party/torch/torch_api.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "data/datasets.h"
#include "data/sft.h"
#include "glog/logging.h"
#include "gpu_worker/calibration.h"
#include "gpu_worker/device_offload.h"
#include "gpu_worker/evaluator.h"
#include "gpu_worker/job_loading.h"
#include "gpu_worker/lsp_path.h"
#include "gpu_worker/memory_check.h"
#include "gpu_worker/rank_group.h"
#include "gpu_worker/step_runner.h"
#include "gpu_worker/update_path.h"
#include "gpu_worker/worker_job.h"
#include "gpu_worker/worker_state.h"
#include "lsp/projector.h"
#include "offload/arena_tensors.h"
#include "offload/collective.h"
#include "offload/hf_export.h"
#include "offload/job_assets.h"
#include "offload/memory_plan.h"
#include "offload/spec_paths.h"
#include "offload/torch_call.h"
#include "offload/training_mode.h"
#include "runtime/clock.h"
#include "runtime/cuda/device_runtime.h"
#include "runtime/file_io.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"
#include "runtime/tfrecord.h"
#include "runtime/util.h"
#include "tbb/global_control.h"

namespace lspo::worker {

using lspo::v1::JobSpec;
using runtime::MonotonicSeconds;

WorkerCore::WorkerCore() : slot_(&mu_, "worker") {}
WorkerCore::WorkerCore(WorkerOptions options)
    : roots_(std::move(options.allowed_roots), "worker", "lsp_gpu_worker"),
      skip_memory_check_(options.skip_memory_check),
      faults_(std::move(options.faults)),
      slot_(&mu_, "worker") {}
WorkerCore::~WorkerCore() = default;

absl::StatusOr<lspo::v1::LoadJobReply> WorkerCore::LoadJob(
    const std::string& job_id, const JobSpec& requested,
    const std::vector<int>* resume_candidates) {
  // The roots first, before anything is opened or looked for (and before a stale job goes):
  // an existence check would tell a client which files exist outside them.
  RETURN_IF_ERROR(offload::CheckJobSpecPaths(requested, roots_));
  // The spec this worker runs: the requested one with the settings it chose where it left
  // them unset (CheckJobFitsDevice).
  JobSpec spec = requested;
  std::vector<std::string> chosen;
  absl::MutexLock lock(&mu_);
  if (const WorkerJob* loaded = slot_.get(); loaded != nullptr) {
    if (loaded->id == job_id) {
      return absl::FailedPreconditionError(absl::StrCat("job '", job_id, "' already loaded"));
    }
    LOG(WARNING) << "worker: replacing stale job " << loaded->id << " with " << job_id;
    slot_.Evict();
  }
  auto t0 = std::chrono::steady_clock::now();
  at::set_num_threads(spec.num_threads());
  ASSIGN_OR_RETURN(const bool use_cuda, UseCuda(spec));
  if (!use_cuda && spec.device_memory_limit_mb() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec field device_memory_limit_mb = ", spec.device_memory_limit_mb(),
        " caps a CUDA worker's device memory, but this job runs on the CPU: remove the field, "
        "or run with device: cuda on a GPU host"));
  }
  if (offload::ModeOf(spec).learned_projectors && !spec.lsp().has_refresh_every()) {
    // Resolved here, where the weights' dtype is known, before data-parallel ranks compare
    // their specs (a resumed rank has its checkpoint's); the scheduler adopts it.
    spec.mutable_lsp()->set_refresh_every(
        offload::LspRefreshEvery(spec, offload::SixteenBitWorkerWeights(spec, use_cuda)));
  }
  RETURN_IF_ERROR(CheckJobFitsDevice(&spec, use_cuda, skip_memory_check_, &chosen));
  // Unset and not chosen (the CPU, data parallel, an unreadable config, the check skipped).
  if (spec.micro_batch_size() < 1) spec.set_micro_batch_size(offload::kDefaultMicroBatchSize);
  auto job = std::make_unique<WorkerJob>();
  if (spec.distributed().world_size() > 1) {
    // A CUDA worker's collectives run over Gloo too, on host copies (offload/collective.h):
    // in lsp and zero what is summed goes to the host for the CPU optimizer anyway.
    ASSIGN_OR_RETURN(job->ranks.collective, JoinGroup(spec));
  }
  job->tbb_threads = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, std::max(1, spec.num_threads()));
  job->id = job_id;
  job->spec = spec;
  SetFaults(faults_, job.get());
  ASSIGN_OR_RETURN(job->path, MakeUpdatePath(spec));
  job->data.classification = spec.data().format() == lspo::v1::DATA_FORMAT_CLASSIFICATION;
  RETURN_IF_ERROR(LoadAssets(job.get()));
  int agreed_resume_step = 0;
  if (job->ranks.collective != nullptr && job->ranks.collective->world_size() > 1) {
    RETURN_IF_ERROR(CheckRanksLoadedTheSame(*job));
    if (resume_candidates != nullptr) {
      // resume_from: latest (issue 43): one checkpoint for every rank, the newest all hold.
      ASSIGN_OR_RETURN(agreed_resume_step, offload::AgreeOnNewestCommonStep(*job->ranks.collective,
                                                                            *resume_candidates));
    }
  } else if (resume_candidates != nullptr && !resume_candidates->empty()) {
    agreed_resume_step = *std::max_element(resume_candidates->begin(), resume_candidates->end());
  }
  // Storage dtype and device (and the compensation residuals of the fp32 weights: (m, n) bf16
  // per matrix, or none).
  ASSIGN_OR_RETURN(std::vector<at::Tensor> residuals, PlaceModel(job.get(), use_cuda));
  const auto& model = *job->model;
  lspo::v1::LoadJobReply reply;
  RETURN_IF_ERROR(job->path->Setup(job.get(), &reply));
  const int64_t trainable = job->path->TrainableParameters(*job);
  reply.set_optimizer_state_bytes(job->path->OptimizerStateBytes(*job));
  reply.set_offload_bytes_per_step(job->path->OffloadBytesPerStep(*job));
  if (!residuals.empty()) {
    ASSIGN_OR_RETURN(LspPath * lsp_path, LspPathOf(job.get(), "compensated apply"));
    RETURN_IF_ERROR(offload::TorchCall("compensation residuals", [&]() -> absl::Status {
      return lsp_path->InitCompensation(job.get(), std::move(residuals));
    }));
  }
  job->plane.pending_step.assign(job->linears.size(), 0);
  job->plane.pending_decay.assign(job->linears.size(), 1.0);
  job->times.offload_done.assign(model.config().num_layers, 0.0);
  job->times.offload_secs.assign(model.config().num_layers, 0.0);
  InstallLayerHooks(job.get());
  // Examples, also when packed (train_data.packed_rows counts the rows).
  reply.set_train_examples(spec.data().packing() ? job->data.train_summary.examples()
                                                 : static_cast<int64_t>(job->data.train.size()));
  reply.set_eval_examples(job->data.eval.size());
  *reply.mutable_train_data() = job->data.train_summary;
  if (!job->data.eval.empty()) *reply.mutable_eval_data() = job->data.eval_summary;
  reply.set_trainable_parameters(trainable);
  // The card too on CUDA, for the run header and the status (JobStatus.device).
  std::string device = job->device.str();
  if (job->cuda) {
    absl::StatusOr<std::string> card = runtime::cuda::DeviceDescription(job->device.index());
    if (card.ok()) absl::StrAppend(&device, " (", *card, ")");
  }
  reply.set_device(device);
  reply.set_activation_checkpointing(spec.activation_checkpointing());
  reply.set_micro_batch_size(spec.micro_batch_size());
  reply.set_refresh_every(spec.lsp().refresh_every());
  for (const std::string& line : chosen) reply.add_chosen_settings(line);
  reply.set_agreed_resume_step(agreed_resume_step);
  reply.set_seconds(runtime::SecondsSince(t0));
  LOG(INFO) << "worker: loaded job " << job_id << " (mode " << job->path->name()
            << "): " << job->data.train.size()
            << (spec.data().packing() ? " packed train rows / " : " train / ")
            << job->data.eval.size() << " eval examples, " << trainable
            << " trainable parameters in " << job->linears.size() << " matrices";
  runtime::CompletionFlags flags = job->plane.flags;
  std::shared_ptr<std::atomic<uint32_t>> stop_step = job->progress.stop_step;
  slot_.Install(std::move(job), std::move(flags), std::move(stop_step));
  return reply;
}

absl::StatusOr<lspo::v1::FitProjectorsReply> WorkerCore::FitProjectors(const std::string& job_id,
                                                                       int step) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, slot_.Find(job_id));
  return RunProjectorCheck(job, step);
}

absl::StatusOr<lspo::v1::TrainStepReply> WorkerCore::TrainStep(
    const std::string& job_id, int step, double lr, const lspo::v1::StepPlan& requested) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, slot_.Find(job_id));
  const lspo::v1::StepPlan& plan = requested;
  // Published for UnloadJob, which may abandon this step while we wait (see the header).
  const auto busy = slot_.MarkBusy(step);
  RETURN_IF_ERROR(job->path->CheckReady(*job));
  if (step < 1) return absl::InvalidArgumentError("TrainStep: step is 1-based");
  auto t_step = std::chrono::steady_clock::now();
  auto& model = *job->model;
  const bool offloaded = job->path->offloaded();
  const int64_t num_layers = model.config().num_layers;
  const int split = std::clamp<int>(plan.split_layer(), 0, static_cast<int>(num_layers));
  lspo::v1::TrainStepReply reply;
  auto* metrics = reply.mutable_metrics();
  metrics->set_step(step);
  metrics->set_lr(lr);
  metrics->set_split_layer(plan.overlap() ? split : 0);
  BeginStepState(job);
  // The optimizer attached the arena before any step: drop its name so that a crash from
  // here on leaves nothing in /dev/shm (lsp mode already did so at the first fit).
  if (offloaded) job->plane.arena.Unlink();
  absl::Status st = offload::TorchCall("train step", [&]() -> absl::Status {
    model.ClearHookStatus();
    int64_t total = 0, input_tokens = 0, padding_tokens = 0;
    const std::vector<data::Batch> batches =
        StepBatches(job, step, &total, &input_tokens, &padding_tokens);
    offload::Collective* group = job->ranks.collective.get();
    const int64_t group_bytes0 = group != nullptr ? group->all_reduce_bytes() : 0;
    const double group_secs0 = group != nullptr ? group->all_reduce_seconds() : 0;
    if (group != nullptr) RETURN_IF_ERROR(AgreeOnStep(*job, step, plan.overlap(), &total));
    job->progress.step = static_cast<uint32_t>(step);
    job->path->ZeroGrads(job);
    RETURN_IF_ERROR(RunMicroBatches(job, batches, total, step, plan, &reply));
    if (group != nullptr) RETURN_IF_ERROR(AgreeOnOutcome(group, &reply));
    if (reply.nonfinite()) return absl::OkStatus();
    if (offloaded && plan.overlap()) {
      // The verdict (issue 43): the loss and every gradient are finite, on every rank. The
      // overlapped optimizer took the step while the backward ran, keeping what it needs to
      // undo it until now; a skipped step instead aborts the flags (below), and it undoes.
      job->plane.flags.PublishVerdict(static_cast<uint32_t>(step));
    }
    StepContext ctx;
    ctx.collective = group;
    ctx.step = static_cast<uint32_t>(step);
    ctx.lr = lr;
    ctx.overlap = plan.overlap();
    ctx.split_layer = split;
    RETURN_IF_ERROR(job->path->FinishStep(job, ctx, &reply));
    if (group != nullptr) {
      metrics->set_all_reduce_bytes(group->all_reduce_bytes() - group_bytes0);
      const double secs = group->all_reduce_seconds() - group_secs0;
      metrics->set_all_reduce_seconds(secs);
      metrics->set_all_reduce_exposed_seconds(std::max(
          0.0, secs - job->times.rank_sum_hidden_seconds + job->times.rank_sum_wait_seconds));
    }
    if (reply.nonfinite()) return absl::OkStatus();
    RETURN_IF_ERROR(RecordStepEnd(job, metrics));
    const double secs = runtime::SecondsSince(t_step);
    metrics->set_step_seconds(secs);
    metrics->set_tokens_per_second(secs > 0 ? input_tokens / secs : 0);
    metrics->set_input_tokens(input_tokens);
    metrics->set_padding_tokens(padding_tokens);
    metrics->set_wait_seconds(job->times.wait_seconds);
    metrics->set_offload_seconds(job->times.offload_seconds);
    return absl::OkStatus();
  });
  if (!st.ok()) {
    // A pass stopped at a layer boundary (LayerPassStopped) reports the hook's kCancelled.
    if (absl::Status hs = model.HookStatus(); absl::IsCancelled(hs)) st = hs;
  }
  job->progress.publish_step = 0;
  if (offloaded && plan.overlap() && (!st.ok() || reply.nonfinite())) {
    // The optimizer may be waiting for this step's gradients: release it.
    job->plane.flags.Abort(static_cast<uint32_t>(step));
    std::fill(job->plane.pending_step.begin(), job->plane.pending_step.end(), 0);
  }
  if (!st.ok()) return st;
  // Through the end of this step (VmHWM was reset when the first step began).
  metrics->set_worker_peak_rss_bytes(runtime::PeakRssBytes());
  for (auto& e : job->times.events) *reply.add_events() = std::move(e);
  job->times.events.clear();
  return reply;
}

absl::StatusOr<lspo::v1::ApplyReply> WorkerCore::ApplyUpdates(
    const std::string& job_id, int step, const lspo::v1::ApplyRequest& request) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, slot_.Find(job_id));
  // Published for UnloadJob, which may abandon this step while we wait (see the header).
  const auto busy = slot_.MarkBusy(step);
  if (!job->path->offloaded()) {
    return absl::FailedPreconditionError(
        absl::StrCat("ApplyUpdates needs a mode with an optimizer service; this job's mode ",
                     job->path->name(), " trains on the worker"));
  }
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& task : request.tasks()) {
    if (task.index() < 0 || task.index() >= job->plane.layout.linears_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("ApplyUpdates: linear index ", task.index(), " out of range"));
    }
  }
  // Check every step first so that a bad one leaves all weights untouched.
  for (const auto& task : request.tasks()) {
    const int i = task.index();
    if (job->plane.flags.step_seq(i) < static_cast<uint32_t>(step)) {
      return absl::FailedPreconditionError(
          absl::StrCat("ApplyUpdates: the optimizer has not written step ", step, " of ",
                       job->linears[i].name, " (Update first)"));
    }
    RETURN_IF_ERROR(job->path->CheckUpdate(job, i, static_cast<uint32_t>(step)));
  }
  const double decay = job->path->WorkerDecay(job->spec, request.lr());
  lspo::v1::ApplyReply reply;
  absl::Status st = offload::TorchCall("apply", [&]() -> absl::Status {
    for (const auto& task : request.tasks()) {
      const double t1 = MonotonicSeconds();
      RETURN_IF_ERROR(
          job->path->ApplyUpdate(job, task.index(), static_cast<uint32_t>(step), decay));
      auto* e = reply.add_events();
      e->set_layer(task.index() / model::kLinearsPerLayer);
      e->set_what("apply");
      e->set_start(t1);
      e->set_end(MonotonicSeconds());
      e->set_actor("worker");
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::LayerWeightsReply> WorkerCore::ImportLayerWeights(
    const lspo::v1::LayerWeightsRequest& request) {
  const std::string& job_id = request.job_id();
  const int layer = request.layer();
  const bool measure_only = request.measure_only();
  if (measure_only && request.skip_measure()) {
    return absl::InvalidArgumentError(
        "ImportLayerWeights: measure_only and skip_measure together would do nothing");
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, slot_.Find(job_id));
  RETURN_IF_ERROR(LspPathOf(job, "ImportLayerWeights").status());
  const int64_t num_layers = job->model->config().num_layers;
  if (layer < 0 || layer >= num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("ImportLayerWeights: layer ", layer, " is not in [0, ", num_layers, ")"));
  }
  lspo::v1::LayerWeightsReply reply;
  if (request.skip_measure()) {
    RETURN_IF_ERROR(offload::TorchCall("refresh layer weights", [&]() -> absl::Status {
      RETURN_IF_ERROR(ApplyPending(job, layer));  // The other layers' updates stay deferred.
      ASSIGN_OR_RETURN(at::Tensor staging,        // fp32, a view of the arena (host)
                       offload::ArenaF32(job->plane.arena, job->plane.layout.staging()));
      ASSIGN_OR_RETURN(LspPath * lsp_path, LspPathOf(job, "ImportLayerWeights"));
      at::NoGradGuard no_grad;
      int64_t offset = 0;
      for (int64_t k = 0; k < model::kLinearsPerLayer; ++k) {
        const int64_t i = layer * model::kLinearsPerLayer + k;
        const at::Tensor& w = job->model->LinearWeight(i);
        // (m, n) fp32 on the host: copied into w's dtype and device by RefreshFromMaster.
        lsp_path->RefreshFromMaster(job, i, staging.narrow(0, offset, w.numel()).view(w.sizes()));
        offset += w.numel();
      }
      return absl::OkStatus();
    }));
    return reply;
  }
  RETURN_IF_ERROR(offload::TorchCall("import layer weights", [&]() -> absl::Status {
    RETURN_IF_ERROR(ApplyPending(job, -1));
    // (largest layer's sum of m n) fp32, a view of the arena.
    ASSIGN_OR_RETURN(at::Tensor staging,
                     offload::ArenaF32(job->plane.arena, job->plane.layout.staging()));
    at::NoGradGuard no_grad;
    int64_t offset = 0;
    ASSIGN_OR_RETURN(LspPath * lsp_path, LspPathOf(job, "ImportLayerWeights"));
    double max_change = 0, max_drift = 0, max_ulps = 0;
    for (int64_t k = 0; k < model::kLinearsPerLayer; ++k) {
      const int64_t i = layer * model::kLinearsPerLayer + k;
      at::Tensor& w = job->model->LinearWeight(i);  // (m, n) as stored
      // (m, n) fp32
      at::Tensor src = staging.narrow(0, offset, w.numel()).view(w.sizes()).to(w.device());
      offset += w.numel();
      max_change = std::max(max_change, (w.to(at::kFloat) - src).abs().max().item<double>());
      max_drift = std::max(
          max_drift,
          (w.to(at::kFloat) - src.to(w.scalar_type()).to(at::kFloat)).abs().max().item<double>());
      max_ulps = std::max(max_ulps, lsp::MaxDriftUlps(w, src));
      if (!measure_only) lsp_path->RefreshFromMaster(job, i, src);
    }
    reply.set_max_abs_change(max_change);
    reply.set_max_abs_drift(max_drift);
    reply.set_max_drift_ulps(max_ulps);
    return absl::OkStatus();
  }));
  return reply;
}

absl::StatusOr<lspo::v1::EvalMetrics> WorkerCore::Evaluate(const std::string& job_id, int step,
                                                           const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, slot_.Find(job_id));
  return EvaluateJob(job, step, cancelled);
}

absl::StatusOr<lspo::v1::SaveReply> WorkerCore::SaveArtifacts(const std::string& job_id,
                                                              const std::string& dir) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "SaveArtifacts", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, slot_.Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(offload::TorchCall("flush updates", [&] { return ApplyPending(job, -1); }));
  // generation_config.json: the input folder's (sampling defaults, eos list) when it had one,
  // else the special ids of the config. Offloaded modes: the scheduler writes the optimizer's
  // master weights instead of the worker's copy.
  const std::string gen_source = job->spec.model().format() == lspo::v1::MODEL_FORMAT_HF
                                     ? job->spec.model().path() + "/generation_config.json"
                                     : "";
  std::vector<std::string> files;
  RETURN_IF_ERROR(offload::TorchCall("save artifacts", [&]() -> absl::Status {
    offload::NamedTensors weights;
    if (!job->path->offloaded()) weights = job->path->ExportedTensors(job);
    ASSIGN_OR_RETURN(
        files, offload::WriteHfModelFolder(job->model->config(), *job->data.tokenizer, gen_source,
                                           job->path->offloaded() ? nullptr : &weights, dir,
                                           offload::SaveDtypeOf(job->spec)));
    ASSIGN_OR_RETURN(std::vector<std::string> own, job->path->WriteArtifacts(job, dir));
    files.insert(files.end(), own.begin(), own.end());
    return absl::OkStatus();
  }));
  lspo::v1::SaveReply reply;
  for (const std::string& f : files) reply.add_files(f);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::StateReply> WorkerCore::SaveState(const std::string& job_id,
                                                           const std::string& dir, int step) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "SaveState", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, slot_.Find(job_id));
  return SaveWorkerState(job, dir, step);
}

absl::StatusOr<lspo::v1::StateReply> WorkerCore::LoadState(const std::string& job_id,
                                                           const std::string& dir, int step) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "LoadState", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, slot_.Find(job_id));
  return LoadWorkerState(job, dir, step);
}

absl::Status WorkerCore::AbortStep(const std::string& job_id, int step) {
  return slot_.Abort(job_id, step);
}

absl::Status WorkerCore::UnloadJob(const std::string& job_id) {
  // A TrainStep / ApplyUpdates waiting for updates holds mu_: abandon its step first (a
  // no-op for another job's id or when none waits).
  slot_.AbandonBusy(job_id);
  absl::MutexLock lock(&mu_);
  slot_.Unload(job_id);
  return absl::OkStatus();
}

}  // namespace lspo::worker
