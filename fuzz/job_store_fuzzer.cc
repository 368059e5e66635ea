// Fuzzes the job store's record reader (scheduler/job_store.h ParseJobStoreRecord, what
// JobStore::LoadAll applies to each <state_dir>/jobs/<id>.json when the scheduler restarts)
// on any text, as the file state/jobs/fuzz-job.json (so the job id must be "fuzz-job"; the
// seeds use it). For every input:
//   - a refusal is kInvalidArgument (LoadAll then sets the file aside as .corrupt), never
//     another code or an exception;
//   - round trip through the writer: the JSON JobStore::Save writes for the record
//     (runtime::ProtoToJson, pretty) reads back to a JobStatus whose JSON is the same text
//     (text, not MessageDifferencer: protobuf's JSON reads "NaN" into a double, and NaN is
//     never equal to itself).
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_harness.h"
#include "runtime/proto_json.h"
#include "scheduler/job_store.h"

namespace lspo::fuzz {

int FuzzJobStore(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string path = "state/jobs/fuzz-job.json";
  absl::StatusOr<lspo::v1::JobStatus> status = scheduler::ParseJobStoreRecord(text, path);
  if (!status.ok()) {
    LSPO_FUZZ_CHECK(status.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  LSPO_FUZZ_CHECK(status->job_id() == "fuzz-job");
  const std::string written = runtime::ProtoToJson(*status, runtime::ProtoJsonPrint::Pretty());
  absl::StatusOr<lspo::v1::JobStatus> back = scheduler::ParseJobStoreRecord(written, path);
  if (!back.ok()) {
    std::fprintf(stderr, "saved record does not read back: %s\n%s\n",
                 std::string(back.status().message()).c_str(), written.c_str());
  }
  LSPO_FUZZ_CHECK(back.ok());
  const std::string again = runtime::ProtoToJson(*back, runtime::ProtoJsonPrint::Pretty());
  if (again != written) {
    std::fprintf(stderr, "read back differs:\n%s\n---\n%s\n", written.c_str(), again.c_str());
  }
  LSPO_FUZZ_CHECK(again == written);
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzJobStore)
