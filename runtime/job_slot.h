// The single-job slot of a peer service (the CPU optimizer, the worker): one job loaded at a
// time, found by its id, replaced when a new LoadJob comes (a restarted scheduler's), and
// abandoned from another thread while the service's own lock is held by a call that waits on
// the job's completion flags (runtime/completion_flags.h; issue 43).
//
// The slot splits its state by who may touch it:
//   * the job itself (Find, get, Install, Evict, Unload): under the OWNER's mutex, the one
//     that serialises the service's calls (absl::Mutex::AssertHeld checks it is held);
//   * the job's flags for abandoning a step (Abort) and the step of the call in progress
//     (MarkBusy, AbandonBusy): thread-safe without that mutex, because the call that waits
//     holds it for as long as it waits.
// Usage (a service core):
//   absl::MutexLock lock(&mu_);               // every RPC
//   ASSIGN_OR_RETURN(Job* job, slot_.Find(id));
//   auto busy = slot_.MarkBusy(step);         // a call that may wait on the flags
//   ...
//   UnloadJob: slot_.AbandonBusy(id); then, under mu_, slot_.Unload(id).
// `Job` needs a public `std::string id`. The header is torch-free; `Job` may be an incomplete
// type where JobSlot<Job> is declared (a member of the owner's class), and must be complete
// where its members are used: the owner's constructors (initialise the slot in their member
// initialiser lists, not with a default member initialiser), destructor and methods, all
// defined in the owner's .cc.
#ifndef LSPO_RUNTIME_JOB_SLOT_H_
#define LSPO_RUNTIME_JOB_SLOT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runtime/completion_flags.h"

namespace lspo::runtime {

template <typename Job>
class JobSlot {
 public:
  // `owner_mu`: the owner's mutex (not owned; outlives the slot) that guards the job.
  // `service`: the owner's name in messages ("optimizer", "worker"; a string literal).
  JobSlot(absl::Mutex* owner_mu, const char* service) : owner_mu_(owner_mu), service_(service) {}
  JobSlot(const JobSlot&) = delete;
  JobSlot& operator=(const JobSlot&) = delete;

  // The loaded job when its id is `job_id`. Owner's mutex held.
  // Errors: kFailedPrecondition "job 'ID' is not loaded on this SERVICE (LoadJob first)" when
  // no job or another job is loaded.
  absl::StatusOr<Job*> Find(const std::string& job_id) const {
    owner_mu_->AssertHeld();
    if (job_ == nullptr || job_->id != job_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("job '", job_id, "' is not loaded on this ", service_, " (LoadJob first)"));
    }
    return job_.get();
  }

  // The loaded job, or null. Owner's mutex held.
  Job* get() const {
    owner_mu_->AssertHeld();
    return job_.get();
  }

  // Loads `job` (non-null), replacing any job still loaded (as Evict), and attaches `flags`
  // (default-constructed for a job without an arena) and the optional `stop` word for Abort
  // (StepAborter::Attach). Owner's mutex held.
  void Install(std::unique_ptr<Job> job, CompletionFlags flags,
               std::shared_ptr<std::atomic<uint32_t>> stop = nullptr) {
    owner_mu_->AssertHeld();
    Evict();
    aborter_.Attach(job->id, std::move(flags), std::move(stop));
    job_ = std::move(job);
  }

  // Forgets the loaded job, if any: its flags are detached before it (and its arena) is
  // destroyed. Owner's mutex held.
  void Evict() {
    owner_mu_->AssertHeld();
    if (job_ == nullptr) return;
    aborter_.Detach();
    job_.reset();
  }

  // Evicts the loaded job when its id is `job_id`; returns whether it did. Owner's mutex held.
  bool Unload(const std::string& job_id) {
    owner_mu_->AssertHeld();
    if (job_ == nullptr || job_->id != job_id) return false;
    Evict();
    return true;
  }

  // Marks `step` abandoned for job `job_id` (StepAborter::Abort): a call waiting on its flags
  // returns kAborted. Without the owner's mutex. Errors: kFailedPrecondition when `job_id` is
  // not the attached job (naming the service).
  absl::Status Abort(const std::string& job_id, int step) {
    return aborter_.Abort(job_id, step, service_);
  }

  // Records `step` (1-based) as the step of the call in progress until the returned marker
  // is destroyed (then 0 = none), for AbandonBusy. Thread-safe.
  class Busy {
   public:
    Busy(Busy&& other) noexcept : step_(std::exchange(other.step_, nullptr)) {}
    Busy(const Busy&) = delete;
    Busy& operator=(const Busy&) = delete;
    Busy& operator=(Busy&&) = delete;
    ~Busy() {
      if (step_ != nullptr) step_->store(0);
    }

   private:
    friend class JobSlot;
    explicit Busy(std::atomic<int>* step) : step_(step) {}
    std::atomic<int>* step_;
  };
  [[nodiscard]] Busy MarkBusy(int step) {
    busy_step_.store(step);
    return Busy(&busy_step_);
  }

  // The step of the call in progress (0 = none). Thread-safe.
  int busy_step() const { return busy_step_.load(); }

  // Abandons the step of the call in progress, if any, for job `job_id` (a no-op for another
  // job's id): call before taking the owner's mutex in UnloadJob, so that a call waiting on
  // the flags (holding the mutex) returns instead of running to its timeout. Thread-safe.
  void AbandonBusy(const std::string& job_id) {
    if (const int step = busy_step_.load(); step > 0) (void)Abort(job_id, step);
  }

 private:
  absl::Mutex* const owner_mu_;
  const char* const service_;
  std::unique_ptr<Job> job_;  // Guarded by *owner_mu_.
  StepAborter aborter_;
  std::atomic<int> busy_step_{0};
};

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_JOB_SLOT_H_
