// The job runner's checkpoints and resume (job_runner.h): which checkpoint a job resumes
// from, what it restores, and the checkpoints it writes (HF trainer_state.json, the peers'
// state files, the checksums; docs/checkpoints.md).
#include <filesystem>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "runtime/clock.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"
#include "scheduler/checkpoint.h"
#include "scheduler/job_runner.h"
#include "scheduler/lr_schedule.h"
#include "spec/job_spec.h"

namespace lspo::scheduler {

namespace v1 = lspo::v1;

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
    superseded_ = {
        {"kind", "checkpoints_superseded"}, {"count", existing.size()}, {"moved_to", aside}};
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
  spec::TakeChosenSettingsFrom(stored, &spec_);
  if (!spec::SameTraining(stored, spec_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint '", resume_dir_, "' was written by a job with a different training spec (",
        spec::TrainingDifferences(stored, spec_),
        ", checkpoint -> this job): resume with the spec in its trainer_state.json, changing "
        "only steps, output, evaluation, threads, the schedule or where the ranks run "
        "(distributed.rendezvous, bind_address, rank; not distributed.world_size)"));
  }
  start_step_ = resume_state_["step"].get<int>();
  // A job given in epochs knows its steps once the worker has read the data (CountEpochSteps
  // checks there).
  if (spec_.steps() > 0 && start_step_ > spec_.steps()) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint '", resume_dir_, "' is at step ",
                                                   start_step_, " but the job has only ",
                                                   spec_.steps(), " steps: raise steps"));
  }
  LOG(INFO) << "scheduler: " << id_ << ": resuming from " << resume_dir_ << " (step " << start_step_
            << ")";
  return absl::OkStatus();
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

nlohmann::json JobRunner::TrainerState(int step) const {
  nlohmann::json state;
  state["step"] = step;
  state["job_id"] = id_;
  state["written_unix_seconds"] = absl::ToUnixSeconds(absl::Now());
  state["skipped_steps"] = skipped_;
  state["nonfinite_in_a_row"] = nonfinite_in_a_row_;
  state["lr_schedule"] = {{"schedule", runtime::EnumShortName(spec_.optim().schedule())},
                          {"peak_lr", spec_.optim().lr()},
                          {"warmup_steps", WarmupSteps(spec_.optim(), spec_.steps())},
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
                          {"order",
                           "data::ShuffledOrder(train size, seed, epoch) over the "
                           "global example index (step - 1) * examples_per_step; "
                           "rank r of world_size reads its micro-batch b of "
                           "accumulation a at offset (a * world_size + r) * "
                           "micro_batch_size + b"}};
  state["rng"] = {{"seed", spec_.seed()},
                  {"model_init_seed", spec_.model().init_seed()},
                  {"derivation",
                   "every random draw (data order, calibration subsets, "
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
  state["training_fingerprint"] = spec::TrainingFingerprint(spec_);
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
  if (!dir.ok() && (absl::IsUnavailable(dir.status()) || absl::IsDeadlineExceeded(dir.status()))) {
    return dir.status();
  }
  return absl::OkStatus();
}

}  // namespace lspo::scheduler
