// A data-parallel job's group of ranks on the worker (docs/distributed.md): joining it, checking
// that every rank loaded the same model and data, and agreeing on each step before training it.
#ifndef LSPO_GPU_WORKER_RANK_GROUP_H_
#define LSPO_GPU_WORKER_RANK_GROUP_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gpu_worker/worker_job.h"
#include "offload/collective.h"
#include "proto/job_spec.pb.h"
#include "proto/worker.pb.h"

namespace lspo::worker {

// distributed.timeout_seconds with its default (0 = 300 s): the bound on joining the group and
// on every collective.
int RankTimeoutSeconds(const lspo::v1::DistributedSpec& d);

// Joins the job's group of ranks (docs/distributed.md). Errors: offload::Collective::Join's,
// and kInvalidArgument for a malformed distributed.rendezvous.
absl::StatusOr<std::unique_ptr<offload::Collective>> JoinGroup(const JobSpec& spec);

// Data parallel: every rank loaded the same model weights and training data (the spec names
// the same paths; the files behind them may still differ between hosts). Errors:
// kFailedPrecondition naming the rank, its host and the spec field; the collective's errors.
absl::Status CheckRanksLoadedTheSame(const WorkerJob& job);

// Before step `step`'s micro-batches: every rank trains this step (a rank resumed from another
// checkpoint than the others would silently train other weights) under one schedule
// (`overlap`); then *total, this rank's loss tokens, becomes the sum over the ranks (each rank
// scales its loss by its tokens over the global count: the token-mean loss).
// Errors: kFailedPrecondition naming the ranks' steps and the fix; kInternal for different
// schedules; the collective's (the first wait, after rank 0's evaluation, says so:
// step_runner.h AfterRankZerosEvaluation). Needs job.ranks.collective.
absl::Status AgreeOnStep(const WorkerJob& job, int step, bool overlap, int64_t* total);

// After the micro-batches: the ranks agree on skipping a non-finite step (a rank that skips
// alone would leave the others waiting in the gradient all-reduce) and on the step's loss
// (each rank's is its share of the global token mean), in *reply. Errors: the collective's.
absl::Status AgreeOnOutcome(offload::Collective* group, lspo::v1::TrainStepReply* reply);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_RANK_GROUP_H_
