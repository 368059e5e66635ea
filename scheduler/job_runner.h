// Runs one job from start to end over the two peers: resume selection, loading, the initial
// evaluation, projector checks, the training steps (scheduler/step_executor.h), master-weight
// refreshes, evaluations and checkpoints at their cadences, the final save and the summary
// (report/run_log.h). The scheduler core (scheduler_core.h) owns the queue and the status;
// the runner reports through a JobHost, so unit tests drive it with fake peers and a fake host
// (tests/scheduler/job_runner_test.cc).
//
// Cadences (JobSpec fields):
//   evaluation       step 0 (unless skip_initial_eval or resuming), every eval_every steps
//                    before the last, and after the last step; only with eval data.
//   projector check  lsp: step 0 (unless resuming) and every lsp.check_freq steps before the
//                    last; each check is followed by a master refresh when
//                    lsp.master_refresh == "refit", and the final drift is measured at the end.
//   rolling refresh  lsp: after every step, the layers of RollingRefreshLayers when
//                    lsp.refresh_every > 0 (each layer once in refresh_every steps).
//   checkpoint       every checkpoint_every steps and after the last step (when > 0).
// Resume (resume_from: DIR or "latest"): the newest checkpoint that verifies is used ("latest"
// skips corrupted ones; an explicit DIR must verify), its TrainingFingerprint must match, and
// training continues at its step + 1 with the counters, evaluations and summary it saved.
// A step with a non-finite loss or gradient is skipped and counted; max_nonfinite_steps in a
// row (default RunnerOptions) fail the job with kDataLoss. A checkpoint that cannot be written
// is reported in JobStatus.last_error and training goes on (the previous one is kept), unless
// a peer died while saving. Whatever happens after the worker loaded the job, both peers are
// asked to unload it.
//
// Thread-safety: one Run() per object, on one thread (the scheduler's runner thread).
#ifndef LSPO_SCHEDULER_JOB_RUNNER_H_
#define LSPO_SCHEDULER_JOB_RUNNER_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "offload/training_mode.h"
#include "proto/job_spec.pb.h"
#include "proto/metrics.pb.h"
#include "proto/peer.pb.h"
#include "proto/scheduler.pb.h"
#include "proto/worker.pb.h"
#include "report/run_log.h"
#include "scheduler/checkpoint.h"
#include "scheduler/cost_model.h"
#include "scheduler/peer_clients.h"
#include "scheduler/step_executor.h"

namespace lspo::scheduler {

// The decoder layers whose weights lsp.refresh_every's rolling refresh re-rounds from the
// master after step `step` (1-based): layer l of `num_layers` when
// (step + floor(l * every / num_layers)) mod every == 0, ascending. Every layer comes once in
// any `every` consecutive steps, and the layers are spread over those steps (about
// num_layers / every a step) instead of all at once. Empty when every <= 0 or
// num_layers <= 0.
std::vector<int> RollingRefreshLayers(int step, int every, int num_layers);

// Where a running job reports. Implemented by the scheduler core (and by tests).
class JobHost {
 public:
  virtual ~JobHost() = default;
  // Applies `fn` to the job's status (then persisted and shown to watchers).
  virtual void UpdateStatus(const std::function<void(lspo::v1::JobStatus*)>& fn) = 0;
  // A completed step: sets step, last_step and eta_seconds and records `m` for Watch.
  virtual void RecordStep(const lspo::v1::StepMetrics& m, double eta_seconds) = 0;
  // True once the user asked to cancel the job.
  virtual bool CancelRequested() const = 0;
  // The evaluations recorded in the status so far (saved in checkpoints).
  virtual std::vector<lspo::v1::EvalMetrics> Evals() const = 0;
};

struct RunnerOptions {
  // Deadline of each peer call, seconds.
  double rpc_deadline_seconds = 1800;
  // Non-finite steps in a row that fail the job when the spec's max_nonfinite_steps is 0.
  int max_nonfinite_steps_in_a_row = 5;
};

class JobRunner {
 public:
  // `spec` has its defaults resolved and its output_dir set. `optimizer` is used in modes lsp
  // and zero only. None of the pointers is owned; all must outlive Run().
  JobRunner(std::string job_id, lspo::v1::JobSpec spec, WorkerClient* worker,
            OptimizerClient* optimizer, JobHost* host, RunnerOptions options);

  // Runs the job to its end. OK when it succeeded; kCancelled when the user cancelled it
  // (checked before each step and after the initial evaluation); otherwise the first error
  // that ended it: a peer's status (kUnavailable, kDeadlineExceeded, ...), kDataLoss for a
  // corrupted checkpoint or too many non-finite steps, kFailedPrecondition for a checkpoint of
  // another training spec, kInvalidArgument for a checkpoint past the job's steps.
  absl::Status Run();

 private:
  absl::Status SelectResume();
  // Resumes from resume_dir_ / resume_state_: checks the training fingerprint and the step
  // (the errors of Run), sets start_step_.
  absl::Status AdoptResume();
  absl::Status Load();
  // A job given in epochs (spec.epochs, steps 0): sets spec_.steps from the rows the worker
  // loaded (spec::StepsForEpochs), logs it and sets the status's total_steps. Errors:
  // kInvalidArgument when the checkpoint resumed from is past the last step.
  absl::Status CountEpochSteps();
  void UnloadPeers();
  void InitSummary();
  // The worker's weight dtype ("fp32", "bf16", "fp16"): the spec's, else the worker's default
  // for the device of its LoadJobReply (bf16 on CUDA). Valid once the worker loaded the job.
  std::string WorkerWeightDtype() const;
  void RestoreFromCheckpoint();
  absl::StatusOr<lspo::v1::EvalMetrics> Evaluate(int step);
  // summary.json's <prefix>exact_match / f1 / precision / recall of a generative evaluation
  // (nothing when `m` generated no answer).
  void AddGenerativeScores(absl::string_view prefix, const lspo::v1::EvalMetrics& m);
  absl::Status Fit(int step);
  absl::StatusOr<double> Refresh(bool measure_only);
  // lsp.refresh_every: the layers of RollingRefreshLayers(step) copied from the master
  // without measuring; their count and time go to the summary.
  absl::Status RollingRefresh(int step);
  absl::Status Checkpoint(int step);
  absl::StatusOr<std::string> WriteCheckpoint(int step);
  nlohmann::json TrainerState(int step) const;
  absl::Status Train();
  // Runs step `step`; returns false when it was skipped (non-finite).
  absl::StatusOr<bool> RunStep(int step);
  // A step with a non-finite loss or gradient: counted and reported; kDataLoss after
  // max_nonfinite_steps in a row (naming the fixes).
  absl::Status SkipNonFiniteStep(int step);
  // An offloaded step's optimizer metrics into *m, and its events into the cost model and
  // timeline.jsonl (with the plan's choice; `t0` the step's start, Now()).
  void RecordOffloadedStep(int step, const StepReplies& rep, const lspo::v1::StepPlan& plan,
                           const SplitChoice& choice, double t0, lspo::v1::StepMetrics* m);
  absl::Status AfterStep(int step);
  absl::Status Finish();
  // runtime::MonotonicSeconds(), seconds.
  static double Now();
  // `m` as JSON with every field, defaults included (metrics.jsonl lines).
  static nlohmann::json ToJson(const google::protobuf::Message& m);
  void Phase(const std::string& phase);
  void Log(const nlohmann::json& line);
  absl::Status CheckCancel() const;

  const std::string id_;
  // The job's spec; settings it leaves for the worker to choose (micro_batch_size) are filled
  // in from the checkpoint resumed (AdoptResume) or the worker's LoadJob reply (Load), once.
  lspo::v1::JobSpec spec_;
  WorkerClient* worker_;
  OptimizerClient* optimizer_;  // Null in mode native.
  JobHost* host_;
  const RunnerOptions options_;
  const offload::ModeDescriptor& mode_;  // the job's mode (offload/training_mode.h)
  // The mode learns projectors (fit at step 0, checks and refits); it has an optimizer service.
  const bool lsp_, offload_;
  const double dl_;

  double t_start_ = 0, t_train_ = 0, step_time_sum_ = 0;
  // Input tokens of this run's steps (B x T per micro-batch) and, of those, padding.
  int64_t input_tokens_sum_ = 0, padding_tokens_sum_ = 0;
  int start_step_ = 0;
  nlohmann::json resume_state_;
  std::string resume_dir_;
  // Data parallel with resume_from: latest: every verified checkpoint of this run's lineage,
  // newest first; the worker agrees with the other ranks on one of them at LoadJob (issue 43).
  struct ResumeCandidate {
    int step;
    std::string dir;
    nlohmann::json state;
  };
  std::vector<ResumeCandidate> resume_candidates_;
  // This run's id in its checkpoints' lineage (checkpoint.h): UTC start time and 32 random
  // bits, e.g. 20261207T021500Z-9f3a61c2.
  const std::string run_id_ = NewRunId();
  nlohmann::json superseded_;  // the metrics line of checkpoints moved aside (overwrite_output_dir)
  std::optional<RunLog> log_;
  bool log_failed_ = false, timeline_failed_ = false;
  lspo::v1::LoadJobReply wload_;
  int64_t optimizer_state_bytes_ = 0;  // The optimizer's LoadJobReply (offloaded modes).
  bool loaded_ = false;
  nlohmann::json summary_;
  int skipped_ = 0, nonfinite_in_a_row_ = 0;
  bool has_eval_ = false;
  std::vector<lspo::v1::LayerTask> plan_tasks_;  // Deepest layer first.
  int num_layers_ = 0;
  double last_drift_ = 0;               // max |W_worker - round(W_master)| of the last refresh.
  double last_drift_ulps_ = 0;          // the same in ulps of round(W_master) (worker's dtype).
  int64_t rolling_refreshes_ = 0;       // Layers refreshed by lsp.refresh_every.
  double rolling_refresh_seconds_ = 0;  // Their wall time, seconds (outside the steps).
  std::optional<LayerCostModel> cost_model_;
  double last_step_end_ = -1;  // Worker clock at the end of the last step.
};

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_JOB_RUNNER_H_
