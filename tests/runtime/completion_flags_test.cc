// Completion flags: publish/wait ordering across threads and across processes (a forked child
// mapping the same shared-memory arena), abort, and timeout.
#include "runtime/completion_flags.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/shm_arena.h"

namespace lspo::runtime {
namespace {

TEST(CompletionFlagsTest, WaitSeesPublishedPayloadFromAnotherThread) {
  std::vector<uint32_t> words(CompletionFlags::Bytes(3) / 4, 0);
  CompletionFlags flags(words.data(), 3);
  std::vector<float> payload(1024, 0.0f);
  std::thread producer([&] {
    for (uint32_t step = 1; step <= 50; ++step) {
      // The consumer must have taken the previous payload before it is overwritten.
      ASSERT_TRUE(flags.WaitStep(2, step - 1 == 0 ? 0 : step - 1, absl::Seconds(10)).ok());
      for (auto& x : payload) x = static_cast<float>(step);
      flags.PublishGrad(2, step);
    }
  });
  for (uint32_t step = 1; step <= 50; ++step) {
    ASSERT_TRUE(flags.WaitGrad(2, step, absl::Seconds(10)).ok());
    for (float x : payload) ASSERT_EQ(x, static_cast<float>(step));
    flags.PublishStep(2, step);
  }
  producer.join();
  EXPECT_EQ(flags.grad_seq(2), 50u);
  EXPECT_EQ(flags.grad_seq(0), 0u);
}

TEST(CompletionFlagsTest, AbortWakesWaitersOfThatStepOnly) {
  std::vector<uint32_t> words(CompletionFlags::Bytes(2) / 4, 0);
  CompletionFlags flags(words.data(), 2);
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(20));
    flags.Abort(7);
  });
  absl::Status st = flags.WaitGrad(1, 7, absl::Seconds(10));
  aborter.join();
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  // Another step is not affected by step 7's abort: it times out.
  st = flags.WaitGrad(1, 8, absl::Milliseconds(30));
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_NE(st.message().find("linear 1 at step 8"), std::string::npos) << st;
}

// The verdict word (issue 43): its own word after the step flags, set by PublishVerdict, seen
// by WaitVerdict; an abort of the step ends the wait with kAborted, and nothing else writes it.
TEST(CompletionFlagsTest, TheVerdictIsItsOwnWordAndAnAbortEndsItsWait) {
  EXPECT_EQ(CompletionFlags::Words(3), 8);
  EXPECT_EQ(CompletionFlags::Bytes(3), 32u);
  std::vector<uint32_t> words(CompletionFlags::Words(3) + 1, 0xAAAAAAAAu);
  std::fill(words.begin(), words.begin() + CompletionFlags::Words(3), 0u);
  CompletionFlags flags(words.data(), 3);
  for (int64_t i = 0; i < 3; ++i) {
    flags.PublishGrad(i, 5);
    flags.PublishStep(i, 5);
  }
  EXPECT_EQ(flags.verdict_seq(), 0u);
  std::thread worker([&] {
    absl::SleepFor(absl::Milliseconds(20));
    flags.PublishVerdict(5);
  });
  EXPECT_TRUE(flags.WaitVerdict(5, absl::Seconds(10)).ok());
  worker.join();
  EXPECT_EQ(words[CompletionFlags::Words(3) - 1], 5u);  // the last word of the region
  EXPECT_EQ(words[CompletionFlags::Words(3)], 0xAAAAAAAAu);  // nothing written past it
  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(20));
    flags.Abort(6);
  });
  absl::Status st = flags.WaitVerdict(6, absl::Seconds(10));
  aborter.join();
  EXPECT_TRUE(absl::IsAborted(st)) << st;
  st = flags.WaitVerdict(7, absl::Milliseconds(30));
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_NE(st.message().find("verdict at step 7"), std::string::npos) << st;
}

TEST(CompletionFlagsTest, WorksAcrossProcessesThroughSharedMemory) {
  auto arena = ShmArena::Create(ShmArena::UniqueName("flags-test"), 4096);
  ASSERT_TRUE(arena.ok()) << arena.status();
  CompletionFlags flags(arena->data(), 4);
  float* payload = reinterpret_cast<float*>(arena->data() + 64);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Child: echo each gradient doubled as the step, 20 times.
    for (uint32_t s = 1; s <= 20; ++s) {
      if (!flags.WaitGrad(3, s, absl::Seconds(10)).ok()) _exit(2);
      payload[1] = payload[0] * 2;
      flags.PublishStep(3, s);
    }
    _exit(0);
  }
  bool ok = true;
  for (uint32_t s = 1; s <= 20 && ok; ++s) {
    payload[0] = static_cast<float>(s);
    flags.PublishGrad(3, s);
    ok = flags.WaitStep(3, s, absl::Seconds(10)).ok() && payload[1] == 2.0f * s;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(ok);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  arena->Unlink();
}

TEST(StepAborterTest, AbortSetsTheStopWordAndTheFlagsOfTheAttachedJobOnly) {
  std::vector<uint32_t> words(CompletionFlags::Bytes(2) / 4, 0);
  CompletionFlags flags(words.data(), 2);
  auto stop = std::make_shared<std::atomic<uint32_t>>(0);
  StepAborter aborter;
  EXPECT_EQ(aborter.Abort("job-1", 3, "worker").code(), absl::StatusCode::kFailedPrecondition);
  aborter.Attach("job-1", flags, stop);
  EXPECT_EQ(aborter.Abort("job-2", 3, "worker").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stop->load(), 0u);
  ASSERT_TRUE(aborter.Abort("job-1", 3, "worker").ok());
  EXPECT_EQ(stop->load(), 3u);
  EXPECT_EQ(flags.abort_step(), 3u);
  // A job without an arena (native, lora): the stop word alone.
  auto stop2 = std::make_shared<std::atomic<uint32_t>>(0);
  aborter.Attach("job-3", CompletionFlags(), stop2);
  ASSERT_TRUE(aborter.Abort("job-3", 5, "worker").ok());
  EXPECT_EQ(stop2->load(), 5u);
  aborter.Detach();
  EXPECT_EQ(aborter.Abort("job-3", 6, "worker").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(stop2->load(), 5u);
}

}  // namespace
}  // namespace lspo::runtime
