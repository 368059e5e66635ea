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
// Thread-safety: functions are reentrant for distinct output directories.
#ifndef LSPO_SCHEDULER_CHECKPOINT_H_
#define LSPO_SCHEDULER_CHECKPOINT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace lspo::scheduler {

// A complete checkpoint: its optimizer step and directory.
struct CheckpointInfo {
  int step = 0;
  std::string dir;
};

// "<output_dir>/checkpoints".
std::string CheckpointRoot(const std::string& output_dir);

// Creates an empty temporary directory for the checkpoint of `step` (removing a stale one left
// by a crash) and returns its path. Errors: kPermissionDenied / kInternal naming the path (e.g.
// the checkpoints path is not a writable directory).
absl::StatusOr<std::string> BeginCheckpoint(const std::string& output_dir, int step);

// Writes trainer_state.json (`trainer_state`, which must hold "step") into `tmp_dir`, fsyncs
// every file, writes checksums.sha256 over all files, fsyncs it and the directory, renames
// `tmp_dir` to checkpoints/step-<8 digits> (replacing an existing one of that step) and fsyncs
// the parent. Returns the final directory. On error the temporary directory is removed and
// earlier checkpoints are untouched. Errors: kInternal / kResourceExhausted (ENOSPC, EFBIG)
// naming the file.
absl::StatusOr<std::string> CommitCheckpoint(const std::string& tmp_dir,
                                             const nlohmann::json& trainer_state);

// Complete checkpoints (directories step-N with a checksums.sha256) under output_dir, oldest
// first. Missing directory = none.
std::vector<CheckpointInfo> ListCheckpoints(const std::string& output_dir);

// Deletes all but the newest `keep` (>= 1) complete checkpoints. Errors: kInternal naming the
// directory that could not be removed.
absl::Status PruneCheckpoints(const std::string& output_dir, int keep);

// Verifies every line of `dir`/checksums.sha256 (SHA-256 of each listed file) and returns the
// parsed trainer_state.json. Errors: kNotFound (no checksums / trainer state: not a complete
// checkpoint), kDataLoss naming the first file whose checksum differs or that is missing, or a
// malformed trainer_state.json.
absl::StatusOr<nlohmann::json> VerifyCheckpoint(const std::string& dir);

// Hex SHA-256 of a file's bytes (OpenSSL EVP). Errors: kNotFound / kInternal naming the path.
absl::StatusOr<std::string> Sha256File(const std::string& path);

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_CHECKPOINT_H_
