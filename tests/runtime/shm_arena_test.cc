#include "runtime/shm_arena.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "gtest/gtest.h"

namespace lspo::runtime {
namespace {

bool ShmExists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

TEST(ShmArenaTest, CreateIs0600ZeroFilledAndRemovedAtDestruction) {
  std::string name = ShmArena::UniqueName("test");
  {
    auto arena = ShmArena::Create(name, 4096);
    ASSERT_TRUE(arena.ok()) << arena.status();
    struct stat st {};
    ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    for (size_t i = 0; i < arena->size(); ++i) ASSERT_EQ(arena->data()[i], 0);
  }
  EXPECT_FALSE(ShmExists(name));
}

TEST(ShmArenaTest, AnotherProcessSeesWritesThroughAttach) {
  std::string name = ShmArena::UniqueName("xproc");
  auto arena = ShmArena::Create(name, 1 << 16);
  ASSERT_TRUE(arena.ok()) << arena.status();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto child = ShmArena::Attach(name, 1 << 16);
    if (!child.ok()) _exit(2);
    auto f = child->At<float>(128, 4);
    if (!f.ok()) _exit(3);
    for (int i = 0; i < 4; ++i) (*f)[i] = 1.5f * (i + 1);
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  ASSERT_EQ(WEXITSTATUS(status), 0);
  auto f = arena->At<float>(128, 4);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ((*f)[0], 1.5f);
  EXPECT_EQ((*f)[3], 6.0f);
}

TEST(ShmArenaTest, BadInputsGiveClearErrors) {
  EXPECT_EQ(ShmArena::Create("no-slash", 64).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmArena::Create("/a/b", 64).status().code(), absl::StatusCode::kInvalidArgument);
  std::string name = ShmArena::UniqueName("bad");
  EXPECT_EQ(ShmArena::Create(name, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmArena::Attach(name, 64).status().code(), absl::StatusCode::kNotFound);
  auto arena = ShmArena::Create(name, 256);
  ASSERT_TRUE(arena.ok());
  EXPECT_EQ(ShmArena::Create(name, 256).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ShmArena::Attach(name, 512).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(arena->At<float>(252, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(arena->At<float>(2, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(arena->At<float>(248, 2).ok());
  // An absurd count must not overflow the bounds check.
  EXPECT_EQ(arena->At<float>(0, ~uint64_t{0} / 2).status().code(),
            absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace lspo::runtime
