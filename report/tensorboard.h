// TensorBoard events files, written without TensorFlow or LibTorch: a file of TFRecords
// (runtime/tfrecord.h), each a serialized Event (proto/tensorboard_event.proto, TensorFlow's
// field numbers). The first record is the file_version event "brain.Event:2"; every scalar is
// one Event {wall_time, step, summary {value {tag, simple_value}}}, as TensorBoard's own
// EventFileWriter writes it (tests/report/tensorboard_test.cc compares the bytes).
//
// `tensorboard --logdir DIR` reads every events file of every folder below DIR; the files of
// one folder are one run, read in name order and merged (a resumed job adds a file).
//
// Thread-safety: an EventFileWriter is not thread-safe (one owner; movable, not copyable).
#ifndef LSPO_REPORT_TENSORBOARD_H_
#define LSPO_REPORT_TENSORBOARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/append_file.h"

namespace lspo::scheduler {

// The name prefix of every events file ("events.out.tfevents.").
inline constexpr char kEventsFilePrefix[] = "events.out.tfevents.";

// "events.out.tfevents.<unix_seconds, 10 digits>.<hostname>.<pid>.<n>", TensorBoard's own
// pattern (`n` tells apart the files one process opens within a second).
std::string EventsFileName(int64_t unix_seconds, absl::string_view hostname, int64_t pid,
                           int64_t n);

// Removes every file named kEventsFilePrefix* directly in `dir` (a fresh, non-resumed run
// in an existing output folder, so TensorBoard does not merge an older run into it). A
// missing `dir` is no error. Errors: kPermissionDenied / kInternal naming the file.
absl::Status RemoveEventsFiles(const std::string& dir);

// One scalar event of an events file.
struct ScalarEvent {
  std::string tag;
  int64_t step = 0;
  float value = 0;
  double wall_time = 0;  // Unix seconds.
};

// Every scalar event (simple_value) of the events file `path`, in file order; the
// file_version event and values of other types are skipped. Errors: those of reading the
// file (runtime/file_io.h codes), kDataLoss naming the file for a corrupt or truncated
// record or a record that is no Event.
absl::StatusOr<std::vector<ScalarEvent>> ReadScalarEvents(const std::string& path);

// The events files directly in `dir` (kEventsFilePrefix*), sorted by name (the order
// TensorBoard reads them in); empty when there are none or `dir` cannot be listed.
std::vector<std::string> ListEventsFiles(const std::string& dir);

class EventFileWriter {
 public:
  // Creates a new events file in the existing folder `dir` and writes its file_version event
  // with `wall_time` (Unix seconds). The name's <unix_seconds> is floor(wall_time), raised to
  // one more than the newest events file already in `dir` when that one is not older, so
  // that TensorBoard (which reads a folder's files in name order) reads them in the order
  // they were written. Errors: those of creating the file (runtime/file_io.h codes, naming
  // it), kInvalidArgument for a non-finite or negative wall_time.
  static absl::StatusOr<EventFileWriter> Create(const std::string& dir, double wall_time);

  EventFileWriter() = default;  // Closed.
  EventFileWriter(EventFileWriter&&) noexcept = default;
  EventFileWriter& operator=(EventFileWriter&&) noexcept = default;
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;
  // Flushes and closes, ignoring errors (call Close() to see them).
  ~EventFileWriter();

  // Queues one scalar event: `tag` (e.g. "train/loss"), the optimizer `step`, the value
  // (stored as float32, TensorBoard's simple_value) and `wall_time` in Unix seconds. Nothing
  // reaches the file before Flush().
  void AddScalar(absl::string_view tag, int64_t step, float value, double wall_time);
  // Writes the queued events with one append (runtime/append_file.h: whole records only;
  // on an error the queued events are dropped). Errors: the append's (kResourceExhausted
  // when the disk is full, ...) naming the file; kFailedPrecondition for events queued
  // after Close().
  absl::Status Flush();
  // Flush, fdatasync and close. OK when already closed.
  absl::Status Close();

  // The events file's path ("" when never created).
  const std::string& path() const { return file_.path(); }

 private:
  runtime::AppendFile file_;
  std::string pending_;  // Framed records not yet written.
};

}  // namespace lspo::scheduler

#endif  // LSPO_REPORT_TENSORBOARD_H_
