// The files a job writes into its output directory while it runs:
//   metrics.jsonl   one JSON object per line: {"kind": "step"|"eval"|"projector_fit"|
//                   "master_refresh"|"master_drift"|"checkpoint"|"checkpoint_failed"|
//                   "resume", ...}
//   timeline.jsonl  lsp/zero only: per step the plan and every per-layer event (CLOCK_MONOTONIC
//                   seconds; scripts/plot --timeline renders one)
//   summary.json    the run's summary, replaced atomically and durably at the end
// Each line goes to the kernel at once (write(2), no user-space buffer: a crash of the
// scheduler loses no line it had logged); a write that fails part-way is truncated back, so
// the files hold whole lines only. Sync() fdatasyncs both logs (called before a checkpoint is
// committed and at the end, so a checkpoint never refers to log lines a power loss could
// drop) and returns the first append error since the log was opened (lines are missing).
//
// Thread-safety: not thread-safe; owned by the job runner's thread.
#ifndef LSPO_SCHEDULER_RUN_LOG_H_
#define LSPO_SCHEDULER_RUN_LOG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace lspo::scheduler {

class RunLog {
 public:
  // Opens (append = true: continues after a resume; else truncates) metrics.jsonl and, when
  // `with_timeline`, timeline.jsonl in `out_dir` (which must exist).
  // Errors: those of the open (kPermissionDenied, kNotFound, ...) naming the file.
  static absl::StatusOr<RunLog> Open(const std::string& out_dir, bool append,
                                     bool with_timeline);

  RunLog(RunLog&& other) noexcept;
  RunLog& operator=(RunLog&& other) noexcept;
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;
  ~RunLog();

  // One line of metrics.jsonl / timeline.jsonl (the timeline call is a no-op without one).
  // Errors: kResourceExhausted (disk full) and other write errors naming the file.
  absl::Status Metrics(const nlohmann::json& line);
  absl::Status Timeline(const nlohmann::json& line);
  // fdatasync of both logs; the first earlier append error if there was one.
  absl::Status Sync();
  // Writes summary.json atomically (runtime::WriteFileAtomically) after syncing the logs.
  absl::Status WriteSummary(const nlohmann::json& summary);

  const std::string& out_dir() const { return out_dir_; }

 private:
  RunLog() = default;
  absl::Status Append(int fd, const std::string& path, const nlohmann::json& line);
  void Close();

  std::string out_dir_;
  int metrics_fd_ = -1;
  int timeline_fd_ = -1;
  absl::Status error_;  // First append error (sticky).
};

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_RUN_LOG_H_
