#include "runtime/completion_flags.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <ctime>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace lspo::runtime {

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "futex words must be plain lock-free 32-bit atomics");

namespace {

long Futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}

}  // namespace

CompletionFlags::CompletionFlags(void* base, int64_t num_linears)
    : words_(static_cast<std::atomic<uint32_t>*>(base)), n_(num_linears) {
  CHECK(base != nullptr || num_linears == 0);
  CHECK_EQ(reinterpret_cast<uintptr_t>(base) % 4, 0u) << "flags must be 4-byte aligned";
}

void CompletionFlags::Publish(std::atomic<uint32_t>* w, uint32_t value) {
  w->store(value, std::memory_order_release);
  Futex(w, FUTEX_WAKE, INT_MAX, nullptr);
}

void CompletionFlags::Abort(uint32_t step) {
  Word(0)->store(step, std::memory_order_release);
  Futex(Word(0), FUTEX_WAKE, INT_MAX, nullptr);
  // Waiters sleep on their own word: wake them all so they re-check the abort word.
  for (int64_t k = 1; k < Words(n_); ++k) Futex(Word(k), FUTEX_WAKE, INT_MAX, nullptr);
}

absl::Status CompletionFlags::Wait(std::atomic<uint32_t>* w, uint32_t step, absl::Duration timeout,
                                   const char* what, int64_t i) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const uint32_t seen = w->load(std::memory_order_acquire);
    if (seen >= step) return absl::OkStatus();
    if (abort_step() == step) {
      return absl::AbortedError(absl::StrCat("step ", step, " was abandoned by the worker"));
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "timed out waiting for the ", what, i >= 0 ? absl::StrCat(" of linear ", i) : "",
          " at step ", step, " (last published: step ", seen, "); is the peer alive?"));
    }
    // Sleep while the word still holds `seen`; wake-ups, signals and a 50 ms cap (to
    // re-check the abort word, which lives elsewhere) all lead back to the checks above.
    const absl::Duration nap = std::min(left, absl::Milliseconds(50));
    timespec ts = absl::ToTimespec(nap);
    Futex(w, FUTEX_WAIT, seen, &ts);
  }
}

absl::Status CompletionFlags::WaitGrad(int64_t i, uint32_t step, absl::Duration timeout) const {
  CHECK(i >= 0 && i < n_) << "linear " << i;
  return Wait(Word(1 + i), step, timeout, "gradient", i);
}

absl::Status CompletionFlags::WaitStep(int64_t i, uint32_t step, absl::Duration timeout) const {
  CHECK(i >= 0 && i < n_) << "linear " << i;
  return Wait(Word(1 + n_ + i), step, timeout, "update", i);
}

absl::Status CompletionFlags::WaitVerdict(uint32_t step, absl::Duration timeout) const {
  return Wait(Word(1 + 2 * n_), step, timeout, "worker's verdict", -1);
}

void StepAborter::Attach(const std::string& job_id, CompletionFlags flags,
                         std::shared_ptr<std::atomic<uint32_t>> stop) {
  absl::MutexLock lock(&mu_);
  job_id_ = job_id;
  flags_ = flags;
  stop_ = std::move(stop);
}

void StepAborter::Detach() {
  absl::MutexLock lock(&mu_);
  job_id_.clear();
  flags_ = CompletionFlags();
  stop_.reset();
}

absl::Status StepAborter::Abort(const std::string& job_id, int step, const char* service) {
  absl::MutexLock lock(&mu_);
  if (job_id_ != job_id || (flags_.num_linears() == 0 && stop_ == nullptr)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' is not loaded on this ", service));
  }
  if (stop_ != nullptr) stop_->store(static_cast<uint32_t>(step), std::memory_order_release);
  if (flags_.num_linears() > 0) flags_.Abort(static_cast<uint32_t>(step));
  return absl::OkStatus();
}

}  // namespace lspo::runtime
