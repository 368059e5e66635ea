#include "scheduler/job_runner.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "offload/arena_layout.h"
#include "runtime/clock.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"
#include "scheduler/checkpoint.h"
#include "scheduler/job_spec.h"
#include "scheduler/lr_schedule.h"
#include "scheduler/run_report.h"
#include "scheduler/step_executor.h"

namespace lspo::scheduler {
namespace {

namespace v1 = lspo::v1;

constexpr double kUnloadDeadlineSeconds = 60;

double Now() { return runtime::MonotonicSeconds(); }

nlohmann::json ToJson(const google::protobuf::Message& m) {
  return nlohmann::json::parse(runtime::ProtoToJson(m, runtime::ProtoJsonPrint::WithDefaults()));
}

}  // namespace

JobRunner::JobRunner(std::string job_id, v1::JobSpec spec, WorkerClient* worker,
                     OptimizerClient* optimizer, JobHost* host, RunnerOptions options)
    : id_(std::move(job_id)),
      spec_(std::move(spec)),
      worker_(worker),
      optimizer_(optimizer),
      host_(host),
      options_(options),
      lsp_(spec_.mode() == v1::MODE_LSP),
      zero_(spec_.mode() == v1::MODE_ZERO),
      // GaLore-Offload runs its Adam on the optimizer service as lsp does.
      offload_(lsp_ || zero_ || (spec_.mode() == v1::MODE_GALORE && spec_.galore().offload())),
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
    const std::string outcome =
        st.ok() ? "succeeded"
        : absl::IsCancelled(st) ? absl::StrCat("cancelled (", st.message(), ")")
                                : absl::StrCat("failed: ", st.message());
    if (absl::Status report = WriteRunReport(spec_.output_dir(), outcome); !report.ok()) {
      LOG(WARNING) << "scheduler: " << id_ << ": run report: " << report;
    }
  }
  return st;
}

absl::Status JobRunner::SelectResume() {
  if (spec_.resume_from().empty()) {
    // A fresh start: checkpoints already in the folder belong to another run, whose lineage
    // this one must not mix with (checkpoint.h, "Lineage").
    const std::vector<CheckpointInfo> existing = ListCheckpoints(spec_.output_dir());
    if (existing.empty()) return absl::OkStatus();
    if (!spec_.overwrite_output_dir()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "output_dir '", spec_.output_dir(), "' holds ", existing.size(),
          " checkpoint(s) of an earlier run (newest: ", existing.back().dir,
          ") and this job starts from step 0: continue that run with resume_from: latest, "
          "give another output_dir, or set overwrite_output_dir: true to move them aside into "
          "checkpoints/superseded-<run id>/"));
    }
    ASSIGN_OR_RETURN(std::string aside, SupersedeCheckpoints(spec_.output_dir(), run_id_));
    LOG(WARNING) << "scheduler: " << id_ << ": overwrite_output_dir: moved " << existing.size()
                 << " checkpoint(s) of an earlier run to " << aside;
    superseded_ = {{"kind", "checkpoints_superseded"}, {"count", existing.size()},
                   {"moved_to", aside}};
    return absl::OkStatus();
  }
  std::vector<CheckpointInfo> candidates;
  if (spec_.resume_from() == "latest") {
    candidates = LatestCheckpoints(spec_.output_dir());
  } else {
    candidates.push_back({0, spec_.resume_from()});
  }
  // Data parallel: the ranks agree on one checkpoint at LoadJob (Load), so every one of this
  // rank's is verified now; one rank verifies only until it finds a sound one. A checkpoint
  // that does not verify is not offered (the others may then agree on an older one).
  const bool agree = spec_.resume_from() == "latest" && spec_.distributed().world_size() > 1;
  for (const CheckpointInfo& c : candidates) {
    absl::StatusOr<nlohmann::json> state = VerifyCheckpoint(c.dir);
    if (!state.ok()) {
      if (spec_.resume_from() != "latest") return state.status();
      LOG(ERROR) << "scheduler: " << id_ << ": skipping checkpoint " << c.dir << ": "
                 << state.status();
      continue;
    }
    if (agree) {
      resume_candidates_.push_back({state->value("step", 0), c.dir, *state});
      if (!resume_dir_.empty()) continue;
    }
    resume_state_ = std::move(*state);
    resume_dir_ = c.dir;
    if (!agree) break;
  }
  if (resume_dir_.empty()) return absl::OkStatus();  // "latest" with none: start afresh.
  return AdoptResume();
}

absl::Status JobRunner::AdoptResume() {
  const std::string stored = resume_state_.value("training_fingerprint", std::string());
  TakeChosenSettingsFrom(stored, &spec_);
  if (!SameTraining(stored, spec_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", resume_dir_, "' was written by a job with a different training spec (",
        TrainingDifferences(stored, spec_),
        ", checkpoint -> this job): resume with the spec in its trainer_state.json, changing "
        "only steps, output, evaluation, threads, the schedule or where the ranks run "
        "(distributed.rendezvous, bind_address, rank; not distributed.world_size)"));
  }
  start_step_ = resume_state_["step"].get<int>();
  if (start_step_ > spec_.steps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint '", resume_dir_, "' is at step ", start_step_, " but the job has only ",
        spec_.steps(), " steps: raise steps"));
  }
  LOG(INFO) << "scheduler: " << id_ << ": resuming from " << resume_dir_ << " (step "
            << start_step_ << ")";
  return absl::OkStatus();
}

absl::Status JobRunner::Load() {
  // Load on the worker (creates the arena in lsp/zero mode), then the optimizer. A job resumed
  // after a scheduler restart may still be loaded there (the actors outlived the scheduler):
  // unload it first (unknown ids are ignored; a dead actor fails at LoadJob below).
  Phase("loading model and data");
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
  if (!spec_.has_micro_batch_size()) {
    // The worker's choice (issue 42; a worker of an older version: its default, 8).
    spec_.set_micro_batch_size(wload_.micro_batch_size() > 0 ? wload_.micro_batch_size() : 8);
    *load.mutable_spec() = spec_;
  }
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
    Log({{"kind", "resume_agreed"}, {"own_newest", start_step_}, {"step", agreed},
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

void JobRunner::InitSummary() {
  summary_["job_id"] = id_;
  summary_["mode"] = runtime::EnumShortName(spec_.mode());
  summary_["schedule"] = offload_ ? runtime::EnumShortName(spec_.schedule()) : "none";
  summary_["weight_dtype"] = runtime::EnumShortName(spec_.weight_dtype());
  // What the worker runs with: the spec's setting or its own choice (chosen_settings).
  summary_["activation_checkpointing"] = wload_.activation_checkpointing();
  if (wload_.chosen_settings_size() > 0) {
    summary_["chosen_settings"] = std::vector<std::string>(wload_.chosen_settings().begin(),
                                                           wload_.chosen_settings().end());
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
  summary_["narrow"] = !lsp_                          ? "none"
                       : spec_.lsp().d_ratio() != 0 ? "not used (d_ratio)"
                       : spec_.lsp().narrow() == v1::NARROW_RULE_UNSPECIFIED
                           ? "one-sided"
                           : runtime::EnumShortName(spec_.lsp().narrow());
  // How steps land in 16-bit worker weights (proto ApplyRounding; unset = compensated).
  summary_["apply_rounding"] = !lsp_ ? "none"
                               : spec_.lsp().apply_rounding() == v1::APPLY_ROUNDING_UNSPECIFIED
                                   ? "compensated"
                                   : runtime::EnumShortName(spec_.lsp().apply_rounding());
  if (spec_.mode() == v1::MODE_LORA) {
    summary_["lora_r"] = spec_.lora().r();
    summary_["lora_alpha"] = spec_.lora().alpha();
    summary_["lora_target_modules"] = std::vector<std::string>(
        spec_.lora().target_modules().begin(), spec_.lora().target_modules().end());
    summary_["lora_use_rslora"] = spec_.lora().use_rslora();
  }
  if (spec_.mode() == v1::MODE_GALORE) {
    summary_["galore_rank"] = spec_.galore().rank();
    summary_["galore_update_proj_gap"] = spec_.galore().update_proj_gap();
    summary_["galore_scale"] = spec_.galore().scale();
    summary_["galore_offload"] = spec_.galore().offload();
  }
  summary_["steps"] = spec_.steps();
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

void JobRunner::RestoreFromCheckpoint() {
  // Counters, evaluations and the summary so far, as at the checkpoint.
  skipped_ = resume_state_.value("skipped_steps", 0);
  nonfinite_in_a_row_ = resume_state_.value("nonfinite_in_a_row", 0);
  if (resume_state_.contains("summary") && resume_state_["summary"].is_object()) {
    for (const auto& [k, v] : resume_state_["summary"].items()) {
      if (!summary_.contains(k)) summary_[k] = v;
    }
  }
  summary_["resumed_from_step"] = start_step_;
  std::vector<v1::EvalMetrics> evals;
  for (const auto& e : resume_state_.value("evals", nlohmann::json::array())) {
    v1::EvalMetrics m;
    if (runtime::ProtoFromJson(e.dump(), &m, "evals").ok()) evals.push_back(m);
  }
  Log({{"kind", "resume"}, {"step", start_step_}, {"checkpoint", resume_dir_}});
  host_->UpdateStatus([&](v1::JobStatus* s) {
    s->set_step(start_step_);
    s->set_resumed_from_step(start_step_);
    s->set_skipped_steps(skipped_);
    s->set_last_checkpoint_step(start_step_);
    s->set_last_checkpoint_dir(resume_dir_);
    s->clear_evals();
    for (const auto& m : evals) *s->add_evals() = m;
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

absl::Status JobRunner::Fit(int step) {
  Phase(absl::StrCat("fitting projectors (step ", step, ")"));
  v1::FitProjectorsRequest req;
  req.set_job_id(id_);
  req.set_step(step);
  ASSIGN_OR_RETURN(v1::FitProjectorsReply rep, worker_->FitProjectors(req, dl_));
  v1::SetProjectorsRequest sp;
  sp.set_job_id(id_);
  *sp.mutable_indices() = rep.refitted();
  RETURN_IF_ERROR(optimizer_->SetProjectors(sp, dl_).status());
  double init = 0, fin = 0;
  int n = 0;
  for (int k = 0; k < rep.final_error_size(); ++k) {
    if (!std::isfinite(rep.final_error(k)) || !std::isfinite(rep.initial_error(k))) continue;
    init += rep.initial_error(k);
    fin += rep.final_error(k);
    ++n;
  }
  n = std::max(n, 1);
  Log({{"kind", "projector_fit"},
       {"step", step},
       {"refitted", rep.refitted_size()},
       {"mean_initial_relative_bias", init / n},
       {"mean_final_relative_bias", fin / n},
       {"seconds", rep.seconds()}});
  LOG(INFO) << "scheduler: " << id_ << ": projectors: " << rep.refitted_size()
            << " refitted, mean relative estimation bias " << init / n << " -> " << fin / n
            << " (" << rep.seconds() << " s)";
  host_->UpdateStatus([&](v1::JobStatus* s) { s->set_mean_projector_error(fin / n); });
  if (step == 0) {
    summary_["projector_initial_relative_bias"] = init / n;
    summary_["projector_fitted_relative_bias"] = fin / n;
    summary_["projector_fit_seconds"] = rep.seconds();
  }
  return absl::OkStatus();
}

absl::StatusOr<double> JobRunner::Refresh(bool measure_only) {
  // The optimizer writes each layer's fp32 master weights into the arena staging region and
  // the worker copies them in (or, measure_only, reports max |W_worker - W_master| without
  // copying). Returns that maximum over all layers.
  double max_diff = 0;
  last_drift_ = 0;
  last_drift_ulps_ = 0;
  for (int l = 0; l < num_layers_; ++l) {
    v1::LayerWeightsRequest req;
    req.set_job_id(id_);
    req.set_layer(l);
    req.set_measure_only(measure_only);
    RETURN_IF_ERROR(optimizer_->ExportLayerWeights(req, dl_).status());
    ASSIGN_OR_RETURN(v1::LayerWeightsReply rep, worker_->ImportLayerWeights(req, dl_));
    max_diff = std::max(max_diff, rep.max_abs_change());
    last_drift_ = std::max(last_drift_, rep.max_abs_drift());
    last_drift_ulps_ = std::max(last_drift_ulps_, rep.max_drift_ulps());
  }
  return max_diff;
}

nlohmann::json JobRunner::TrainerState(int step) const {
  nlohmann::json state;
  state["step"] = step;
  state["job_id"] = id_;
  state["written_unix_seconds"] = absl::ToUnixSeconds(absl::Now());
  state["skipped_steps"] = skipped_;
  state["nonfinite_in_a_row"] = nonfinite_in_a_row_;
  state["lr_schedule"] = {{"schedule", runtime::EnumShortName(spec_.optim().schedule())},
                          {"peak_lr", spec_.optim().lr()},
                          {"warmup_steps", spec_.optim().warmup_steps()},
                          {"total_steps", spec_.steps()},
                          {"lr_of_step", LearningRate(spec_.optim(), step, spec_.steps())},
                          {"next_step", step + 1}};
  const int world_size = std::max(1, spec_.distributed().world_size());
  const int64_t per_step =
      static_cast<int64_t>(spec_.micro_batch_size()) * spec_.grad_accum() * world_size;
  state["data_cursor"] = {{"next_step", step + 1},
                          {"world_size", world_size},
                          {"examples_per_step", per_step},
                          {"examples_consumed", per_step * step},
                          {"order", "data::ShuffledOrder(train size, seed, epoch) over the "
                                    "global example index (step - 1) * examples_per_step; "
                                    "rank r of world_size reads its micro-batch b of "
                                    "accumulation a at offset (a * world_size + r) * "
                                    "micro_batch_size + b"}};
  state["rng"] = {{"seed", spec_.seed()},
                  {"model_init_seed", spec_.model().init_seed()},
                  {"derivation", "every random draw (data order, calibration subsets, "
                                 "projector draws) is a pure function of (seed, step); no "
                                 "generator state is carried between steps"}};
  nlohmann::json evals = nlohmann::json::array();
  for (const auto& e : host_->Evals()) evals.push_back(ToJson(e));
  state["evals"] = std::move(evals);
  state["summary"] = summary_;
  state["run_id"] = run_id_;
  state["parent"] = resume_dir_.empty()
                        ? nlohmann::json(nullptr)
                        : nlohmann::json{{"run_id", resume_state_.value("run_id", std::string())},
                                         {"step", start_step_},
                                         {"dir", resume_dir_}};
  state["training_fingerprint"] = TrainingFingerprint(spec_);
  state["spec"] = ToJson(spec_);
  return state;
}

absl::StatusOr<std::string> JobRunner::WriteCheckpoint(int step) {
  ASSIGN_OR_RETURN(std::string tmp, BeginCheckpoint(spec_.output_dir(), step));
  absl::Status st = [&]() -> absl::Status {
    v1::SaveRequest save;
    save.set_job_id(id_);
    save.set_dir(tmp);
    v1::StateRequest sreq;
    sreq.set_job_id(id_);
    sreq.set_dir(tmp);
    sreq.set_step(step);
    RETURN_IF_ERROR(worker_->SaveArtifacts(save, dl_).status());
    RETURN_IF_ERROR(worker_->SaveState(sreq, dl_).status());
    if (optimizer_ != nullptr) {
      RETURN_IF_ERROR(optimizer_->SaveModel(save, dl_).status());
      RETURN_IF_ERROR(optimizer_->SaveState(sreq, dl_).status());
    }
    // The logs up to this step are on disk before a checkpoint that follows them is.
    return log_->Sync();
  }();
  if (!st.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(tmp, ec);
    return st;
  }
  ASSIGN_OR_RETURN(std::string dir, CommitCheckpoint(tmp, TrainerState(step)));
  // Data parallel: keep at least the previous checkpoint too. Every other rank has committed
  // it (it began the step after it, whose first collective this rank passed), but perhaps not
  // this one yet: the ranks resume from the newest step all of them hold (Load).
  const int keep = spec_.distributed().world_size() > 1 ? std::max(2, spec_.keep_checkpoints())
                                                       : spec_.keep_checkpoints();
  RETURN_IF_ERROR(PruneCheckpoints(spec_.output_dir(), keep, dir));
  return dir;
}

absl::Status JobRunner::Checkpoint(int step) {
  // A failure (disk full, unwritable directory) is reported in last_error and training goes
  // on; the previous checkpoint stays.
  host_->UpdateStatus([&](v1::JobStatus* s) {
    s->set_state(v1::CHECKPOINTING);
    s->set_phase(absl::StrCat("writing the checkpoint of step ", step));
  });
  absl::StatusOr<std::string> dir = WriteCheckpoint(step);
  if (dir.ok()) {
    Log({{"kind", "checkpoint"}, {"step", step}, {"dir", *dir}});
    LOG(INFO) << "scheduler: " << id_ << ": checkpoint of step " << step << " in " << *dir;
  } else {
    LOG(ERROR) << "scheduler: " << id_ << ": checkpoint of step " << step
               << " failed: " << dir.status();
    Log({{"kind", "checkpoint_failed"},
         {"step", step},
         {"error", std::string(dir.status().message())}});
  }
  host_->UpdateStatus([&](v1::JobStatus* s) {
    s->set_state(v1::RUNNING);
    s->set_phase("training");
    if (dir.ok()) {
      s->set_last_checkpoint_step(step);
      s->set_last_checkpoint_dir(*dir);
    } else {
      s->set_last_error(absl::StrCat(
          "checkpoint of step ", step, " failed: ", dir.status().message(),
          s->last_checkpoint_step() > 0
              ? absl::StrCat("; the checkpoint of step ", s->last_checkpoint_step(), " is kept")
              : std::string("; no checkpoint yet")));
    }
  });
  // A peer that died while saving fails the job like any other call.
  if (!dir.ok() &&
      (absl::IsUnavailable(dir.status()) || absl::IsDeadlineExceeded(dir.status()))) {
    return dir.status();
  }
  return absl::OkStatus();
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
    return absl::CancelledError(absl::StrCat(
        "cancelled by the user during step ", step, " (the step was abandoned at a layer "
        "boundary: ", executed.status().message(), "); the last checkpoint is intact: resume with "
        "resume_from: latest"));
  }
  ASSIGN_OR_RETURN(StepReplies rep, std::move(executed));
  if (rep.train.nonfinite()) {
    ++skipped_;
    host_->UpdateStatus([&](v1::JobStatus* s) {
      s->set_skipped_steps(skipped_);
      s->set_last_error(absl::StrCat("step ", step, " had a non-finite loss or gradient and "
                                     "was skipped (", nonfinite_in_a_row_ + 1, " in a row)"));
    });
    LOG(WARNING) << "scheduler: " << id_ << ": step " << step
                 << " had a non-finite loss or gradient and was skipped";
    const int max_in_a_row = spec_.max_nonfinite_steps() > 0
                                 ? spec_.max_nonfinite_steps()
                                 : options_.max_nonfinite_steps_in_a_row;
    if (++nonfinite_in_a_row_ >= max_in_a_row) {
      return absl::DataLossError(absl::StrCat(
          nonfinite_in_a_row_, " non-finite steps in a row at step ", step,
          ": lower optim.lr, set optim.max_grad_norm, or check the data"));
    }
    return false;
  }
  nonfinite_in_a_row_ = 0;
  v1::StepMetrics m = rep.train.metrics();
  if (offload_) {
    m.set_update_seconds(rep.update.seconds());
    m.set_grad_norm(rep.update.grad_norm());
    m.set_apply_seconds(rep.apply.seconds());
    m.set_optimizer_peak_rss_bytes(rep.update.peak_rss_bytes());
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
    tl["wait_seconds"] = m.wait_seconds();
    absl::Status ts = log_->Timeline(tl);
    if (!ts.ok() && !timeline_failed_) {
      timeline_failed_ = true;  // The run goes on; warn once per job.
      LOG(WARNING) << "scheduler: " << id_ << ": timeline.jsonl: " << ts;
    }
  }
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

absl::Status JobRunner::AfterStep(int step) {
  const int last = spec_.steps();
  if (lsp_ && spec_.lsp().check_freq() > 0 && step % spec_.lsp().check_freq() == 0 &&
      step < last) {
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
    if (spec_.data().format() == v1::DATA_FORMAT_CLASSIFICATION) summary_["final_accuracy"] = fin.accuracy();
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
