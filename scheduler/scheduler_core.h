// The scheduler's core (no server): the job queue, the job store and the status RPCs' data,
// and a runner thread that runs one job at a time through the worker and the optimizer
// (scheduler/job_runner.h: cadences, resume, checkpoints, the run log; step_executor.h: the
// serial and overlapped step). The peers are typed clients (scheduler/peer_clients.h): gRPC
// stubs (in-process or separate processes) or fakes in unit tests.
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
#include "proto/job_spec.pb.h"
#include "proto/metrics.pb.h"
#include "proto/optimizer.grpc.pb.h"
#include "proto/optimizer.pb.h"
#include "proto/scheduler.pb.h"
#include "proto/worker.grpc.pb.h"
#include "proto/worker.pb.h"
#include "scheduler/job_store.h"
#include "scheduler/peer_clients.h"

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
  // checked after resolving symlinks: CheckPathsUnderRoots). Empty = no restriction (embedded
  // single-user mode). The embedded runtime gives the same roots to its worker and optimizer.
  std::vector<std::string> allowed_roots;
  // A job interrupted by scheduler restarts is resumed automatically at most this many times
  // (its JobStatus.restarts); the next interruption leaves it FAILED, naming the count and
  // how to resume it by hand, so a job that brings the services down on every attempt cannot
  // loop forever (torchrun's --max-restarts, the same idea). 0 = never resume automatically.
  int max_restarts = 3;
};

class SchedulerCore {
 public:
  // A scheduler over the gRPC peers `worker` and `optimizer` (not owned; they must outlive
  // it). With options.state_dir, the job store is opened and its jobs recovered first.
  // Errors: the job store's (kPermissionDenied, kInvalidArgument, ... naming the directory);
  // no scheduler is started then, so no job is silently kept in memory only.
  static absl::StatusOr<std::unique_ptr<SchedulerCore>> Create(
      lspo::v1::Worker::StubInterface* worker, lspo::v1::Optimizer::StubInterface* optimizer,
      SchedulerOptions options = {});
  // As above, over any peer clients (fakes in tests).
  static absl::StatusOr<std::unique_ptr<SchedulerCore>> Create(
      std::unique_ptr<WorkerClient> worker, std::unique_ptr<OptimizerClient> optimizer,
      SchedulerOptions options = {});
  ~SchedulerCore();  // Cancels running work and joins the runner thread.

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
  class Host;  // JobHost for one job (scheduler_core.cc).
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

  // Recovers `store`'s jobs (when set) and starts the runner thread.
  SchedulerCore(std::unique_ptr<WorkerClient> worker, std::unique_ptr<OptimizerClient> optimizer,
                SchedulerOptions options, std::optional<JobStore> store);

  std::unique_ptr<WorkerClient> worker_client_;
  std::unique_ptr<OptimizerClient> optimizer_client_;
  SchedulerOptions options_;

  mutable absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::thread runner_;
  std::optional<JobStore> store_;
};

// True for SUCCEEDED, FAILED and CANCELLED.
bool IsFinal(lspo::v1::JobState state);

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_SCHEDULER_CORE_H_
