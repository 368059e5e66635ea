#include "scheduler/scheduler_core.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "runtime/status_macros.h"
#include "scheduler/checkpoint.h"
#include "scheduler/job_runner.h"
#include "spec/job_spec.h"

namespace lspo::scheduler {

using lspo::v1::JobSpec;
using lspo::v1::JobState;
using lspo::v1::JobStatus;

bool IsFinal(JobState s) {
  return s == lspo::v1::SUCCEEDED || s == lspo::v1::FAILED || s == lspo::v1::CANCELLED;
}

absl::StatusOr<std::unique_ptr<SchedulerCore>> SchedulerCore::Create(
    lspo::v1::Worker::StubInterface* worker, lspo::v1::Optimizer::StubInterface* optimizer,
    SchedulerOptions options) {
  return Create(MakeGrpcWorkerClient(worker), MakeGrpcOptimizerClient(optimizer),
                std::move(options));
}

absl::StatusOr<std::unique_ptr<SchedulerCore>> SchedulerCore::Create(
    std::unique_ptr<WorkerClient> worker, std::unique_ptr<OptimizerClient> optimizer,
    SchedulerOptions options) {
  std::optional<JobStore> store;
  if (!options.state_dir.empty()) {
    absl::StatusOr<JobStore> opened = JobStore::OpenExclusive(options.state_dir);
    if (!opened.ok()) {
      return absl::Status(opened.status().code(),
                          absl::StrCat("scheduler state_dir: ", opened.status().message()));
    }
    store = std::move(*opened);
  }
  return std::unique_ptr<SchedulerCore>(new SchedulerCore(std::move(worker), std::move(optimizer),
                                                          std::move(options), std::move(store)));
}

SchedulerCore::SchedulerCore(std::unique_ptr<WorkerClient> worker,
                             std::unique_ptr<OptimizerClient> optimizer, SchedulerOptions options,
                             std::optional<JobStore> store)
    : worker_client_(std::move(worker)),
      optimizer_client_(std::move(optimizer)),
      options_(std::move(options)),
      store_(std::move(store)) {
  if (store_.has_value()) RecoverJobs();
  runner_ = std::thread([this] { RunLoop(); });
}

void SchedulerCore::PersistLocked(Job* job) {
  if (!store_.has_value()) return;
  absl::Status st = store_->Save(job->status);
  if (!st.ok()) {
    LOG(WARNING) << "scheduler: cannot persist " << job->status.job_id() << ": " << st;
  }
}

void SchedulerCore::RecoverJobs() {
  std::vector<std::string> skipped;
  std::vector<JobStatus> stored = store_->LoadAll(&skipped);
  for (const std::string& s : skipped) {
    LOG(ERROR) << "scheduler: skipped an unreadable job file (renamed to .corrupt): " << s;
  }
  absl::MutexLock lock(&mu_);
  // Ids are job-<unix seconds>-<sequence>: queue in submission order, the interrupted job first.
  auto seq_of = [](const std::string& id) {
    int64_t n = 0;
    const size_t dash = id.rfind('-');
    if (dash != std::string::npos) (void)absl::SimpleAtoi(id.substr(dash + 1), &n);
    return n;
  };
  std::vector<std::pair<int64_t, std::string>> interrupted, queued;
  for (JobStatus& st : stored) {
    const std::string id = st.job_id();
    next_id_ = std::max(next_id_, seq_of(id) + 1);
    const bool was_running =
        st.state() == lspo::v1::RUNNING || st.state() == lspo::v1::CHECKPOINTING;
    if (was_running && st.cancel_requested()) {
      // Cancelled while it ran; the scheduler died before the job stopped.
      st.set_state(lspo::v1::CANCELLED);
      st.set_phase("cancelled (before a scheduler restart)");
    } else if (was_running && st.restarts() >= options_.max_restarts) {
      st.set_state(lspo::v1::FAILED);
      st.set_phase("failed");
      st.set_error(absl::StrCat(
          "interrupted by a scheduler restart after ", st.restarts(),
          " automatic resumes (the scheduler's max_restarts is ", options_.max_restarts,
          "); not resumed again. Resume it by hand: submit its spec with resume_from: latest",
          st.last_checkpoint_step() > 0
              ? absl::StrCat(" (last checkpoint: step ", st.last_checkpoint_step(), ")")
              : std::string()));
      LOG(ERROR) << "scheduler: job " << id << ": " << st.error();
    } else if (was_running) {
      st.set_state(lspo::v1::QUEUED);
      st.set_restarts(st.restarts() + 1);
      st.set_phase("queued (resuming after a scheduler restart)");
      if (!ListCheckpoints(st.spec().output_dir()).empty()) {
        st.mutable_spec()->set_resume_from("latest");
      }
      interrupted.emplace_back(seq_of(id), id);
    } else if (st.state() == lspo::v1::QUEUED) {
      queued.emplace_back(seq_of(id), id);
    }
    Job job;
    job.status = std::move(st);
    jobs_[id] = std::move(job);
    PersistLocked(&jobs_[id]);
  }
  std::sort(interrupted.begin(), interrupted.end());
  std::sort(queued.begin(), queued.end());
  for (const auto& [seq, id] : interrupted) queue_.push_back(id);
  for (const auto& [seq, id] : queued) queue_.push_back(id);
  LOG(INFO) << "scheduler: recovered " << stored.size() << " jobs from " << store_->dir() << " ("
            << interrupted.size() << " to resume, " << queued.size() << " queued)";
}

SchedulerCore::~SchedulerCore() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    for (auto& [id, job] : jobs_) job.cancel_requested = true;
  }
  runner_.join();
}

absl::StatusOr<std::string> SchedulerCore::Submit(JobSpec spec) {
  spec::ResolveDefaults(&spec);
  // The roots first: the validation's existence checks would otherwise tell a client which
  // files exist outside them.
  RETURN_IF_ERROR(spec::CheckPathsUnderRoots(spec, options_.allowed_roots));
  RETURN_IF_ERROR(spec::ValidateJobSpec(spec));
  absl::MutexLock lock(&mu_);
  const std::string id = absl::StrCat("job-", absl::ToUnixSeconds(absl::Now()), "-", next_id_++);
  Job job;
  job.status.set_job_id(id);
  job.status.set_state(lspo::v1::QUEUED);
  job.status.set_total_steps(spec.steps());
  job.status.set_phase("queued");
  if (spec.output_dir().empty()) {
    spec.set_output_dir(absl::StrCat(options_.runs_root, "/", spec.name(), "-", id));
  }
  job.status.set_output_dir(spec.output_dir());
  *job.status.mutable_spec() = spec;
  RETURN_IF_ERROR(
      spec::CheckPathsUnderRoots(spec, options_.allowed_roots));  // the default output_dir
  jobs_[id] = std::move(job);
  PersistLocked(&jobs_[id]);
  queue_.push_back(id);
  LOG(INFO) << "scheduler: queued " << id << " (" << spec.name() << ")";
  return id;
}

absl::StatusOr<JobStatus> SchedulerCore::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "' (lspctl list shows jobs)"));
  }
  return it->second.status;
}

std::vector<JobStatus> SchedulerCore::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobStatus> out;
  for (const auto& [id, job] : jobs_) out.push_back(job.status);
  return out;
}

absl::StatusOr<JobState> SchedulerCore::Cancel(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  Job& job = it->second;
  job.cancel_requested = true;
  if (job.status.state() == lspo::v1::QUEUED) {
    job.status.set_state(lspo::v1::CANCELLED);
    job.status.set_phase("cancelled");
    ++job.version;
    PersistLocked(&job);
  } else if (job.status.state() == lspo::v1::RUNNING ||
             job.status.state() == lspo::v1::CHECKPOINTING) {
    // Persisted now: a scheduler restart before the job stops must not resume it.
    job.status.set_cancel_requested(true);
    ++job.version;
    PersistLocked(&job);
  }
  return job.status.state();
}

absl::Status SchedulerCore::Watch(const std::string& job_id,
                                  const std::function<bool(const JobStatus&)>& on_status) const {
  int64_t seen = -1;
  size_t steps_sent = 0;
  while (true) {
    JobStatus snapshot;
    std::vector<JobStatus> replay;
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
      const Job* job = &it->second;
      auto changed = [job, seen]() { return job->version != seen; };
      mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Seconds(1));
      if (job->version == seen) continue;
      seen = job->version;
      snapshot = job->status;
      // Steps completed since the last call, except the newest (it is in `snapshot`).
      for (; steps_sent + 1 < job->steps.size(); ++steps_sent) {
        JobStatus s = snapshot;
        s.set_step(job->steps[steps_sent].step());
        *s.mutable_last_step() = job->steps[steps_sent];
        s.set_state(lspo::v1::RUNNING);
        replay.push_back(std::move(s));
      }
      steps_sent = std::max(steps_sent, job->steps.size());
    }
    for (const auto& s : replay) {
      if (!on_status(s)) return absl::OkStatus();
    }
    if (!on_status(snapshot)) return absl::OkStatus();
    if (IsFinal(snapshot.state())) return absl::OkStatus();
  }
}

absl::StatusOr<JobStatus> SchedulerCore::Wait(const std::string& job_id) const {
  JobStatus last;
  RETURN_IF_ERROR(Watch(job_id, [&](const JobStatus& s) {
    last = s;
    return true;
  }));
  return last;
}

void SchedulerCore::Update(const std::string& job_id, const std::function<void(JobStatus*)>& fn) {
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  fn(&job.status);
  ++job.version;
  PersistLocked(&job);
}

bool SchedulerCore::CancelRequested(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it != jobs_.end() && it->second.cancel_requested;
}

void SchedulerCore::RunLoop() {
  while (true) {
    std::string id;
    JobSpec spec;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdown_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (shutdown_) return;
      id = queue_.front();
      queue_.pop_front();
      Job& job = jobs_[id];
      if (job.status.state() != lspo::v1::QUEUED) continue;  // Cancelled while queued.
      job.status.set_state(lspo::v1::RUNNING);
      job.status.set_phase("loading");
      job.status.clear_error();
      ++job.version;
      PersistLocked(&job);
      spec = job.status.spec();
    }
    absl::Status st = RunJob(id, spec);
    Update(id, [&](JobStatus* s) {
      if (st.ok()) {
        s->set_state(lspo::v1::SUCCEEDED);
        s->set_phase("done");
      } else if (absl::IsCancelled(st)) {
        s->set_state(lspo::v1::CANCELLED);
        s->set_phase("cancelled");
      } else {
        s->set_state(lspo::v1::FAILED);
        s->set_phase("failed");
        s->set_error(std::string(st.message()));
        LOG(ERROR) << "scheduler: job " << id << " failed: " << st;
      }
    });
  }
}

// The runner's view of one job in this core (JobHost).
class SchedulerCore::Host final : public JobHost {
 public:
  Host(SchedulerCore* core, std::string id) : core_(core), id_(std::move(id)) {}
  void UpdateStatus(const std::function<void(JobStatus*)>& fn) override { core_->Update(id_, fn); }
  void RecordStep(const lspo::v1::StepMetrics& m, double eta_seconds) override {
    absl::MutexLock lock(&core_->mu_);
    Job& job = core_->jobs_[id_];
    job.status.set_step(m.step());
    *job.status.mutable_last_step() = m;
    job.status.set_eta_seconds(eta_seconds);
    job.steps.push_back(m);
    ++job.version;
    core_->PersistLocked(&job);
  }
  bool CancelRequested() const override { return core_->CancelRequested(id_); }
  std::vector<lspo::v1::EvalMetrics> Evals() const override {
    absl::MutexLock lock(&core_->mu_);
    const auto& evals = core_->jobs_[id_].status.evals();
    return {evals.begin(), evals.end()};
  }

 private:
  SchedulerCore* core_;
  std::string id_;
};

absl::Status SchedulerCore::RunJob(const std::string& id, const JobSpec& spec) {
  Host host(this, id);
  RunnerOptions options;
  options.rpc_deadline_seconds = options_.rpc_deadline_seconds;
  options.max_nonfinite_steps_in_a_row = options_.max_nonfinite_steps_in_a_row;
  JobRunner runner(id, spec, worker_client_.get(), optimizer_client_.get(), &host, options);
  return runner.Run();
}

}  // namespace lspo::scheduler
