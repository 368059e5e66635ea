// Fuzzes a training checkpoint's trainer_state.json reader (scheduler/checkpoint.h
// ParseTrainerState, what VerifyCheckpoint returns to the job runner on resume and what
// ReadCheckpointLineage reads for resume_from "latest" and pruning) on any text. For every
// input:
//   - a refusal is kDataLoss (resume then skips the checkpoint, or fails naming it), never
//     another code or an exception;
//   - an accepted state survives what resume then does with it, as scheduler/job_runner.cc
//     does it (SelectResume, RestoreFromCheckpoint, and TrainerState of the next checkpoint):
//     nlohmann `value()` of "training_fingerprint", "skipped_steps", "nonfinite_in_a_row",
//     "evals" and "run_id" with the job runner's defaults, `["step"].get<int>()`, a copy of
//     "summary" written out again, every eval read as an EvalMetrics: no exception (which would
//     end the scheduler), no sanitizer report (a float to int conversion out of range, a stack
//     overflow on deep nesting);
//   - the step (and the parent's step) read as an int is the file's number, and the lineage
//     (LineageOfTrainerState) agrees with the fields;
//   - round trip through the writer: the text CommitCheckpoint writes for the state
//     (`dump(2)` + "\n") reads back to an equal JSON value.
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_harness.h"
#include "nlohmann/json.hpp"
#include "proto/metrics.pb.h"
#include "runtime/proto_json.h"
#include "scheduler/checkpoint.h"

namespace lspo::fuzz {
namespace {

// True when `v` is a JSON integer equal to `x` (nlohmann's == would compare 2^64-1 with -1
// as int64 and call them equal).
bool SameInteger(const nlohmann::json& v, int x) {
  if (v.is_number_unsigned()) return x >= 0 && v.get<uint64_t>() == static_cast<uint64_t>(x);
  return v.is_number_integer() && v.get<int64_t>() == x;
}

// The reads of scheduler/job_runner.cc on a resumed state (same calls, same defaults; the job
// runner holds the state in a non-const member, resume_state_).
void ReadAsResumeDoes(nlohmann::json& state) {
  // JobRunner::SelectResume.
  const std::string stored = state.value("training_fingerprint", std::string());
  const int start_step = state["step"].get<int>();
  LSPO_FUZZ_CHECK(SameInteger(state["step"], start_step));
  // JobRunner::RestoreFromCheckpoint.
  const int skipped = state.value("skipped_steps", 0);
  const int nonfinite = state.value("nonfinite_in_a_row", 0);
  LSPO_FUZZ_CHECK(skipped >= 0 && nonfinite >= 0);
  nlohmann::json summary = nlohmann::json::object();
  if (state.contains("summary") && state["summary"].is_object()) {
    for (const auto& [k, v] : state["summary"].items()) {
      if (!summary.contains(k)) summary[k] = v;
    }
  }
  summary["resumed_from_step"] = start_step;
  for (const auto& e : state.value("evals", nlohmann::json::array())) {
    v1::EvalMetrics m;
    (void)runtime::ProtoFromJson(e.dump(), &m, "evals");
  }
  // JobRunner::TrainerState of the next checkpoint, written by CommitCheckpoint.
  nlohmann::json next;
  next["step"] = start_step + 1;
  next["skipped_steps"] = skipped;
  next["summary"] = summary;
  next["parent"] = {{"run_id", state.value("run_id", std::string())}, {"step", start_step}};
  next["training_fingerprint"] = stored;
  (void)next.dump(2);
}

}  // namespace

int FuzzTrainerState(const uint8_t* data, size_t size) {
  if (size > (size_t{1} << 20)) return 0;  // deeply nested JSON must fit (regressions/)
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string path = "<fuzz>/checkpoints/step-00000001/trainer_state.json";
  absl::StatusOr<nlohmann::json> state = scheduler::ParseTrainerState(text, path);
  if (!state.ok()) {
    LSPO_FUZZ_CHECK(state.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  LSPO_FUZZ_CHECK(state->is_object() && state->contains("step"));
  ReadAsResumeDoes(*state);

  const scheduler::CheckpointLineage lineage = scheduler::LineageOfTrainerState(*state);
  LSPO_FUZZ_CHECK(SameInteger((*state)["step"], lineage.step));
  const nlohmann::json* run_id = state->contains("run_id") ? &(*state)["run_id"] : nullptr;
  LSPO_FUZZ_CHECK(lineage.run_id == (run_id != nullptr && run_id->is_string()
                                         ? run_id->get<std::string>()
                                         : std::string()));
  if (state->contains("parent") && (*state)["parent"].is_object() &&
      (*state)["parent"].contains("step")) {
    LSPO_FUZZ_CHECK(SameInteger((*state)["parent"]["step"], lineage.parent_step));
  } else {
    LSPO_FUZZ_CHECK(lineage.parent_step == -1);
  }

  const std::string written = state->dump(2) + "\n";
  absl::StatusOr<nlohmann::json> back = scheduler::ParseTrainerState(written, "<round trip>");
  if (!back.ok()) {
    std::fprintf(stderr, "written state does not read back: %s\n%s\n",
                 std::string(back.status().message()).c_str(), written.c_str());
  }
  LSPO_FUZZ_CHECK(back.ok());
  LSPO_FUZZ_CHECK(*back == *state);
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzTrainerState)
