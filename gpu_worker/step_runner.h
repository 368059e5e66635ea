// One training step on the worker, WorkerCore::TrainStep's parts (worker_core.cc): the layer
// hooks, the step's batches, the forward and backward of its micro-batches, and what the step
// records at its end.
#ifndef LSPO_GPU_WORKER_STEP_RUNNER_H_
#define LSPO_GPU_WORKER_STEP_RUNNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "data/datasets.h"
#include "gpu_worker/worker_job.h"
#include "proto/metrics.pb.h"
#include "proto/worker.pb.h"

namespace lspo::worker {

void InstallLayerHooks(WorkerJob* job);

// Resets the per-step state of `job` (events, waits, publication, the offload engine's step)
// before step's work; the first step also resets the peak-memory counters, so that they
// measure the training steps (the memory plan's subject).
void BeginStepState(WorkerJob* job);

// A rank > 0 waits at the first collective of a step for rank 0, which evaluates alone after
// the evaluation steps (scheduler/job_runner.cc AfterStep: every eval_every steps, and before
// step 1 unless skip_initial_eval): when that wait failed, `st` gains that likely cause and
// its fix. Other statuses are returned as they are.
absl::Status AfterRankZerosEvaluation(const WorkerJob& job, int step, absl::Status st);

// Step `step`'s micro-batches (grad_accum of micro_batch_size examples each, in the epoch's
// shuffled or class-balanced order); adds their loss tokens to *total, their input tokens
// (padding included) to *input_tokens and their padding to *padding_tokens.
std::vector<data::Batch> StepBatches(WorkerJob* job, int step, int64_t* total,
                                     int64_t* input_tokens, int64_t* padding_tokens);

// Forward and backward of every micro-batch of step `step` (the loss of each scaled by its
// share of the step's `total` loss tokens, so the gradients are the step's token mean). Under
// an offloaded overlap plan the last micro-batch's backward publishes the gradients as they
// form. Sets reply->nonfinite (returning OK) on a non-finite loss or gradient; otherwise the
// metrics loss, tokens, forward_seconds, backward_seconds. Errors: a failed layer hook's.
absl::Status RunMicroBatches(WorkerJob* job, const std::vector<data::Batch>& batches, int64_t total,
                             int step, const lspo::v1::StepPlan& plan,
                             lspo::v1::TrainStepReply* reply);

// The step's offload events and, on CUDA, its transfers and device memory, into the reply.
// Errors: the transfer engine's.
absl::Status RecordStepEnd(WorkerJob* job, lspo::v1::StepMetrics* metrics);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_STEP_RUNNER_H_
