// The worker's memory check before a job's weights are read (issue 18), and the settings a
// CUDA job left unset chosen to fit (issue 42): offload/memory_plan.h against the device.
#ifndef LSPO_GPU_WORKER_MEMORY_CHECK_H_
#define LSPO_GPU_WORKER_MEMORY_CHECK_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/job_spec.pb.h"

namespace lspo::worker {

// The memory check before a job's weights are read (issue 18): the job's memory plan
// (offload/memory_plan.h, from the model's config alone) against the device it runs on: on
// CUDA the cap device_memory_limit_mb, else the GPU's memory less the CUDA context
// (kCudaContextBytes); on the CPU the host's physical memory. `skip`
// (WorkerOptions::skip_memory_check) skips it (for a plan that overestimates a job known to fit).
// Before the check, settings the spec left unset are chosen to fit (offload::ChooseFittingDefaults,
// CUDA only): *spec_in is changed and one line per choice appended to *chosen. Errors:
// kResourceExhausted naming the mode's peak, its largest terms, the budget, the largest micro-batch
// (with and without activation checkpointing) and lsp d that fit, and the lspctl command that
// prints the whole plan. A model config or spec the planner cannot read passes (the loaders report
// it, naming the file or field).
absl::Status CheckJobFitsDevice(lspo::v1::JobSpec* spec_in, bool cuda, bool skip,
                                std::vector<std::string>* chosen);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_MEMORY_CHECK_H_
