#include "scheduler/job_runner.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "offload/arena_layout.h"
#include "report/run_report.h"
#include "runtime/clock.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"
#include "scheduler/checkpoint.h"
#include "scheduler/lr_schedule.h"
#include "scheduler/step_executor.h"
#include "spec/job_spec.h"

namespace lspo::scheduler {
namespace {

namespace v1 = lspo::v1;

constexpr double kUnloadDeadlineSeconds = 60;

}  // namespace

double JobRunner::Now() { return runtime::MonotonicSeconds(); }

nlohmann::json JobRunner::ToJson(const google::protobuf::Message& m) {
  return nlohmann::json::parse(runtime::ProtoToJson(m, runtime::ProtoJsonPrint::WithDefaults()));
}

JobRunner::JobRunner(std::string job_id, v1::JobSpec spec, WorkerClient* worker,
                     OptimizerClient* optimizer, JobHost* host, RunnerOptions options)
    : id_(std::move(job_id)),
      spec_(std::move(spec)),
      worker_(worker),
      optimizer_(optimizer),
      host_(host),
      options_(options),
      mode_(offload::ModeOf(spec_)),
      lsp_(mode_.learned_projectors),
      offload_(mode_.offloaded()),
      dl_(options.rpc_deadline_seconds) {
  if (!offload_) optimizer_ = nullptr;
}

void JobRunner::Phase(const std::string& phase) {
  LOG(INFO) << "scheduler: " << id_ << ": " << phase;
  host_->UpdateStatus([&](v1::JobStatus* s) { s->set_phase(phase); });
}

void JobRunner::Log(const nlohmann::json& line) {
  absl::Status st = log_->Metrics(line);
  if (!st.ok() && !log_failed_) {
    // The run goes on (a full disk is reported by the next checkpoint); warn once.
    log_failed_ = true;
    LOG(WARNING) << "scheduler: " << id_ << ": run log: " << st;  // Names the file.
  }
}

absl::Status JobRunner::CheckCancel() const {
  if (host_->CancelRequested()) return absl::CancelledError("cancelled by the user");
  return absl::OkStatus();
}

absl::Status JobRunner::Run() {
  t_start_ = Now();
  RETURN_IF_ERROR(runtime::MakeDirs(spec_.output_dir()));
  RETURN_IF_ERROR(SelectResume());
  ASSIGN_OR_RETURN(RunLog log, RunLog::Open(spec_.output_dir(), /*append=*/start_step_ > 0,
                                            /*with_timeline=*/offload_));
  log_.emplace(std::move(log));
  if (!superseded_.is_null()) Log(superseded_);
  absl::Status st = Load();
  if (st.ok()) {
    InitSummary();
    if (start_step_ > 0) RestoreFromCheckpoint();
    st = Train();
    if (st.ok()) st = Finish();
  }
  if (loaded_) UnloadPeers();  // Whatever happened once the worker had the job.
  // The run report (report.html) from metrics.jsonl, for a failed job too; a report that
  // cannot be written is a warning, never the job's error.
  if (log_.has_value()) {
    (void)log_->Sync();
    const std::string outcome = st.ok() ? "succeeded"
                                : absl::IsCancelled(st)
                                    ? absl::StrCat("cancelled (", st.message(), ")")
                                    : absl::StrCat("failed: ", st.message());
    if (absl::Status report = WriteRunReport(spec_.output_dir(), outcome); !report.ok()) {
      LOG(WARNING) << "scheduler: " << id_ << ": run report: " << report;
    }
  }
  return st;
}

absl::Status JobRunner::Load() {
  // Load on the worker (creates the arena in lsp/zero mode), then the optimizer. A job resumed
  // after a scheduler restart may still be loaded there (the actors outlived the scheduler):
  // unload it first (unknown ids are ignored; a dead actor fails at LoadJob below).
  Phase("loading model and data");
  if (lsp_ && spec_.lsp().apply_rounding() == v1::APPLY_ROUNDING_UNSPECIFIED) {
    // Written out (after a resume took the checkpoint's), so that the job's checkpoints tell
    // today's default from the compensated one that an unset field meant before 2026-12-07.
    spec_.mutable_lsp()->set_apply_rounding(offload::LspApplyRounding(spec_));
  }
  v1::UnloadJobRequest u;
  u.set_job_id(id_);
  if (optimizer_ != nullptr) (void)optimizer_->UnloadJob(u, kUnloadDeadlineSeconds);
  (void)worker_->UnloadJob(u, kUnloadDeadlineSeconds);
  v1::LoadJobRequest load;
  load.set_job_id(id_);
  *load.mutable_spec() = spec_;
  // Data parallel: every rank's worker takes part in the agreement (a collective), each
  // offering what it may resume from: with latest every verified checkpoint of its lineage,
  // with a path that checkpoint's step, starting afresh nothing. Ranks that cannot agree
  // (another step, or some start afresh) fail here, each naming every rank's newest.
  const bool agree = spec_.distributed().world_size() > 1;
  if (agree) {
    load.set_agree_resume(true);
    if (spec_.resume_from() == "latest") {
      for (const ResumeCandidate& c : resume_candidates_) load.add_resume_candidate_steps(c.step);
    } else if (start_step_ > 0) {
      load.add_resume_candidate_steps(start_step_);
    }
  }
  ASSIGN_OR_RETURN(wload_, worker_->LoadJob(load, dl_));
  loaded_ = true;
  host_->UpdateStatus([&](v1::JobStatus* s) { s->set_device(wload_.device()); });
  if (!spec_.has_micro_batch_size()) {
    // The worker's choice (issue 42; a worker of an older version: its default, 8).
    spec_.set_micro_batch_size(wload_.micro_batch_size() > 0 ? wload_.micro_batch_size() : 8);
    *load.mutable_spec() = spec_;
  }
  if (lsp_ && !spec_.lsp().has_refresh_every()) {
    // The rolling refresh the worker resolved for its weights' dtype (issue 42), written into
    // the job so that its checkpoints say what it ran (a worker of an older version: 0).
    spec_.mutable_lsp()->set_refresh_every(wload_.refresh_every());
    *load.mutable_spec() = spec_;
  }
  RETURN_IF_ERROR(CountEpochSteps());
  *load.mutable_spec() = spec_;
  if (agree && wload_.agreed_resume_step() != start_step_) {
    // Another rank does not hold this rank's newest checkpoint (it died before committing
    // it): resume from the newest one every rank holds.
    const int agreed = wload_.agreed_resume_step();
    auto it = std::find_if(resume_candidates_.begin(), resume_candidates_.end(),
                           [&](const ResumeCandidate& c) { return c.step == agreed; });
    if (it == resume_candidates_.end()) {
      return absl::InternalError(absl::StrCat(
          "distributed: the ranks agreed on resuming from step ", agreed,
          ", which this rank does not hold (report this: the worker agrees on held steps)"));
    }
    LOG(WARNING) << "scheduler: " << id_ << ": rank " << spec_.distributed().rank()
                 << " holds step " << start_step_ << " but not every rank does: resuming from "
                 << it->dir << ", the newest checkpoint every rank holds";
    Log({{"kind", "resume_agreed"},
         {"own_newest", start_step_},
         {"step", agreed},
         {"checkpoint", it->dir}});
    resume_dir_ = it->dir;
    resume_state_ = it->state;
    RETURN_IF_ERROR(AdoptResume());
  }
  if (offload_) {
    // A layout this scheduler cannot split into layers (a worker of another version) fails
    // now, not after the evaluation and the projector fit.
    ASSIGN_OR_RETURN(num_layers_, offload::NumLayers(wload_.arena()));
  }
  if (optimizer_ != nullptr) {
    *load.mutable_arena() = wload_.arena();
    ASSIGN_OR_RETURN(v1::LoadJobReply oload, optimizer_->LoadJob(load, dl_));
    optimizer_state_bytes_ = oload.optimizer_state_bytes();
  }
  if (start_step_ > 0) {
    Phase(absl::StrCat("restoring the training state of step ", start_step_));
    v1::StateRequest sreq;
    sreq.set_job_id(id_);
    sreq.set_dir(resume_dir_);
    sreq.set_step(start_step_);
    RETURN_IF_ERROR(worker_->LoadState(sreq, dl_).status());
    if (optimizer_ != nullptr) RETURN_IF_ERROR(optimizer_->LoadState(sreq, dl_).status());
  }
  return absl::OkStatus();
}

absl::Status JobRunner::CountEpochSteps() {
  if (spec_.steps() != 0 || !(spec_.epochs() > 0)) return absl::OkStatus();
  // The rows the data order walks: packed rows with data.packing, else the examples.
  const int64_t rows =
      spec_.data().packing() ? wload_.train_data().packed_rows() : wload_.train_examples();
  spec_.set_steps(spec::StepsForEpochs(spec_, rows));
  LOG(INFO) << "scheduler: " << id_ << ": " << spec_.epochs() << " epochs of " << rows
            << " training rows = " << spec_.steps() << " steps";
  Log({{"kind", "epochs"},
       {"epochs", spec_.epochs()},
       {"train_rows", rows},
       {"steps", spec_.steps()}});
  host_->UpdateStatus([&](v1::JobStatus* s) { s->set_total_steps(spec_.steps()); });
  if (start_step_ > spec_.steps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", resume_dir_, "' is at step ", start_step_, " but ", spec_.epochs(),
        " epochs of this job's data are ", spec_.steps(), " steps: raise epochs"));
  }
  return absl::OkStatus();
}

void JobRunner::UnloadPeers() {
  v1::UnloadJobRequest u;
  u.set_job_id(id_);
  if (optimizer_ != nullptr) (void)optimizer_->UnloadJob(u, kUnloadDeadlineSeconds);
  absl::Status st = worker_->UnloadJob(u, kUnloadDeadlineSeconds).status();
  // A dead worker cannot remove its arena: do it here (same host; harmless otherwise).
  const std::string& arena = wload_.arena().name();
  if (!st.ok() && !arena.empty() && shm_unlink(arena.c_str()) == 0) {
    LOG(WARNING) << "scheduler: removed the arena " << arena << " of " << id_
                 << " left by an unreachable worker";
  }
}

std::string JobRunner::WorkerWeightDtype() const {
  return spec_.weight_dtype() != lspo::v1::WEIGHT_DTYPE_UNSPECIFIED
             ? runtime::EnumShortName(spec_.weight_dtype())
             : (absl::StartsWith(wload_.device(), "cuda") ? "bf16" : "fp32");
}

void JobRunner::InitSummary() {
  summary_["job_id"] = id_;
  summary_["mode"] = std::string(mode_.name);
  summary_["schedule"] = offload_ ? runtime::EnumShortName(spec_.schedule()) : "none";
  // The device the worker trains on ("cpu", "cuda:0"), and its weights' dtype: the spec's, or
  // where the spec left both unset the worker's default for its device (spec/job_spec.h).
  summary_["device"] = wload_.device();
  summary_["weight_dtype"] = WorkerWeightDtype();
  // What the worker runs with: the spec's setting or its own choice (chosen_settings).
  summary_["activation_checkpointing"] = wload_.activation_checkpointing();
  if (wload_.chosen_settings_size() > 0) {
    summary_["chosen_settings"] =
        std::vector<std::string>(wload_.chosen_settings().begin(), wload_.chosen_settings().end());
    for (const std::string& line : wload_.chosen_settings()) {
      LOG(INFO) << "scheduler: " << id_ << ": the worker chose " << line;
      Log({{"kind", "settings_chosen"}, {"setting", line}});
    }
  }
  summary_["device_memory_limit_mb"] = spec_.device_memory_limit_mb();
  summary_["world_size"] = std::max(1, spec_.distributed().world_size());
  summary_["rank"] = spec_.distributed().rank();
  summary_["d"] = lsp_ ? spec_.lsp().d() : 0;
  summary_["r"] = lsp_ ? spec_.lsp().r() : 0;
  summary_["d_ratio"] = lsp_ ? spec_.lsp().d_ratio() : 0.0;
  // The rule for matrices with a side no wider than d (proto NarrowRule; unset = one-sided).
  summary_["narrow"] = !lsp_                        ? "none"
                       : spec_.lsp().d_ratio() != 0 ? "not used (d_ratio)"
                       : spec_.lsp().narrow() == v1::NARROW_RULE_UNSPECIFIED
                           ? "one-sided"
                           : runtime::EnumShortName(spec_.lsp().narrow());
  // How steps land in 16-bit worker weights (proto ApplyRounding; unset = compensated).
  summary_["apply_rounding"] =
      !lsp_ ? "none" : runtime::EnumShortName(offload::LspApplyRounding(spec_));
  if (lsp_) summary_["refresh_every"] = spec_.lsp().refresh_every();
  if (mode_.settings_block == "lora") {
    summary_["lora_r"] = spec_.lora().r();
    summary_["lora_alpha"] = spec_.lora().alpha();
    summary_["lora_target_modules"] = std::vector<std::string>(
        spec_.lora().target_modules().begin(), spec_.lora().target_modules().end());
    summary_["lora_use_rslora"] = spec_.lora().use_rslora();
  }
  if (mode_.settings_block == "galore") {
    summary_["galore_rank"] = spec_.galore().rank();
    summary_["galore_update_proj_gap"] = spec_.galore().update_proj_gap();
    summary_["galore_scale"] = spec_.galore().scale();
    summary_["galore_offload"] = mode_.offloaded();
  }
  summary_["steps"] = spec_.steps();
  if (spec_.epochs() > 0) summary_["epochs"] = spec_.epochs();
  summary_["micro_batch_size"] = spec_.micro_batch_size();
  summary_["grad_accum"] = spec_.grad_accum();
  summary_["seq_len"] = spec_.seq_len();
  summary_["lr"] = spec_.optim().lr();
  summary_["train_examples"] = wload_.train_examples();
  summary_["packing"] = spec_.data().packing();
  if (spec_.data().packing()) summary_["train_packed_rows"] = wload_.train_data().packed_rows();
  summary_["eval_examples"] = wload_.eval_examples();
  summary_["trainable_parameters"] = wload_.trainable_parameters();
  // Optimizer state (master weights, moments) on whichever peer holds it, and the bytes one
  // step moves between worker and optimizer (proto/peer.proto LoadJobReply).
  summary_["optimizer_state_bytes"] = wload_.optimizer_state_bytes() + optimizer_state_bytes_;
  summary_["offload_bytes_per_step"] = wload_.offload_bytes_per_step();
  summary_["model"] = spec_.model().format() == v1::MODEL_FORMAT_TINY_RANDOM
                          ? std::string("tiny-random")
                          : spec_.model().path();
  summary_["model_format"] = runtime::EnumShortName(spec_.model().format());
  summary_["train_path"] = spec_.data().train_path();
  has_eval_ = wload_.eval_examples() > 0 || !spec_.data().perplexity_path().empty();
  if (has_eval_ && spec_.distributed().world_size() > 1 && spec_.distributed().rank() > 0) {
    // Every rank holds the same weights: rank 0 evaluates for the job (the evaluation has no
    // collective, so the other ranks need not wait for it; they do at the next step).
    has_eval_ = false;
    summary_["evaluated_by"] = "rank 0";
    LOG(INFO) << "scheduler: " << id_ << ": rank " << spec_.distributed().rank()
              << " leaves the evaluations to rank 0";
  }
  // What loading the data did: a metrics.jsonl line per file and the job's status (lspctl
  // run / watch print it).
  std::vector<const v1::DataSummary*> data;
  if (wload_.has_train_data()) data.push_back(&wload_.train_data());
  if (wload_.has_eval_data()) data.push_back(&wload_.eval_data());
  for (const v1::DataSummary* d : data) {
    nlohmann::json j = ToJson(*d);
    j["kind"] = "data";
    j["step"] = start_step_;
    Log(j);
    summary_[absl::StrCat(d->split(), "_tokens")] = d->tokens();
    summary_[absl::StrCat(d->split(), "_loss_tokens")] = d->loss_tokens();
    summary_[absl::StrCat(d->split(), "_truncated")] = d->truncated();
    summary_[absl::StrCat(d->split(), "_skipped")] = d->skipped();
  }
  host_->UpdateStatus([&](v1::JobStatus* s) {
    s->clear_data();
    for (const v1::DataSummary* d : data) *s->add_data() = *d;
  });
}

absl::StatusOr<v1::EvalMetrics> JobRunner::Evaluate(int step) {
  Phase(absl::StrCat("evaluating after step ", step));
  v1::EvaluateRequest req;
  req.set_job_id(id_);
  req.set_step(step);
  // A cancel of the job stops the evaluation too (a generative one can take minutes).
  ASSIGN_OR_RETURN(v1::EvaluateReply rep,
                   worker_->Evaluate(req, dl_, [this] { return host_->CancelRequested(); }));
  nlohmann::json j = ToJson(rep.metrics());
  if (rep.metrics().generated_examples() == 0) {  // eval.metric loss: no generative scores
    for (const char* key : {"exact_match", "precision", "recall", "f1", "generated_examples",
                            "generation_seconds", "samples"}) {
      j.erase(key);
    }
  }
  j["kind"] = "eval";
  Log(j);
  LOG(INFO) << "scheduler: " << id_ << ": eval at step " << step << ": accuracy "
            << rep.metrics().accuracy() << ", loss " << rep.metrics().loss()
            << (rep.metrics().generated_examples() > 0
                    ? absl::StrCat(", exact match ", rep.metrics().exact_match(), ", tag F1 ",
                                   rep.metrics().f1(), " (", rep.metrics().generated_examples(),
                                   " generated)")
                    : std::string())
            << " (" << rep.metrics().seconds() << " s)";
  host_->UpdateStatus([&](v1::JobStatus* s) { *s->add_evals() = rep.metrics(); });
  return rep.metrics();
}

void JobRunner::AddGenerativeScores(absl::string_view prefix, const v1::EvalMetrics& m) {
  if (m.generated_examples() == 0) return;
  summary_[absl::StrCat(prefix, "exact_match")] = m.exact_match();
  summary_[absl::StrCat(prefix, "f1")] = m.f1();
  summary_[absl::StrCat(prefix, "precision")] = m.precision();
  summary_[absl::StrCat(prefix, "recall")] = m.recall();
}

absl::Status JobRunner::Train() {
  const v1::ArenaLayout& layout = wload_.arena();
  if (has_eval_ && !spec_.skip_initial_eval() && start_step_ == 0) {
    ASSIGN_OR_RETURN(v1::EvalMetrics initial, Evaluate(0));
    if (spec_.data().format() == v1::DATA_FORMAT_CLASSIFICATION) {
      summary_["zero_shot_accuracy"] = initial.accuracy();
    }
    summary_["zero_shot_eval_loss"] = initial.loss();
    AddGenerativeScores("zero_shot_", initial);
    if (initial.perplexity() > 0) summary_["zero_shot_perplexity"] = initial.perplexity();
  }
  RETURN_IF_ERROR(CheckCancel());
  // Per-layer task list of a step: deepest layer first (its gradient is ready first in the
  // backward pass; the overlapped schedule's first-come-first-served order).
  for (int i = layout.linears_size() - 1; i >= 0; --i) {
    v1::LayerTask t;
    t.set_index(layout.linears(i).index());
    plan_tasks_.push_back(t);
  }
  if (lsp_ && start_step_ == 0) RETURN_IF_ERROR(Fit(0));
  Phase("training");
  t_train_ = Now();
  cost_model_.emplace(num_layers_, spec_.optim().max_grad_norm() > 0);
  for (int step = start_step_ + 1; step <= spec_.steps(); ++step) {
    RETURN_IF_ERROR(CheckCancel());
    ASSIGN_OR_RETURN(bool done, RunStep(step));
    if (done) RETURN_IF_ERROR(AfterStep(step));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> JobRunner::RunStep(int step) {
  const double t0 = Now();
  const double lr = LearningRate(spec_.optim(), step, spec_.steps());
  SplitChoice choice;
  StepRequests req;
  const bool overlap = spec_.schedule() == v1::STEP_SCHEDULE_OVERLAP;
  *req.train.mutable_plan() = cost_model_->Plan(overlap, &choice);
  const v1::StepPlan& plan = req.train.plan();
  req.train.set_job_id(id_);
  req.train.set_step(step);
  req.train.set_lr(lr);
  req.update.set_job_id(id_);
  req.update.set_step(step);
  req.update.set_lr(lr);
  req.apply.set_job_id(id_);
  req.apply.set_step(step);
  req.apply.set_lr(lr);
  for (const auto& t : plan_tasks_) {
    *req.update.add_tasks() = t;
    *req.apply.add_tasks() = t;
  }
  // A cancel during the step stops it at the next layer boundary (issue 43): a watcher asks
  // both peers to abandon the step (AbortStep); the worker's layer hooks see it.
  absl::StatusOr<StepReplies> executed;
  {
    absl::Notification step_done;
    std::thread watcher([&] {
      while (!step_done.WaitForNotificationWithTimeout(absl::Milliseconds(20))) {
        if (!host_->CancelRequested()) continue;
        v1::AbortStepRequest abort_req;
        abort_req.set_job_id(id_);
        abort_req.set_step(step);
        (void)worker_->AbortStep(abort_req, kUnloadDeadlineSeconds);
        if (optimizer_ != nullptr) (void)optimizer_->AbortStep(abort_req, kUnloadDeadlineSeconds);
        LOG(INFO) << "scheduler: " << id_ << ": cancel requested during step " << step
                  << ": the step is abandoned at the next layer boundary";
        return;
      }
    });
    executed = ExecuteStep(*worker_, optimizer_, req, dl_);
    step_done.Notify();
    watcher.join();
  }
  if (!executed.ok() && host_->CancelRequested()) {
    return absl::CancelledError(absl::StrCat("cancelled by the user during step ", step,
                                             " (the step was abandoned at a layer "
                                             "boundary: ",
                                             executed.status().message(),
                                             "); the last checkpoint is intact: resume with "
                                             "resume_from: latest"));
  }
  ASSIGN_OR_RETURN(StepReplies rep, std::move(executed));
  if (rep.train.nonfinite()) {
    RETURN_IF_ERROR(SkipNonFiniteStep(step));
    return false;
  }
  nonfinite_in_a_row_ = 0;
  v1::StepMetrics m = rep.train.metrics();
  if (offload_) RecordOffloadedStep(step, rep, plan, choice, t0, &m);
  const double secs = Now() - t0;
  const double tokens_in = m.tokens_per_second() * m.step_seconds();
  m.set_step_seconds(secs);
  m.set_tokens_per_second(secs > 0 ? tokens_in / secs : 0);
  step_time_sum_ += secs;
  input_tokens_sum_ += m.input_tokens();
  padding_tokens_sum_ += m.padding_tokens();
  nlohmann::json j = ToJson(m);
  j["kind"] = "step";
  Log(j);
  const double eta = (Now() - t_train_) / (step - start_step_) * (spec_.steps() - step);
  LOG(INFO) << "scheduler: " << id_ << ": step " << step << "/" << spec_.steps() << " loss "
            << m.loss() << " lr " << lr << " " << secs << " s"
            << (plan.overlap() ? absl::StrCat(" (overlap, split ", plan.split_layer(), ")")
                               : std::string());
  host_->RecordStep(m, eta);
  return true;
}

absl::Status JobRunner::SkipNonFiniteStep(int step) {
  ++skipped_;
  host_->UpdateStatus([&](v1::JobStatus* s) {
    s->set_skipped_steps(skipped_);
    s->set_last_error(absl::StrCat("step ", step,
                                   " had a non-finite loss or gradient and "
                                   "was skipped (",
                                   nonfinite_in_a_row_ + 1, " in a row)"));
  });
  LOG(WARNING) << "scheduler: " << id_ << ": step " << step
               << " had a non-finite loss or gradient and was skipped";
  const int max_in_a_row = spec_.max_nonfinite_steps() > 0 ? spec_.max_nonfinite_steps()
                                                           : options_.max_nonfinite_steps_in_a_row;
  if (++nonfinite_in_a_row_ >= max_in_a_row) {
    return absl::DataLossError(
        absl::StrCat(nonfinite_in_a_row_, " non-finite steps in a row at step ", step,
                     ": lower optim.lr, set optim.max_grad_norm, or check the data"));
  }
  return absl::OkStatus();
}

void JobRunner::RecordOffloadedStep(int step, const StepReplies& rep, const v1::StepPlan& plan,
                                    const SplitChoice& choice, double t0, v1::StepMetrics* m) {
  m->set_update_seconds(rep.update.seconds());
  m->set_grad_norm(rep.update.grad_norm());
  m->set_apply_seconds(rep.apply.seconds());
  m->set_optimizer_peak_rss_bytes(rep.update.peak_rss_bytes());
  // Timeline and cost model: every event of the step, worker and optimizer.
  std::vector<v1::LayerEvent> events(rep.train.events().begin(), rep.train.events().end());
  events.insert(events.end(), rep.update.events().begin(), rep.update.events().end());
  events.insert(events.end(), rep.apply.events().begin(), rep.apply.events().end());
  double first = std::numeric_limits<double>::infinity(), last = 0;
  for (const auto& e : rep.train.events()) {
    first = std::min(first, e.start());
    last = std::max(last, e.end());
  }
  for (const auto& e : rep.apply.events()) last = std::max(last, e.end());
  const double gap = last_step_end_ > 0 && std::isfinite(first) ? first - last_step_end_ : -1;
  last_step_end_ = last;
  cost_model_->Observe(events, gap);
  nlohmann::json tl;
  tl["step"] = step;
  tl["plan"] = {{"overlap", plan.overlap()},
                {"split_layer", plan.split_layer()},
                {"predicted_cost_seconds", choice.predicted_cost},
                {"predicted_stall_seconds", choice.predicted_stall},
                {"cost_by_split", choice.cost_by_split}};
  nlohmann::json ev = nlohmann::json::array();
  for (const auto& e : events) {
    ev.push_back({{"layer", e.layer()},
                  {"what", e.what()},
                  {"actor", e.actor()},
                  {"start", e.start()},
                  {"end", e.end()}});
  }
  tl["events"] = std::move(ev);
  tl["step_seconds"] = Now() - t0;
  tl["wait_seconds"] = m->wait_seconds();
  absl::Status ts = log_->Timeline(tl);
  if (!ts.ok() && !timeline_failed_) {
    timeline_failed_ = true;  // The run goes on; warn once per job.
    LOG(WARNING) << "scheduler: " << id_ << ": timeline.jsonl: " << ts;
  }
}

absl::Status JobRunner::AfterStep(int step) {
  const int last = spec_.steps();
  if (lsp_ && spec_.lsp().check_freq() > 0 && step % spec_.lsp().check_freq() == 0 && step < last) {
    RETURN_IF_ERROR(Fit(step));
    if (spec_.lsp().master_refresh() == v1::MASTER_REFRESH_REFIT) {
      Phase(absl::StrCat("refreshing worker weights from the master (step ", step, ")"));
      ASSIGN_OR_RETURN(double diff, Refresh(/*measure_only=*/false));
      Log({{"kind", "master_refresh"},
           {"step", step},
           {"max_abs_diff_before", diff},
           {"max_abs_drift_beyond_rounding_before", last_drift_},
           {"max_drift_ulps_before", last_drift_ulps_}});
      LOG(INFO) << "scheduler: " << id_ << ": master refresh at step " << step
                << ": max |W_worker - W_master| was " << diff;
    }
    Phase("training");
  }
  if (lsp_ && spec_.lsp().refresh_every() > 0) RETURN_IF_ERROR(RollingRefresh(step));
  if (has_eval_ && spec_.eval_every() > 0 && step % spec_.eval_every() == 0 && step < last) {
    RETURN_IF_ERROR(Evaluate(step).status());
    Phase("training");
  }
  if (spec_.checkpoint_every() > 0 && (step % spec_.checkpoint_every() == 0 || step == last)) {
    RETURN_IF_ERROR(Checkpoint(step));
  }
  return absl::OkStatus();
}

absl::Status JobRunner::Finish() {
  if (lsp_) {
    // How far the worker's weights drifted from the fp32 master since the last refresh.
    ASSIGN_OR_RETURN(double drift, Refresh(/*measure_only=*/true));
    summary_["final_worker_master_max_abs_diff"] = drift;
    summary_["final_worker_master_drift_beyond_rounding"] = last_drift_;
    summary_["final_worker_master_drift_ulps"] = last_drift_ulps_;
    summary_["rolling_refresh_layers"] = rolling_refreshes_;
    summary_["rolling_refresh_seconds"] = rolling_refresh_seconds_;
    Log({{"kind", "master_drift"},
         {"step", spec_.steps()},
         {"max_abs_diff", drift},
         {"max_abs_drift_beyond_rounding", last_drift_},
         {"max_drift_ulps", last_drift_ulps_}});
  }
  const int done_steps = spec_.steps() - start_step_ - skipped_;
  summary_["skipped_steps"] = skipped_;
  summary_["train_seconds"] = Now() - t_train_;
  summary_["mean_step_seconds"] = done_steps > 0 ? step_time_sum_ / done_steps : 0.0;
  // Padding share of the steps' input and the rate of real (non-padding) tokens: what
  // data.packing changes.
  summary_["padding_fraction"] =
      input_tokens_sum_ > 0 ? static_cast<double>(padding_tokens_sum_) / input_tokens_sum_ : 0.0;
  summary_["real_tokens_per_second"] =
      step_time_sum_ > 0 ? (input_tokens_sum_ - padding_tokens_sum_) / step_time_sum_ : 0.0;
  if (has_eval_) {
    ASSIGN_OR_RETURN(v1::EvalMetrics fin, Evaluate(spec_.steps()));
    if (spec_.data().format() == v1::DATA_FORMAT_CLASSIFICATION)
      summary_["final_accuracy"] = fin.accuracy();
    summary_["final_eval_loss"] = fin.loss();
    AddGenerativeScores("final_", fin);
    if (fin.perplexity() > 0) summary_["final_perplexity"] = fin.perplexity();
  }
  if (!spec_.skip_checkpoint()) {
    host_->UpdateStatus([&](v1::JobStatus* s) {
      s->set_state(v1::CHECKPOINTING);
      s->set_phase("writing checkpoint");
    });
    v1::SaveRequest save;
    save.set_job_id(id_);
    save.set_dir(spec_.output_dir());
    RETURN_IF_ERROR(worker_->SaveArtifacts(save, dl_).status());
    if (optimizer_ != nullptr) RETURN_IF_ERROR(optimizer_->SaveModel(save, dl_).status());
  }
  summary_["wall_seconds"] = Now() - t_start_;
  summary_["output_dir"] = spec_.output_dir();
  RETURN_IF_ERROR(log_->WriteSummary(summary_));
  LOG(INFO) << "scheduler: " << id_ << ": summary " << summary_.dump();
  return absl::OkStatus();
}

}  // namespace lspo::scheduler
