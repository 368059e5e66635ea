// How a worker is set up: lsp_gpu_worker's flags, `lspctl run`'s and the embedded runtime's
// options. Passed to WorkerCore (worker_core.h) instead of environment variables read in the
// worker's code (issue 44).
#ifndef LSPO_GPU_WORKER_WORKER_OPTIONS_H_
#define LSPO_GPU_WORKER_WORKER_OPTIONS_H_

#include <string>
#include <vector>

namespace lspo::worker {

// Fault injection, for the fault tests only (tests/integration/resume_test.cc,
// data_parallel_test.cc): each a comma-separated list of 1-based steps.
struct WorkerFaults {
  // Gradients made non-finite: "3,4" at steps 3 and 4; "3@1" at step 3 on rank 1 only (data
  // parallel); "3:5" at step 3, linear 5's gradient only (the others stay finite).
  std::string nonfinite_grad_steps;
  // "3": at these steps the loss is reported non-finite after the backward, with finite
  // gradients (the CUDA order: the loss is read once the gradients are published).
  std::string nonfinite_loss_steps;
};

// The worker's settings (see the file comment).
struct WorkerOptions {
  // Folders the paths of requests may resolve under (--allowed_roots; runtime/allowed_roots.h):
  // LoadJob's spec (every field offload::JobSpecPaths lists), the folders of SaveArtifacts,
  // SaveState and LoadState. Empty = no restriction (single-user and embedded use).
  std::vector<std::string> allowed_roots;
  // Loads a job whose memory plan does not fit its device (--skip_memory_check): for a plan
  // that overestimates a job known to fit (offload/memory_plan.h). Logged as a warning.
  bool skip_memory_check = false;
  WorkerFaults faults;
};

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_WORKER_OPTIONS_H_
