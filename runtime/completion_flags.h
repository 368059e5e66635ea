// Lock-free per-linear completion flags in the job's shared-memory arena, waitable across
// processes with futexes (futex(2), shared — not FUTEX_PRIVATE — so a worker and an optimizer
// in different processes that map the same arena can wait on each other's words).
//
// Word layout (uint32, 4-byte aligned, inside the arena; see ArenaLayout.flags in
// proto/arena.proto):  [abort_step, grad_seq[0..L), step_seq[0..L), verdict_seq]
//   grad_seq[i] = s  : the gradient of linear i for optimizer step s is in its slot
//   step_seq[i] = s  : the update (D or parameters) of linear i for step s is in its slot
//   abort_step  = s  : the worker abandoned step s (non-finite gradient); waiters give up
//   verdict_seq = s  : the worker's verdict on step s: every gradient and the loss are finite
//                      (and, data parallel, every rank agreed), so the optimizer may keep the
//                      step it took while the backward ran (issue 43: a skipped step is all or
//                      nothing: until the verdict, the optimizer keeps what it needs to undo)
// Producers write the slot, then Publish (release store + FUTEX_WAKE); consumers Wait
// (acquire load, FUTEX_WAIT while smaller) and then read the slot. Steps only grow, so a
// counter never needs resetting and a stale value is never mistaken for a new one.
//
// Thread-safety: every method is safe to call from any thread or process.
#ifndef LSPO_RUNTIME_COMPLETION_FLAGS_H_
#define LSPO_RUNTIME_COMPLETION_FLAGS_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lspo::runtime {

class CompletionFlags {
 public:
  // uint32 words for `num_linears` linears: 2 + 2 * num_linears (the layout above).
  static int64_t Words(int64_t num_linears) { return 2 + 2 * num_linears; }
  // Bytes needed for `num_linears` linears: 4 * Words(num_linears).
  static uint64_t Bytes(int64_t num_linears) { return 4u * Words(num_linears); }

  CompletionFlags() = default;
  // `base` points at Bytes(num_linears) zero-initialised (or previously used) bytes in shared
  // memory, 4-byte aligned; not owned.
  CompletionFlags(void* base, int64_t num_linears);

  int64_t num_linears() const { return n_; }

  // Marks linear i's gradient (or update) of step `step` as written, waking waiters.
  void PublishGrad(int64_t i, uint32_t step) { Publish(Word(1 + i), step); }
  void PublishStep(int64_t i, uint32_t step) { Publish(Word(1 + n_ + i), step); }
  // Marks `step` abandoned (wakes every waiter).
  void Abort(uint32_t step);
  // The worker's verdict: step `step` is finite everywhere and will be applied (wakes waiters).
  void PublishVerdict(uint32_t step) { Publish(Word(1 + 2 * n_), step); }

  uint32_t grad_seq(int64_t i) const { return Word(1 + i)->load(std::memory_order_acquire); }
  uint32_t step_seq(int64_t i) const { return Word(1 + n_ + i)->load(std::memory_order_acquire); }
  uint32_t abort_step() const { return Word(0)->load(std::memory_order_acquire); }
  uint32_t verdict_seq() const { return Word(1 + 2 * n_)->load(std::memory_order_acquire); }

  // Blocks until grad_seq(i) >= step (OK), abort_step() == step (kAborted), or `timeout`
  // passes (kDeadlineExceeded, naming the linear and the step).
  absl::Status WaitGrad(int64_t i, uint32_t step, absl::Duration timeout) const;
  // Blocks until step_seq(i) >= step; same errors.
  absl::Status WaitStep(int64_t i, uint32_t step, absl::Duration timeout) const;
  // Blocks until verdict_seq() >= step (OK: keep the step), abort_step() == step (kAborted:
  // undo it), or `timeout` passes (kDeadlineExceeded naming the step).
  absl::Status WaitVerdict(uint32_t step, absl::Duration timeout) const;

 private:
  std::atomic<uint32_t>* Word(int64_t k) const { return words_ + k; }
  void Publish(std::atomic<uint32_t>* w, uint32_t value);
  absl::Status Wait(std::atomic<uint32_t>* w, uint32_t step, absl::Duration timeout,
                    const char* what, int64_t i) const;

  std::atomic<uint32_t>* words_ = nullptr;
  int64_t n_ = 0;
};

// The loaded job's flags, for abandoning a step from an RPC thread while another thread of the
// same service holds the service's own lock and waits on those flags. Thread-safe.
class StepAborter {
 public:
  // Remembers `flags` as the flags of job `job_id` (replacing any previous job) and, when
  // given, `stop`: the word Abort also sets to the abandoned step, which the job's compute
  // polls at every layer boundary (any mode, with or without an arena; issue 43, a cancel
  // stops a running step at the next layer).
  void Attach(const std::string& job_id, CompletionFlags flags,
              std::shared_ptr<std::atomic<uint32_t>> stop = nullptr);
  // Forgets the job (call before its arena is unmapped).
  void Detach();
  // For job `job_id`: sets its stop word (if attached) to `step` and flags.Abort(step) (if it
  // has flags). kFailedPrecondition if that job is not attached, or has neither, naming
  // `service`.
  absl::Status Abort(const std::string& job_id, int step, const char* service);

 private:
  absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  CompletionFlags flags_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<std::atomic<uint32_t>> stop_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_COMPLETION_FLAGS_H_
