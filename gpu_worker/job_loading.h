// Loading a job on the worker, WorkerCore::LoadJob's parts (worker_core.cc): the device, the
// tokenizer, model and data (tokenised, packed, summarised), the model's storage dtype and
// device, and the fault injection of the tests.
//
// Thread-safety: free functions on a job the caller owns.
#ifndef LSPO_GPU_WORKER_JOB_LOADING_H_
#define LSPO_GPU_WORKER_JOB_LOADING_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/worker_job.h"
#include "gpu_worker/worker_options.h"
#include "proto/job_spec.pb.h"

namespace lspo::worker {

// The device of a job: CUDA when asked for (and present) or, with the field empty, when
// LibTorch sees one. Errors: kFailedPrecondition (cuda asked, none visible), kInvalidArgument
// (another value).
absl::StatusOr<bool> UseCuda(const JobSpec& spec);

// The tokenizer, the model and the data of `job->spec`. Errors: those of the readers, naming
// the file.
absl::Status LoadAssets(WorkerJob* job);

// The fault injection of `faults` (worker_options.h WorkerFaults) for `job` (its spec's rank),
// into job->faults.nonfinite_grad_steps / _linear / _loss_steps, logged as a warning. Parts
// that do not parse are ignored (test-only input).
void SetFaults(const WorkerFaults& faults, WorkerJob* job);

// Puts the loaded model of `job` in its storage dtype and on its device: bf16 linears when
// the spec says bf16, or on CUDA unless it says fp32 (issue 6; fp32 on the CPU,
// docs/known-failures.md); on CUDA the device, TF32 matmuls, the spec's kernel choice and
// device_memory_limit_mb; activation checkpointing; job->linears, job->device, job->cuda.
// Returns the bf16 compensation residuals (m, n) of every trained matrix, taken from the fp32
// weights before they are rounded, when the mode keeps them (training_mode.h keeps_residual;
// LspPath::InitCompensation), else none; m out, n in features; on the CPU.
// Errors: LibTorch's (kInternal), an allocation above the cap (kResourceExhausted).
absl::StatusOr<std::vector<at::Tensor>> PlaceModel(WorkerJob* job, bool use_cuda);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_JOB_LOADING_H_
