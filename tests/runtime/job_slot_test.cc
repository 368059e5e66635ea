// The single-job slot (runtime/job_slot.h): find by id, replace, unload, and abandoning the
// step of a call that waits on the job's flags while holding the owner's mutex.
#include "runtime/job_slot.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "runtime/completion_flags.h"

namespace lspo::runtime {
namespace {

// A job with its own completion flags (over plain memory) that counts its destruction.
struct FakeJob {
  FakeJob(std::string id, int* destroyed)
      : id(std::move(id)),
        words(CompletionFlags::Bytes(2) / 4, 0),
        flags(words.data(), 2),
        destroyed(destroyed) {}
  ~FakeJob() { ++*destroyed; }
  std::string id;
  std::vector<uint32_t> words;
  CompletionFlags flags;
  int* destroyed;
};

TEST(JobSlotTest, FindsTheLoadedJobByItsIdOnly) {
  absl::Mutex mu;
  JobSlot<FakeJob> slot(&mu, "optimizer");
  absl::MutexLock lock(&mu);
  auto none = slot.Find("a");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.status().message(), "job 'a' is not loaded on this optimizer (LoadJob first)");
  EXPECT_EQ(slot.get(), nullptr);
  int destroyed = 0;
  auto job = std::make_unique<FakeJob>("a", &destroyed);
  FakeJob* raw = job.get();
  slot.Install(std::move(job), raw->flags);
  auto found = slot.Find("a");
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(*found, raw);
  EXPECT_EQ(slot.get(), raw);
  EXPECT_EQ(slot.Find("b").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(destroyed, 0);
}

TEST(JobSlotTest, InstallReplacesTheJobAndItsFlags) {
  absl::Mutex mu;
  JobSlot<FakeJob> slot(&mu, "worker");
  int destroyed_a = 0, destroyed_b = 0;
  absl::MutexLock lock(&mu);
  auto a = std::make_unique<FakeJob>("a", &destroyed_a);
  CompletionFlags flags_a = a->flags;
  slot.Install(std::move(a), flags_a);
  ASSERT_TRUE(slot.Abort("a", 3).ok());
  EXPECT_EQ(flags_a.abort_step(), 3u);
  auto b = std::make_unique<FakeJob>("b", &destroyed_b);
  CompletionFlags flags_b = b->flags;
  slot.Install(std::move(b), flags_b);
  EXPECT_EQ(destroyed_a, 1);
  EXPECT_EQ(slot.Find("a").status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(slot.Find("b").ok());
  // The old job's flags are detached: an abort names the service and changes nothing.
  const absl::Status stale = slot.Abort("a", 4);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("worker"), std::string::npos) << stale;
  ASSERT_TRUE(slot.Abort("b", 5).ok());
  EXPECT_EQ(flags_b.abort_step(), 5u);
}

TEST(JobSlotTest, UnloadForgetsOnlyTheNamedJob) {
  absl::Mutex mu;
  JobSlot<FakeJob> slot(&mu, "optimizer");
  int destroyed = 0;
  absl::MutexLock lock(&mu);
  auto job = std::make_unique<FakeJob>("a", &destroyed);
  CompletionFlags flags = job->flags;
  slot.Install(std::move(job), flags);
  EXPECT_FALSE(slot.Unload("b"));
  EXPECT_EQ(destroyed, 0);
  EXPECT_TRUE(slot.Unload("a"));
  EXPECT_EQ(destroyed, 1);
  EXPECT_EQ(slot.get(), nullptr);
  EXPECT_EQ(slot.Abort("a", 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(slot.Unload("a"));
  slot.Evict();  // Nothing loaded: a no-op.
  EXPECT_EQ(destroyed, 1);
}

// A call holding the owner's mutex waits on the job's flags for step 5; AbandonBusy, without
// the mutex, ends that wait (kAborted) for the job's own id, and only for it.
TEST(JobSlotTest, AbandonBusyEndsTheWaitOfTheCallInProgress) {
  absl::Mutex mu;
  JobSlot<FakeJob> slot(&mu, "optimizer");
  int destroyed = 0;
  {
    absl::MutexLock lock(&mu);
    auto job = std::make_unique<FakeJob>("a", &destroyed);
    CompletionFlags flags = job->flags;
    slot.Install(std::move(job), flags);
  }
  EXPECT_EQ(slot.busy_step(), 0);
  slot.AbandonBusy("a");  // No call in progress: a no-op.
  absl::Status waited;
  std::atomic<bool> waiting{false};
  std::thread call([&] {
    absl::MutexLock lock(&mu);
    FakeJob* job = slot.Find("a").value();
    const auto busy = slot.MarkBusy(5);
    waiting.store(true);
    waited = job->flags.WaitGrad(0, 5, absl::Seconds(60));
  });
  while (!waiting.load()) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(slot.busy_step(), 5);
  slot.AbandonBusy("b");  // Another job's id: the call keeps waiting.
  absl::SleepFor(absl::Milliseconds(20));
  EXPECT_EQ(slot.busy_step(), 5);
  const absl::Time t0 = absl::Now();
  slot.AbandonBusy("a");
  call.join();
  EXPECT_LT(absl::Now() - t0, absl::Seconds(30));
  EXPECT_TRUE(absl::IsAborted(waited)) << waited;
  EXPECT_EQ(slot.busy_step(), 0);
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(slot.Unload("a"));
}

TEST(JobSlotTest, ABusyMarkerMovesAndClearsOnce) {
  absl::Mutex mu;
  JobSlot<FakeJob> slot(&mu, "optimizer");
  {
    auto outer = slot.MarkBusy(7);
    {
      auto inner = std::move(outer);
      EXPECT_EQ(slot.busy_step(), 7);
    }
    EXPECT_EQ(slot.busy_step(), 0);
  }
  EXPECT_EQ(slot.busy_step(), 0);
}

}  // namespace
}  // namespace lspo::runtime
