// An append-only log file written with write(2): no user-space buffer, so whatever an Append
// returned OK for is in the kernel and a crash of the process loses none of it. An Append
// that fails part-way (disk full) is truncated back, so the file holds whole appends only (a
// JSON line, a TFRecord) and the next append is not glued onto half of one. Used by the run
// log (metrics.jsonl, timeline.jsonl) and the TensorBoard events file.
//
// Errors are the canonical statuses of runtime/file_io.h, naming the path:
// kNotFound, kPermissionDenied, kInvalidArgument, kResourceExhausted (disk full), kInternal.
//
// Thread-safety: not thread-safe; one owner at a time (movable, not copyable).
#ifndef LSPO_RUNTIME_APPEND_FILE_H_
#define LSPO_RUNTIME_APPEND_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lspo::runtime {

class AppendFile {
 public:
  // Opens `path` for appending, creating it (mode 0644) if missing; `truncate` empties an
  // existing file first. Errors: those of open(2), as in the file comment.
  static absl::StatusOr<AppendFile> Open(const std::string& path, bool truncate);

  AppendFile() = default;  // Closed: Append and Sync fail with kFailedPrecondition.
  AppendFile(AppendFile&& other) noexcept;
  AppendFile& operator=(AppendFile&& other) noexcept;
  AppendFile(const AppendFile&) = delete;
  AppendFile& operator=(const AppendFile&) = delete;
  // Closes as Close() does, ignoring its error.
  ~AppendFile();

  // Writes all of `data` at the end of the file (retrying short writes and EINTR). On an
  // error the file is cut back to its size before the call. kFailedPrecondition when closed.
  absl::Status Append(absl::string_view data);
  // fdatasync(2): what was appended survives a power loss. kFailedPrecondition when closed.
  absl::Status Sync();
  // fdatasync and close; OK (and nothing done) when already closed.
  absl::Status Close();

  bool is_open() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_APPEND_FILE_H_
