#include "scheduler/run_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "runtime/file_io.h"
#include "runtime/status_macros.h"

namespace lspo::scheduler {
namespace {

absl::StatusOr<int> OpenLog(const std::string& path, bool append) {
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  if (fd < 0) return runtime::FileErrnoStatus("open for writing", path, errno);
  return fd;
}

}  // namespace

absl::StatusOr<RunLog> RunLog::Open(const std::string& out_dir, bool append,
                                    bool with_timeline) {
  RunLog log;
  log.out_dir_ = out_dir;
  ASSIGN_OR_RETURN(log.metrics_fd_, OpenLog(out_dir + "/metrics.jsonl", append));
  if (with_timeline) {
    ASSIGN_OR_RETURN(log.timeline_fd_, OpenLog(out_dir + "/timeline.jsonl", append));
  }
  return log;
}

RunLog::RunLog(RunLog&& other) noexcept
    : out_dir_(std::move(other.out_dir_)),
      metrics_fd_(std::exchange(other.metrics_fd_, -1)),
      timeline_fd_(std::exchange(other.timeline_fd_, -1)),
      error_(std::move(other.error_)) {}

RunLog& RunLog::operator=(RunLog&& other) noexcept {
  if (this != &other) {
    Close();
    out_dir_ = std::move(other.out_dir_);
    metrics_fd_ = std::exchange(other.metrics_fd_, -1);
    timeline_fd_ = std::exchange(other.timeline_fd_, -1);
    error_ = std::move(other.error_);
  }
  return *this;
}

RunLog::~RunLog() { Close(); }

void RunLog::Close() {
  for (int* fd : {&metrics_fd_, &timeline_fd_}) {
    if (*fd >= 0) {
      ::fdatasync(*fd);
      ::close(*fd);
      *fd = -1;
    }
  }
}

absl::Status RunLog::Append(int fd, const std::string& path, const nlohmann::json& line) {
  const std::string text = line.dump() + "\n";
  const off_t start = ::lseek(fd, 0, SEEK_END);  // O_APPEND: every write lands at the end
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status st = runtime::FileErrnoStatus("append to", path, errno);
      // Never leave half a line: the next one would be glued onto it.
      if (done > 0 && start >= 0) (void)::ftruncate(fd, start);
      if (error_.ok()) error_ = st;
      return st;
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status RunLog::Metrics(const nlohmann::json& line) {
  return Append(metrics_fd_, out_dir_ + "/metrics.jsonl", line);
}

absl::Status RunLog::Timeline(const nlohmann::json& line) {
  if (timeline_fd_ < 0) return absl::OkStatus();
  return Append(timeline_fd_, out_dir_ + "/timeline.jsonl", line);
}

absl::Status RunLog::Sync() {
  if (!error_.ok()) return error_;  // A lost line: what is on disk is incomplete.
  if (metrics_fd_ >= 0 && ::fdatasync(metrics_fd_) != 0) {
    return runtime::FileErrnoStatus("fdatasync", out_dir_ + "/metrics.jsonl", errno);
  }
  if (timeline_fd_ >= 0 && ::fdatasync(timeline_fd_) != 0) {
    return runtime::FileErrnoStatus("fdatasync", out_dir_ + "/timeline.jsonl", errno);
  }
  return absl::OkStatus();
}

absl::Status RunLog::WriteSummary(const nlohmann::json& summary) {
  RETURN_IF_ERROR(Sync());
  return runtime::WriteFileAtomically(out_dir_ + "/summary.json", summary.dump(2) + "\n");
}

}  // namespace lspo::scheduler
