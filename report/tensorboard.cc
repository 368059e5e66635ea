// TensorBoard events files: Event records in TFRecord framing. Contract: tensorboard.h.
#include "report/tensorboard.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/tensorboard_event.pb.h"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"
#include "runtime/tfrecord.h"

namespace lspo::scheduler {
namespace {

namespace fs = std::filesystem;

constexpr char kFileVersion[] = "brain.Event:2";
// The writer named in each file's first event (its path before report/ existed; kept so that
// events files stay byte-for-byte what they were).
constexpr char kWriterName[] = "lsp-offload report/tensorboard.cc";

std::atomic<int64_t> files_opened{0};  // The <n> of this process's file names.

std::string HostName() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// The newest <unix_seconds> of the events files in `dir`; -1 when there is none.
int64_t NewestEventsFileSeconds(const std::string& dir) {
  int64_t newest = -1;
  for (const std::string& path : ListEventsFiles(dir)) {
    const std::string rest =
        fs::path(path).filename().string().substr(sizeof(kEventsFilePrefix) - 1);
    int64_t seconds = 0;
    if (absl::SimpleAtoi(rest.substr(0, rest.find('.')), &seconds)) {
      newest = std::max(newest, seconds);
    }
  }
  return newest;
}

void AppendEvent(const tb::Event& event, std::string* out) {
  runtime::AppendTfRecord(event.SerializeAsString(), out);
}

}  // namespace

std::string EventsFileName(int64_t unix_seconds, absl::string_view hostname, int64_t pid,
                           int64_t n) {
  return absl::StrFormat("%s%010d.%s.%d.%d", kEventsFilePrefix, unix_seconds, hostname, pid, n);
}

std::vector<std::string> ListEventsFiles(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (absl::StartsWith(it->path().filename().string(), kEventsFilePrefix)) {
      files.push_back(it->path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

absl::Status RemoveEventsFiles(const std::string& dir) {
  for (const std::string& path : ListEventsFiles(dir)) {
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return runtime::FileErrnoStatus("remove", path, errno);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ScalarEvent>> ReadScalarEvents(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, runtime::ReadFileToString(path, "events file"));
  ASSIGN_OR_RETURN(std::vector<std::string> records, runtime::ParseTfRecords(bytes, path));
  std::vector<ScalarEvent> out;
  for (size_t i = 0; i < records.size(); ++i) {
    tb::Event event;
    if (!event.ParseFromString(records[i])) {
      return absl::DataLossError(
          absl::StrCat("events file '", path, "': record ", i, " is not an Event"));
    }
    for (const tb::Summary::Value& v : event.summary().value()) {
      if (v.value_case() != tb::Summary::Value::kSimpleValue) continue;
      out.push_back({v.tag(), event.step(), v.simple_value(), event.wall_time()});
    }
  }
  return out;
}

absl::StatusOr<EventFileWriter> EventFileWriter::Create(const std::string& dir, double wall_time) {
  if (!std::isfinite(wall_time) || wall_time < 0) {
    return absl::InvalidArgumentError(absl::StrCat("events file in '", dir, "': wall time ",
                                                   wall_time,
                                                   " is not a time (Unix seconds, finite, >= 0)"));
  }
  const int64_t seconds =
      std::max(static_cast<int64_t>(wall_time), NewestEventsFileSeconds(dir) + 1);
  const std::string path =
      (fs::path(dir) / EventsFileName(seconds, HostName(), ::getpid(), files_opened++)).string();
  EventFileWriter w;
  ASSIGN_OR_RETURN(w.file_, runtime::AppendFile::Open(path, /*truncate=*/true));
  tb::Event version;
  version.set_wall_time(wall_time);
  version.set_file_version(kFileVersion);
  version.mutable_source_metadata()->set_writer(kWriterName);
  AppendEvent(version, &w.pending_);
  RETURN_IF_ERROR(w.Flush());
  return w;
}

EventFileWriter::~EventFileWriter() { (void)Close(); }

void EventFileWriter::AddScalar(absl::string_view tag, int64_t step, float value,
                                double wall_time) {
  tb::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  tb::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag(std::string(tag));
  v->set_simple_value(value);
  AppendEvent(event, &pending_);
}

absl::Status EventFileWriter::Flush() {
  if (pending_.empty()) return absl::OkStatus();
  absl::Status st = file_.Append(pending_);
  pending_.clear();
  return st;
}

absl::Status EventFileWriter::Close() {
  absl::Status st = file_.is_open() ? Flush() : absl::OkStatus();
  absl::Status closed = file_.Close();
  pending_.clear();
  return st.ok() ? closed : st;
}

}  // namespace lspo::scheduler
