// The scheduler's core (no server): a job queue and a runner thread that drives each job
// through the worker and optimizer services (their gRPC stubs, so they may be in-process or
// separate processes), issues the per-layer offload/update/upload tasks of every step, the
// projector fits, evaluations and the final checkpoint, and keeps status for the status RPCs.
//
// One step in MODE_LSP / MODE_ZERO (docs/method.md, "Layer-wise schedule"):
//   serial  : worker.TrainStep (forward + backward, then every gradient into the arena) ->
//             optimizer.Update (per-layer tasks, deepest layer first) -> worker.ApplyUpdates
//   overlap : optimizer.Update(wait_for_grads) runs concurrently with worker.TrainStep: each
//             layer's gradient is published during the backward, the optimizer updates it at
//             once (first come first served) and publishes the step; the worker applies layers
//             >= split right after its backward and the others just before their next forward.
//             The split comes from LayerCostModel (scheduler/cost_model.h), fed by the measured
//             per-layer timeline of the previous steps; step 1 runs serially to measure it.
// Either way the trained weights are bitwise the same (each layer's update depends only on
// its own gradient and state). With optim.max_grad_norm the optimizer first waits for every
// gradient (the global norm), so only the transfers overlap the backward.
// MODE_LSP also fits projectors before step 1 and every lsp.check_freq steps, and after each
// such check refreshes the worker's weights from the optimizer's fp32 master weights
// (lsp.master_refresh); the final drift max |W_worker - W_master| goes to summary.json.
// Outputs in the job's output directory: metrics.jsonl (one JSON object per step and per
// evaluation), timeline.jsonl (per step: the plan and every per-layer event, CLOCK_MONOTONIC
// seconds; scripts/plot_timeline.py renders it), summary.json, and the HF-style checkpoint
// (model.safetensors, config.json, tokenizer files).
// Checkpoints and resume: every spec.checkpoint_every steps and after the last step a training
// checkpoint (scheduler/checkpoint.h) goes to output_dir/checkpoints/step-N (the newest
// spec.keep_checkpoints kept); a write error is reported in JobStatus.last_error and training
// goes on with the previous checkpoint kept. spec.resume_from restores one (checksums and the
// TrainingFingerprint verified) and continues at step N + 1, bitwise as if never stopped.
// With options.state_dir every job is persisted (scheduler/job_store.h) and a restarted
// scheduler resumes its running job from the newest checkpoint (JobStatus.restarts counts).
//
// Thread-safety: every public method is thread-safe.
#ifndef LSPO_SCHEDULER_SCHEDULER_CORE_H_
#define LSPO_SCHEDULER_SCHEDULER_CORE_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/lsp_offload.grpc.pb.h"
#include "scheduler/job_store.h"

namespace lspo::scheduler {

struct SchedulerOptions {
  // Parent of default output directories (runs/<name>-<job id>).
  std::string runs_root = "runs";
  // Deadline of each worker/optimizer RPC, seconds (a dead peer fails the job, never hangs).
  double rpc_deadline_seconds = 1800;
  // A job fails after this many non-finite steps in a row (each is skipped and counted).
  int max_nonfinite_steps_in_a_row = 5;
  // Directory where jobs (spec, state, progress, checkpoints) are persisted; a restarted
  // scheduler reloads them: queued jobs stay queued, running jobs resume from their last
  // checkpoint. Empty = jobs live in memory only.
  std::string state_dir;
  // Directories job specs may read from and write to (model, data, output, resume paths are
  // checked after resolving symlinks). Empty = no restriction (embedded single-user mode).
  std::vector<std::string> allowed_roots;
};

class SchedulerCore {
 public:
  // `worker` and `optimizer` are not owned and must outlive this object.
  SchedulerCore(lspo::v1::Worker::StubInterface* worker,
                lspo::v1::Optimizer::StubInterface* optimizer, SchedulerOptions options = {});
  ~SchedulerCore();  // Cancels running work and joins the runner thread.

  // OK, or why options.state_dir could not be used (the scheduler then keeps jobs in memory
  // only; lsp_scheduler refuses to start).
  absl::Status init_status() const { return init_status_; }

  // Resolves defaults, validates and queues. Errors: kInvalidArgument/kNotFound from
  // ValidateJobSpec (the message names the field).
  absl::StatusOr<std::string> Submit(lspo::v1::JobSpec spec);

  // Errors: kNotFound for an unknown id.
  absl::StatusOr<lspo::v1::JobStatus> Get(const std::string& job_id) const;
  std::vector<lspo::v1::JobStatus> List() const;

  // Queued jobs become CANCELLED at once; a running job stops after its current RPC.
  absl::StatusOr<lspo::v1::JobState> Cancel(const std::string& job_id);

  // Calls `on_status` with the status now and after every change until the job reaches a
  // final state or `on_status` returns false. Every completed step is reported: steps that
  // completed between two calls are replayed (status with that step's number and metrics)
  // before the current status. Errors: kNotFound.
  absl::Status Watch(const std::string& job_id,
                     const std::function<bool(const lspo::v1::JobStatus&)>& on_status) const;

  // Blocks until the job is final; returns its last status.
  absl::StatusOr<lspo::v1::JobStatus> Wait(const std::string& job_id) const;

 private:
  struct Job {
    lspo::v1::JobStatus status;
    std::vector<lspo::v1::StepMetrics> steps;  // Every completed step, for Watch.
    bool cancel_requested = false;
    int64_t version = 0;
  };

  void RunLoop();
  absl::Status RunJob(const std::string& job_id, const lspo::v1::JobSpec& spec);
  void Update(const std::string& job_id, const std::function<void(lspo::v1::JobStatus*)>& fn);
  bool CancelRequested(const std::string& job_id) const;
  // Writes the job's status to the job store (no-op without options.state_dir).
  void PersistLocked(Job* job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reloads persisted jobs (constructor): queued ones are queued again, running ones queued to
  // resume from their newest checkpoint.
  void RecoverJobs();

  lspo::v1::Worker::StubInterface* worker_;
  lspo::v1::Optimizer::StubInterface* optimizer_;
  SchedulerOptions options_;

  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::thread runner_;
  std::optional<JobStore> store_;
  absl::Status init_status_;
};

// True for SUCCEEDED, FAILED and CANCELLED.
bool IsFinal(lspo::v1::JobState state);

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_SCHEDULER_CORE_H_
