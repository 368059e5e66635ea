// The run log of a job: metrics.jsonl, timeline.jsonl, summary.json and the TensorBoard events
// view of metrics.jsonl. Contract: run_log.h.
#include "report/run_log.h"

#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "report/tensorboard_scalars.h"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"

namespace lspo::scheduler {
namespace {

// Wall-clock seconds since the Unix epoch (the wall_time of TensorBoard events).
double UnixNow() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

}  // namespace

absl::StatusOr<RunLog> RunLog::Open(const std::string& out_dir, bool append, bool with_timeline) {
  RunLog log;
  log.out_dir_ = out_dir;
  ASSIGN_OR_RETURN(log.metrics_, runtime::AppendFile::Open(out_dir + "/metrics.jsonl", !append));
  if (with_timeline) {
    ASSIGN_OR_RETURN(log.timeline_,
                     runtime::AppendFile::Open(out_dir + "/timeline.jsonl", !append));
  }
  if (!append) RETURN_IF_ERROR(RemoveEventsFiles(out_dir));
  ASSIGN_OR_RETURN(log.events_, EventFileWriter::Create(out_dir, UnixNow()));
  return log;
}

absl::Status RunLog::Append(runtime::AppendFile& file, const nlohmann::json& line) {
  absl::Status st = file.Append(line.dump() + "\n");
  if (!st.ok() && error_.ok()) error_ = st;
  return st;
}

absl::Status RunLog::Metrics(const nlohmann::json& line) {
  RETURN_IF_ERROR(Append(metrics_, line));
  const LineScalars s = TensorBoardScalars(line);
  if (s.scalars.empty()) return absl::OkStatus();
  const double now = UnixNow();
  for (const TensorBoardScalar& v : s.scalars) events_.AddScalar(v.tag, s.step, v.value, now);
  return events_.Flush();
}

absl::Status RunLog::Timeline(const nlohmann::json& line) {
  if (!timeline_.is_open()) return absl::OkStatus();
  return Append(timeline_, line);
}

absl::Status RunLog::Sync() {
  if (!error_.ok()) return error_;  // A lost line: what is on disk is incomplete.
  RETURN_IF_ERROR(metrics_.Sync());
  if (timeline_.is_open()) RETURN_IF_ERROR(timeline_.Sync());
  return absl::OkStatus();
}

absl::Status RunLog::WriteSummary(const nlohmann::json& summary) {
  RETURN_IF_ERROR(Sync());
  return runtime::WriteFileAtomically(out_dir_ + "/summary.json", summary.dump(2) + "\n");
}

}  // namespace lspo::scheduler
