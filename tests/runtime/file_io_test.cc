// Tests of runtime/file_io.h: contents round-trip byte for byte, every failure has its
// canonical code and names the path, atomic replacement leaves no temporary behind.
#include "runtime/file_io.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lspo::runtime {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string TempDir() {
  std::string templ = (fs::temp_directory_path() / "lspo-file-io-XXXXXX").string();
  EXPECT_NE(::mkdtemp(templ.data()), nullptr);
  return templ;
}

TEST(FileIoTest, ReadingStopsAtTheLimitForFilesAndEndlessStreams) {
  // A regular file over the limit is refused by its size before anything is read; a stream
  // with no size (/dev/zero never ends) once the limit is passed, not when memory runs out.
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteFileSynced(dir + "/ten", "0123456789").ok());
  EXPECT_EQ(*ReadFileToString(dir + "/ten", "data file", 10), "0123456789");
  auto big = ReadFileToString(dir + "/ten", "data file", 9);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  EXPECT_NE(big.status().message().find("data file '" + dir + "/ten' holds 10 bytes"),
            std::string::npos) << big.status();
  EXPECT_NE(big.status().message().find("at most 9 bytes"), std::string::npos) << big.status();
  auto endless = ReadFileToString("/dev/zero", "data file", 1 << 20);
  EXPECT_EQ(endless.status().code(), absl::StatusCode::kResourceExhausted) << endless.status();
  fs::remove_all(dir);
}

TEST(FileIoTest, WriteThenReadRoundTripsEveryByte) {
  const std::string dir = TempDir();
  std::string bytes;
  for (int i = 0; i < 256 * 300; ++i) bytes.push_back(static_cast<char>(i % 256));  // > 64 KiB
  ASSERT_TRUE(WriteFileAtomically(dir + "/a.bin", bytes).ok());
  auto back = ReadFileToString(dir + "/a.bin");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, bytes);
  ASSERT_TRUE(WriteFileSynced(dir + "/empty", "").ok());
  EXPECT_EQ(*ReadFileToString(dir + "/empty"), "");
  // Replacing keeps only the new contents and leaves no temporary file.
  ASSERT_TRUE(WriteFileAtomically(dir + "/a.bin", "new").ok());
  EXPECT_EQ(*ReadFileToString(dir + "/a.bin"), "new");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) entries += e.is_regular_file();
  EXPECT_EQ(entries, 2);
  struct stat st;
  ASSERT_TRUE(WriteFileAtomically(dir + "/secret", "x", 0600).ok());
  ASSERT_EQ(::stat((dir + "/secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(FsyncDir(dir).ok());
  EXPECT_TRUE(FsyncFile(dir + "/secret").ok());
  fs::remove_all(dir);
}

TEST(FileIoTest, FailuresHaveCanonicalCodesAndNameThePath) {
  const std::string dir = TempDir();
  auto missing = ReadFileToString(dir + "/nope.tsv", "data.train_path");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("data.train_path '" + dir + "/nope.tsv'"));
  EXPECT_THAT(missing.status().message(), HasSubstr("check the path"));
  auto is_dir = ReadFileToString(dir);
  EXPECT_EQ(is_dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(is_dir.status().message(), HasSubstr("is a directory"));
  EXPECT_EQ(WriteFileSynced(dir + "/no/such/dir/f", "x").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WriteFileAtomically(dir + "/no/such/dir/f", "x").code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(FsyncDir(dir + "/nope").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FileErrnoStatus("write", "/x", ENOSPC).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(FileErrnoStatus("open", "/x", EACCES).code(), absl::StatusCode::kPermissionDenied);
  // Other errors are kInternal, never a dead peer's codes.
  EXPECT_EQ(FileErrnoStatus("read", "/x", EIO).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(FileErrnoStatus("write", "/x", ETIMEDOUT).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(FileErrnoStatus("write", "/x", EAGAIN).code(), absl::StatusCode::kInternal);
  if (::geteuid() != 0) {  // root reads files whatever their mode
    ASSERT_TRUE(WriteFileSynced(dir + "/locked", "x", 0000).ok());
    EXPECT_EQ(ReadFileToString(dir + "/locked").status().code(),
              absl::StatusCode::kPermissionDenied);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lspo::runtime
