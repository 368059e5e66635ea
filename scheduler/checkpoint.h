// Training checkpoints on disk: crash-consistent directories with checksums.
//
// Layout: <output_dir>/checkpoints/step-<8 digits>/ holding the HF-style model
// (model.safetensors with the fp32 master weights merged, config.json, tokenizer files), the
// training state (worker_state.safetensors, optimizer_state.safetensors, worker_adamw.pt in
// native mode, trainer_state.json: step counters, LR schedule position, data cursor, RNG
// derivation, evaluations) and checksums.sha256 (`sha256sum -c` format, one line per file).
// A checkpoint is written into a temporary sibling ".tmp-step-<8 digits>", every file and the
// directory fsynced, checksummed, then renamed into place and the parent fsynced: after a crash
// either the complete checkpoint exists or none (temporaries are removed by the next attempt
// and never listed).
//
// Lineage (issue 43): every run (one JobRunner execution) has a run id, and each checkpoint's
// trainer_state.json records it with its parent, the checkpoint the run resumed from ("parent":
// {"run_id", "step"}, null for a fresh start). checkpoints/latest names the checkpoint
// committed last (written atomically after each commit, as DeepSpeed's `latest` file), so
// resume_from "latest" takes the newest checkpoint by commit, not the highest step, and falls
// back along that checkpoint's lineage (its run's older checkpoints, then its parent's run up to
// the parent) when one fails verification. Pruning deletes only the writing run's lineage beyond
// keep_checkpoints: checkpoints of an abandoned branch (a higher step-N of a run that was resumed
// from an earlier point) are never pruned by the run that left them and never resumed by
// "latest". A folder written before lineages existed (no pointer, no run ids) behaves as before:
// by step number.
//
// Thread-safety: functions are reentrant for distinct output directories.
#ifndef LSPO_SCHEDULER_CHECKPOINT_H_
#define LSPO_SCHEDULER_CHECKPOINT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace lspo::scheduler {

// A complete checkpoint: its optimizer step and directory.
struct CheckpointInfo {
  int step = 0;
  std::string dir;
};

// A new run id: the UTC time and 32 random bits, "20261207T021500Z-9f3a61c2" (sortable by
// start time, unique in practice).
std::string NewRunId();

// "<output_dir>/checkpoints".
std::string CheckpointRoot(const std::string& output_dir);

// Creates an empty temporary directory for the checkpoint of `step` (removing a stale one left
// by a crash) and returns its path. Errors: kPermissionDenied / kInternal naming the path (e.g.
// the checkpoints path is not a writable directory).
absl::StatusOr<std::string> BeginCheckpoint(const std::string& output_dir, int step);

// Writes trainer_state.json (`trainer_state`, which must hold "step") into `tmp_dir`, fsyncs
// every file, writes checksums.sha256 over all files, fsyncs it and the directory, renames
// `tmp_dir` to checkpoints/step-<8 digits> (replacing an existing one of that step), fsyncs
// the parent and points checkpoints/latest at it. Returns the final directory. On error the
// temporary directory is removed and earlier checkpoints are untouched. Errors: kInternal /
// kResourceExhausted (ENOSPC, EFBIG) naming the file.
absl::StatusOr<std::string> CommitCheckpoint(const std::string& tmp_dir,
                                             const nlohmann::json& trainer_state);

// Complete checkpoints (directories step-N with a checksums.sha256) under output_dir, oldest
// first. Missing directory = none.
std::vector<CheckpointInfo> ListCheckpoints(const std::string& output_dir);

// Where a checkpoint sits in its lineage (trainer_state.json "step", "run_id", "parent").
struct CheckpointLineage {
  int step = 0;
  std::string run_id;         // "" for a checkpoint written before run ids existed
  std::string parent_run_id;  // the run it resumed from ("" with parent_step < 0: none)
  int parent_step = -1;       // the step it resumed from; -1: a fresh start
};

// Deepest nesting of arrays and objects a trainer_state.json may have (the written ones nest
// under 10 levels): resume copies and dumps parts of it ("summary", "evals") recursively, so a
// deeper file is refused instead of overflowing the stack.
inline constexpr int kMaxTrainerStateDepth = 64;

// Parses the text of a trainer_state.json (`path` only names it in errors) and checks what
// resume reads (JobRunner::SelectResume / RestoreFromCheckpoint, and the lineage): a JSON
// object nested at most kMaxTrainerStateDepth levels; "step" an integer in [0, INT_MAX];
// when present, "run_id" and "training_fingerprint" strings, "skipped_steps" and
// "nonfinite_in_a_row" integers in [0, INT_MAX], "summary" an object, "evals" an array,
// "parent" null or an object whose "run_id" (when present) is a string and "step" (when
// present) an integer in [0, INT_MAX]. Other fields are kept unchecked. Returns the parsed
// object. Errors: kDataLoss naming `path` and the first problem (never an exception).
absl::StatusOr<nlohmann::json> ParseTrainerState(absl::string_view text, const std::string& path);

// The lineage fields ("step", "run_id", "parent") of a trainer state accepted by
// ParseTrainerState. Fields absent, of another type or out of range keep CheckpointLineage's
// defaults (step 0, no run id, parent_step -1); never fails.
CheckpointLineage LineageOfTrainerState(const nlohmann::json& trainer_state);

// Reads the lineage fields of `dir`/trainer_state.json (ParseTrainerState; no checksum
// verification). Errors: kNotFound / kPermissionDenied naming the file, kDataLoss when it is
// not a trainer state.
absl::StatusOr<CheckpointLineage> ReadCheckpointLineage(const std::string& dir);

// The lineage of the checkpoint `dir` among output_dir's complete checkpoints, newest first:
// `dir`'s run's checkpoints up to its step, then its parent run's up to the parent step, and
// so on (a run id met twice ends the walk). Empty when `dir`'s trainer state cannot be read.
std::vector<CheckpointInfo> LineageOf(const std::string& output_dir, const std::string& dir);

// Candidates for resume_from "latest", best first: the checkpoint named by checkpoints/latest
// and the rest of its lineage; without a valid pointer, every complete checkpoint by step,
// highest first. Empty when there is none.
std::vector<CheckpointInfo> LatestCheckpoints(const std::string& output_dir);

// Deletes the checkpoints of `newest_dir`'s lineage beyond the newest `keep` (>= 1); other
// checkpoints (another run's branch) are left. Errors: kInternal naming the directory that could
// not be removed.
absl::Status PruneCheckpoints(const std::string& output_dir, int keep,
                              const std::string& newest_dir);

// Moves every complete checkpoint of output_dir into checkpoints/superseded-<label>/ (a fresh
// start with overwrite_output_dir) and removes checkpoints/latest. Returns the folder they went
// to, "" when there was none. Errors: kInternal / kPermissionDenied naming the path.
absl::StatusOr<std::string> SupersedeCheckpoints(const std::string& output_dir,
                                                 const std::string& label);

// One line of a checkpoint's checksums.sha256.
struct ChecksumEntry {
  std::string sha256;  // 64 characters: the lower-case hex SHA-256 CommitCheckpoint wrote
  std::string name;    // a file of the checkpoint, relative to its folder ("adapter/x.json")
};

// Parses the text of a checksums.sha256 (`path` only names it in errors): lines
// "<sha256>  <name>" (`sha256sum` text mode) separated by '\n', empty lines skipped. The sha256
// is the 64 characters before the first two spaces (not checked further: one that is not the
// file's lower-case hex SHA-256 fails VerifyCheckpoint's comparison); the name is the rest of
// the line, a relative path inside the checkpoint: not empty, not starting with '/', no empty
// or ".." part, no NUL byte. Entries in file order (repeats kept). Errors: kDataLoss naming
// `path` and the first malformed line.
absl::StatusOr<std::vector<ChecksumEntry>> ParseChecksumManifest(absl::string_view text,
                                                                 const std::string& path);

// The checksums.sha256 text CommitCheckpoint writes for `entries`: "<sha256>  <name>\n" per
// entry, in order ("" for none). ParseChecksumManifest reads it back to `entries` when each
// entry is one it accepts.
std::string ChecksumManifestText(const std::vector<ChecksumEntry>& entries);

// Verifies `dir`/checksums.sha256 (ParseChecksumManifest, then the SHA-256 of each listed file
// in order) and returns trainer_state.json parsed by ParseTrainerState. Errors: kNotFound (no
// checksums / trainer state: not a complete checkpoint), kDataLoss for a malformed manifest
// (before any file is hashed), naming the first file whose checksum differs or that is
// missing, or a trainer_state.json ParseTrainerState refuses.
absl::StatusOr<nlohmann::json> VerifyCheckpoint(const std::string& dir);

// Hex SHA-256 of a file's bytes (OpenSSL EVP). Errors: kNotFound / kInternal naming the path.
absl::StatusOr<std::string> Sha256File(const std::string& path);

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_CHECKPOINT_H_
