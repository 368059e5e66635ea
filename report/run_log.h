// The files a job writes into its output directory while it runs:
//   metrics.jsonl   one JSON object per line: {"kind": "data"|"step"|"eval"|"projector_fit"|
//                   "master_refresh"|"master_drift"|"checkpoint"|"checkpoint_failed"|
//                   "resume", ...} (docs/outputs.md lists the fields)
//   timeline.jsonl  lsp/zero only: per step the plan and every per-layer event (CLOCK_MONOTONIC
//                   seconds; scripts/plot --timeline renders one)
//   summary.json    the run's summary, replaced atomically and durably at the end
//   report.html     the run report drawn from metrics.jsonl at the end of the job, failed
//                   or not (report/run_report.h; written by the job runner)
//   events.out.tfevents.*
//                   TensorBoard events: the scalars of every metrics.jsonl line
//                   (report/tensorboard_scalars.h has the tags), step = optimizer step;
//                   one new file per Open (a resumed job adds one, TensorBoard merges them)
// Each line goes to the kernel at once (write(2), no user-space buffer: a crash of the
// scheduler loses no line it had logged); a write that fails part-way is truncated back, so
// the files hold whole lines (and whole event records) only. Sync() fdatasyncs both logs
// (called before a checkpoint is committed and at the end, so a checkpoint never refers to
// log lines a power loss could drop) and returns the first append error of metrics.jsonl or
// timeline.jsonl since the log was opened (lines are missing). The events file is a view of
// metrics.jsonl: its errors are returned by Metrics() but do not fail Sync().
//
// Thread-safety: not thread-safe; owned by the job runner's thread.
#ifndef LSPO_REPORT_RUN_LOG_H_
#define LSPO_REPORT_RUN_LOG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "report/tensorboard.h"
#include "runtime/append_file.h"

namespace lspo::scheduler {

class RunLog {
 public:
  // Opens (append = true: continues after a resume; else truncates) metrics.jsonl and, when
  // `with_timeline`, timeline.jsonl in `out_dir` (which must exist), and creates a new
  // TensorBoard events file there (append = false first removes the events files of an
  // earlier run in `out_dir`, as metrics.jsonl is truncated).
  // Errors: those of the open (kPermissionDenied, kNotFound, ...) naming the file.
  static absl::StatusOr<RunLog> Open(const std::string& out_dir, bool append, bool with_timeline);

  RunLog(RunLog&& other) noexcept = default;
  RunLog& operator=(RunLog&& other) noexcept = default;
  RunLog(const RunLog&) = delete;
  RunLog& operator=(const RunLog&) = delete;
  // Closes the files (fdatasync, close), ignoring errors.
  ~RunLog() = default;

  // One line of metrics.jsonl / timeline.jsonl (the timeline call is a no-op without one).
  // Metrics also writes the line's TensorBoard scalars (wall time: now) to the events file.
  // Errors: kResourceExhausted (disk full) and other write errors naming the file (the
  // events file's after the line itself was written).
  absl::Status Metrics(const nlohmann::json& line);
  absl::Status Timeline(const nlohmann::json& line);
  // fdatasync of both logs; the first earlier append error if there was one.
  absl::Status Sync();
  // Writes summary.json atomically (runtime::WriteFileAtomically) after syncing the logs.
  absl::Status WriteSummary(const nlohmann::json& summary);

  const std::string& out_dir() const { return out_dir_; }
  // The events file of this log (a path in out_dir).
  const std::string& events_path() const { return events_.path(); }

 private:
  RunLog() = default;
  absl::Status Append(runtime::AppendFile& file, const nlohmann::json& line);

  std::string out_dir_;
  runtime::AppendFile metrics_;
  runtime::AppendFile timeline_;  // Closed without a timeline.
  EventFileWriter events_;
  absl::Status error_;  // First append error of metrics_ / timeline_ (sticky).
};

}  // namespace lspo::scheduler

#endif  // LSPO_REPORT_RUN_LOG_H_
