// The worker's part of a training checkpoint (docs/checkpoints.md): worker_state.safetensors
// (trained weights as stored, projectors) and worker_adamw.pt (native AdamW), saved and
// restored with validation (WorkerCore::SaveState / LoadState document the contract).
#ifndef LSPO_GPU_WORKER_WORKER_STATE_H_
#define LSPO_GPU_WORKER_WORKER_STATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "gpu_worker/worker_job.h"
#include "proto/peer.pb.h"

namespace lspo::worker {

// Writes the state of `job` at step `step` into `dir`.
absl::StatusOr<lspo::v1::StateReply> SaveWorkerState(WorkerJob* job, const std::string& dir,
                                                     int step);
// Restores `job` from the state of step `step` in `dir`. Errors: kNotFound (missing file),
// kDataLoss (wrong mode or step, bad tensors), nothing changed on error before the copy.
absl::StatusOr<lspo::v1::StateReply> LoadWorkerState(WorkerJob* job, const std::string& dir,
                                                     int step);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_WORKER_STATE_H_
