// The projector check of an lsp job (docs/method.md "Learning the projectors"): calibration
// gradients, then per matrix a fit or a bias check, the new projectors written to the arena
// and installed in the model (WorkerCore::FitProjectors documents the contract).
#ifndef LSPO_GPU_WORKER_CALIBRATION_H_
#define LSPO_GPU_WORKER_CALIBRATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "gpu_worker/worker_job.h"
#include "proto/job_spec.pb.h"
#include "proto/worker.pb.h"

namespace lspo::worker {

// Runs the check of step `step` on `job` (MODE_LSP). Errors: kFailedPrecondition (not lsp),
// a pending update's error, kInternal from LibTorch.
absl::StatusOr<lspo::v1::FitProjectorsReply> RunProjectorCheck(WorkerJob* job, int step);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_CALIBRATION_H_
