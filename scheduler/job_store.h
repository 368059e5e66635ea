// Persistence of the scheduler's jobs: one JSON file per job (the JobStatus with its spec,
// state, progress and checkpoint position; protobuf JSON mapping) under
// <state_dir>/jobs/<job id>.json, each replaced atomically (temp file, fsync, rename, fsync of
// the directory), so a scheduler killed at any instant finds every job as of its last update.
//
// Thread-safety: Save/LoadAll may be called concurrently for distinct jobs; the scheduler
// serialises them under its own mutex.
#ifndef LSPO_SCHEDULER_JOB_STORE_H_
#define LSPO_SCHEDULER_JOB_STORE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/scheduler.pb.h"

namespace lspo::scheduler {

// Reads one job file of the store: `text`, the content of the file `path` (nothing is read
// from disk; the file name's stem must be the job id), as JobStore::LoadAll does (protobuf
// JSON mapping, unknown fields ignored so that files of later versions load; short or full
// enum names). Errors: kInvalidArgument naming `path` and the field for text that does not
// parse as a JobStatus (runtime::ProtoFromJson's), or "job id differs from the file name".
absl::StatusOr<lspo::v1::JobStatus> ParseJobStoreRecord(absl::string_view text,
                                                        const std::string& path);

class JobStore {
 public:
  // Creates <state_dir>/jobs (mode 0700) if missing. Errors: kPermissionDenied / kInternal
  // naming the directory and the fix (--state_dir).
  static absl::StatusOr<JobStore> Open(const std::string& state_dir);

  // Open, for the one scheduler that runs the jobs: first takes an exclusive advisory lock
  // (flock) on <state_dir>/LOCK, held while this store or a copy of it lives and released by
  // the kernel if the process dies, so that two schedulers never recover and run the same jobs
  // (LevelDB's LOCK file, the same idea). The file holds the holder's pid. Errors:
  // kFailedPrecondition when another process holds it, naming the directory, that pid and the
  // fix (stop it, or another --state_dir); kPermissionDenied when the directory or the file
  // cannot be created; Open's.
  static absl::StatusOr<JobStore> OpenExclusive(const std::string& state_dir);

  // Replaces the job's file with `status` (job_id must be [A-Za-z0-9_-]+). Errors:
  // kInvalidArgument (bad id), kResourceExhausted (disk full), kInternal naming the file; the
  // previous file stays intact on error.
  absl::Status Save(const lspo::v1::JobStatus& status) const;

  // Every stored job, in file-name order. A file that does not parse is renamed to
  // <name>.corrupt (kept for inspection) and reported in `*skipped` (may be null); it never
  // stops the scheduler.
  std::vector<lspo::v1::JobStatus> LoadAll(std::vector<std::string>* skipped) const;

  const std::string& dir() const { return dir_; }

 private:
  explicit JobStore(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
  std::shared_ptr<const int> lock_;  // the LOCK file's descriptor (OpenExclusive), or null
};

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_JOB_STORE_H_
