// Evaluation of a job's model (WorkerCore::Evaluate documents the metrics): answer accuracy
// and answer loss on the eval set (classification), loss on held-out text blocks, and the
// perplexity of data.perplexity_path.
#ifndef LSPO_GPU_WORKER_EVALUATOR_H_
#define LSPO_GPU_WORKER_EVALUATOR_H_

#include <string>

#include "absl/status/statusor.h"
#include "gpu_worker/worker_job.h"
#include "proto/metrics.pb.h"

namespace lspo::worker {

// Evaluates `job` after step `step`. Errors: a pending update's error, kInternal from
// LibTorch.
absl::StatusOr<lspo::v1::EvalMetrics> EvaluateJob(WorkerJob* job, int step);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_EVALUATOR_H_
