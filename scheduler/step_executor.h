// One training step through the peers (docs/method.md "Layer-wise schedule"):
//   serial  : worker.TrainStep (forward + backward, every gradient into the arena), then, unless
//             the step was non-finite, optimizer.Update (per-layer tasks, deepest layer first)
//             and worker.ApplyUpdates.
//   overlap : optimizer.Update(wait_for_grads) on a second thread while worker.TrainStep runs:
//             each layer is updated as soon as its gradient lands. When one side fails, the
//             other may be waiting on this step's completion flags, so it is released with
//             AbortStep (both peers), and the root cause is returned (the optimizer's error when
//             both failed: the worker's then only says it was released).
// Without an optimizer (mode native) only TrainStep runs.
//
// Thread-safety: ExecuteStep may use two threads internally; the clients must be thread-safe.
#ifndef LSPO_SCHEDULER_STEP_EXECUTOR_H_
#define LSPO_SCHEDULER_STEP_EXECUTOR_H_

#include "absl/status/statusor.h"
#include "proto/optimizer.pb.h"
#include "proto/worker.pb.h"
#include "scheduler/peer_clients.h"

namespace lspo::scheduler {

// The requests of one step. train.plan().overlap() selects the schedule; update.tasks() and
// apply.tasks() list the linears (deepest first).
struct StepRequests {
  lspo::v1::TrainStepRequest train;
  lspo::v1::UpdateRequest update;
  lspo::v1::ApplyRequest apply;
};

// What the peers answered (update/apply stay empty when they did not run).
struct StepReplies {
  lspo::v1::TrainStepReply train;
  lspo::v1::UpdateReply update;
  lspo::v1::ApplyReply apply;
};

// Runs the step. `optimizer` is null for mode native. `deadline_s` bounds every call (the
// overlapped Update waits at most as long for each gradient). AbortStep calls get 60 s.
// Errors: the failing peer's status (kDeadlineExceeded for a peer that did not answer).
absl::StatusOr<StepReplies> ExecuteStep(WorkerClient& worker, OptimizerClient* optimizer,
                                        StepRequests requests, double deadline_s);

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_STEP_EXECUTOR_H_
