#include "runtime/append_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/file_io.h"

namespace lspo::runtime {
namespace {

absl::Status ClosedError(absl::string_view op, const std::string& path) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot ", op, " file '", path, "': it is closed"));
}

}  // namespace

absl::StatusOr<AppendFile> AppendFile::Open(const std::string& path, bool truncate) {
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (truncate ? O_TRUNC : 0), 0644);
  if (fd < 0) return FileErrnoStatus("open for appending", path, errno);
  AppendFile f;
  f.path_ = path;
  f.fd_ = fd;
  return f;
}

AppendFile::AppendFile(AppendFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

AppendFile& AppendFile::operator=(AppendFile&& other) noexcept {
  if (this != &other) {
    (void)Close();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

AppendFile::~AppendFile() { (void)Close(); }

absl::Status AppendFile::Append(absl::string_view data) {
  if (fd_ < 0) return ClosedError("append to", path_);
  const off_t start = ::lseek(fd_, 0, SEEK_END);  // O_APPEND: every write lands at the end.
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status st = FileErrnoStatus("append to", path_, errno);
      // Never leave part of an append: the next one would be glued onto it.
      if (done > 0 && start >= 0) (void)::ftruncate(fd_, start);
      return st;
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AppendFile::Sync() {
  if (fd_ < 0) return ClosedError("fdatasync", path_);
  if (::fdatasync(fd_) != 0) return FileErrnoStatus("fdatasync", path_, errno);
  return absl::OkStatus();
}

absl::Status AppendFile::Close() {
  if (fd_ < 0) return absl::OkStatus();
  absl::Status st = Sync();
  if (::close(std::exchange(fd_, -1)) != 0 && st.ok()) {
    st = FileErrnoStatus("close", path_, errno);
  }
  return st;
}

}  // namespace lspo::runtime
