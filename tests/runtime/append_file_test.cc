// runtime/append_file.h: appends reach the file at once, truncate / continue on open, errors
// name the file, a closed file refuses appends.
#include "runtime/append_file.h"

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <utility>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/file_io.h"

namespace lspo::runtime {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  std::string templ = (std::filesystem::temp_directory_path() / "lspo-append-XXXXXX").string();
  EXPECT_NE(::mkdtemp(templ.data()), nullptr);
  return templ;
}

std::string Contents(const std::string& path) {
  auto s = ReadFileToString(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : std::string();
}

TEST(AppendFileTest, AppendsAtOnceAndContinuesOrTruncatesOnOpen) {
  const std::string dir = TempDir();
  const std::string path = dir + "/log.jsonl";
  {
    auto f = AppendFile::Open(path, /*truncate=*/false);
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->path(), path);
    ASSERT_TRUE(f->Append("one\n").ok());
    EXPECT_EQ(Contents(path), "one\n");  // No user-space buffer.
    AppendFile moved = std::move(*f);
    EXPECT_FALSE(f->is_open());
    ASSERT_TRUE(moved.Append("two\n").ok());
    ASSERT_TRUE(moved.Sync().ok());
    ASSERT_TRUE(moved.Close().ok());
    EXPECT_TRUE(moved.Close().ok());  // Closing twice is harmless.
  }
  {
    auto f = AppendFile::Open(path, /*truncate=*/false);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->Append("three\n").ok());
  }
  EXPECT_EQ(Contents(path), "one\ntwo\nthree\n");
  {
    auto f = AppendFile::Open(path, /*truncate=*/true);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE(f->Append("fresh\n").ok());
  }
  EXPECT_EQ(Contents(path), "fresh\n");
  std::filesystem::remove_all(dir);
}

TEST(AppendFileTest, ErrorsNameTheFile) {
  const std::string dir = TempDir();
  auto missing = AppendFile::Open(dir + "/no/such/dir/log", false);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/no/such/dir/log"));
  auto a_dir = AppendFile::Open(dir, false);
  ASSERT_FALSE(a_dir.ok());
  EXPECT_EQ(a_dir.status().code(), absl::StatusCode::kInvalidArgument);

  auto f = AppendFile::Open(dir + "/log", false);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(f->Close().ok());
  absl::Status st = f->Append("late\n");
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr(dir + "/log"));
  EXPECT_EQ(f->Sync().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(AppendFile().Append("x").code(), absl::StatusCode::kFailedPrecondition);
  std::filesystem::remove_all(dir);
}

TEST(AppendFileTest, AFullDiskLeavesNoPartOfTheAppend) {
  // /dev/full fails every write with ENOSPC: the status says so and names the file.
  auto f = AppendFile::Open("/dev/full", false);
  if (!f.ok()) GTEST_SKIP() << "no /dev/full: " << f.status();
  absl::Status st = f->Append("a line\n");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(st.message(), HasSubstr("/dev/full"));
}

}  // namespace
}  // namespace lspo::runtime
