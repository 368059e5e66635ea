#include "runtime/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace lspo::runtime {
namespace {

std::string Describe(absl::string_view what, const std::string& path) {
  return what.empty() ? absl::StrCat("file '", path, "'") : absl::StrCat(what, " '", path, "'");
}

// A canonical status for `op` on `path` failing with `err`, naming both and the fix.
absl::Status ErrnoError(absl::string_view op, absl::string_view what, const std::string& path,
                        int err) {
  const std::string subject = Describe(what, path);
  const std::string reason = std::strerror(err);
  switch (err) {
    case ENOENT: {
      std::error_code ec;
      return absl::NotFoundError(absl::StrCat(subject, " does not exist (", op, ": ", reason,
                                              "); check the path (relative paths "
                                              "resolve from the working directory ",
                                              std::filesystem::current_path(ec).string(), ")"));
    }
    case EACCES:
    case EPERM:
    case EROFS:
      return absl::PermissionDeniedError(
          absl::StrCat("cannot ", op, " ", subject, ": ", reason, "; check its permissions"));
    case EISDIR:
      return absl::InvalidArgumentError(absl::StrCat(subject, " is a directory; pass a file"));
    case ENOTDIR:
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot ", op, " ", subject, ": a component of the path is not a directory"));
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot ", op, " ", subject, ": ", reason, "; free disk space"));
    default:
      // Deliberately not absl::ErrnoToStatus: it maps e.g. ETIMEDOUT to kDeadlineExceeded and
      // EAGAIN to kUnavailable, the codes of a dead peer, which a local file error must not
      // look like (a failed checkpoint write is not a failed job).
      return absl::InternalError(absl::StrCat("cannot ", op, " ", subject, ": ", reason));
  }
}

absl::Status WriteAll(int fd, absl::string_view contents, const std::string& path) {
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write", "", path, errno);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path, absl::string_view what,
                                             int64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open", what, path, errno);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError("stat", what, path, err);
  }
  if (S_ISDIR(st.st_mode)) {
    ::close(fd);
    return ErrnoError("read", what, path, EISDIR);
  }
  const auto too_large = [&](int64_t size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what.empty() ? "file" : what, " '", path, "' holds ", size, " bytes or more; at most ",
        max_bytes, " bytes of it are read into memory (split the file, or select part of it)"));
  };
  if (max_bytes > 0 && S_ISREG(st.st_mode) && st.st_size > max_bytes) {
    ::close(fd);
    return too_large(static_cast<int64_t>(st.st_size));
  }
  std::string out;
  if (S_ISREG(st.st_mode) && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return ErrnoError("read", what, path, err);
    }
    out.append(buf, static_cast<size_t>(n));
    if (max_bytes > 0 && static_cast<int64_t>(out.size()) > max_bytes) {  // a pipe, or growing
      ::close(fd);
      return too_large(static_cast<int64_t>(out.size()));
    }
  }
  ::close(fd);
  return out;
}

absl::Status WriteFileSynced(const std::string& path, absl::string_view contents, int mode) {
  const int fd =
      ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, static_cast<mode_t>(mode));
  if (fd < 0) return ErrnoError("create", "", path, errno);
  absl::Status s = WriteAll(fd, contents, path);
  if (s.ok() && ::fsync(fd) != 0) s = ErrnoError("fsync", "", path, errno);
  if (::close(fd) != 0 && s.ok()) s = ErrnoError("close", "", path, errno);
  return s;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents, int mode) {
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = absl::StrCat(path, ".tmp-", ::getpid(), "-", counter++);
  absl::Status s = WriteFileSynced(tmp, contents, mode);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    s = ErrnoError("rename a temporary file over", "", path, errno);
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return FsyncDir(parent.empty() ? "." : parent);
}

bool IsDirectory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool IsRegularFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

absl::Status FsyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open directory", "", dir, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("fsync directory", "", dir, err);
  return absl::OkStatus();
}

absl::Status FsyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("open for fsync", "", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError("fsync", "", path, err);
  return absl::OkStatus();
}

absl::Status FileErrnoStatus(absl::string_view op, const std::string& path, int err) {
  return ErrnoError(op, "", path, err);
}

}  // namespace lspo::runtime
