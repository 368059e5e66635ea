// The one seam for whole-file I/O (in the manner of leveldb's Env helpers): read a file into a
// string, write one durably, fsync a directory. Every error is a canonical absl status that
// names the path and says what to do:
//   kNotFound          the path (or a parent directory) does not exist
//   kPermissionDenied  the process may not read / write it
//   kInvalidArgument   the path is a directory where a file was expected, or a component of
//                      it is not a directory
//   kResourceExhausted the disk or quota is full, or the file too large (ENOSPC, EDQUOT, EFBIG)
//   kInternal          any other errno (EIO, ETIMEDOUT, ...), with strerror; never the codes
//                      the project uses for dead peers (kUnavailable, kDeadlineExceeded)
// Thread-safety: stateless functions; concurrent writers of one path race as the OS lets them
// (WriteFileAtomically's unique temporary and rename make the last one win, never a mix).
#ifndef LSPO_RUNTIME_FILE_IO_H_
#define LSPO_RUNTIME_FILE_IO_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lspo::runtime {

// The whole contents of the regular file `path` (bytes, no decoding). `what` describes the
// file in messages ("job spec", "data.train_path", ...); empty means "file". `max_bytes` > 0:
// a file larger than that (by its size, or by what is read from a pipe) is refused with
// kResourceExhausted naming the file, its size and the limit, before it is held in memory.
absl::StatusOr<std::string> ReadFileToString(const std::string& path, absl::string_view what = "",
                                             int64_t max_bytes = 0);

// Creates or truncates `path`, writes `contents`, fsyncs and closes it. Not atomic: a crash
// may leave a partial file (use inside a temporary directory that is renamed when complete,
// as checkpoints do, or use WriteFileAtomically).
// `mode`: permission bits of a created file (0600 for files that hold specs or secrets).
absl::Status WriteFileSynced(const std::string& path, absl::string_view contents, int mode = 0644);

// Replaces `path` atomically and durably: writes `path`.tmp-<pid>, fsyncs it, renames it over
// `path` and fsyncs the parent directory, so a crash leaves the old or the new file, whole.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 int mode = 0644);

// True when `path` names a directory (following symlinks); false when it is missing, is a
// file or cannot be examined. Never fails.
bool IsDirectory(const std::string& path);
// True when `path` names a regular file (following symlinks). Never fails.
bool IsRegularFile(const std::string& path);

// fsyncs the directory `dir` (makes renames and creations inside it durable).
absl::Status FsyncDir(const std::string& dir);
// fsyncs the file `path` (opened read-only).
absl::Status FsyncFile(const std::string& path);

// The canonical status (see the file comment) of the system call `op` ("create", "rename",
// ...) on `path` failing with errno `err`, for file code that makes its own system calls.
absl::Status FileErrnoStatus(absl::string_view op, const std::string& path, int err);

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_FILE_IO_H_
