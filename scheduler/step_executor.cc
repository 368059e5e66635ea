#include "scheduler/step_executor.h"

#include <thread>
#include <utility>

#include "runtime/status_macros.h"

namespace lspo::scheduler {

absl::StatusOr<StepReplies> ExecuteStep(WorkerClient& worker, OptimizerClient* optimizer,
                                        StepRequests requests, double deadline_s) {
  constexpr double kAbortDeadlineSeconds = 60;
  StepReplies out;
  const bool overlap = optimizer != nullptr && requests.train.plan().overlap();
  if (overlap) {
    // The optimizer waits on each layer's gradient flag while the worker's backward runs.
    requests.update.set_wait_for_grads(true);
    requests.update.set_wait_timeout_seconds(deadline_s);
    lspo::v1::AbortStepRequest abort_req;
    abort_req.set_job_id(requests.train.job_id());
    abort_req.set_step(requests.train.step());
    absl::StatusOr<lspo::v1::UpdateReply> update;
    std::thread updater([&] {
      update = optimizer->Update(requests.update, deadline_s);
      if (!update.ok()) (void)worker.AbortStep(abort_req, kAbortDeadlineSeconds);
    });
    absl::StatusOr<lspo::v1::TrainStepReply> train = worker.TrainStep(requests.train, deadline_s);
    if (!train.ok()) (void)optimizer->AbortStep(abort_req, kAbortDeadlineSeconds);
    updater.join();
    RETURN_IF_ERROR(update.status());  // The root cause when both failed.
    RETURN_IF_ERROR(train.status());
    out.train = std::move(*train);
    out.update = std::move(*update);
    return out;
  }
  ASSIGN_OR_RETURN(out.train, worker.TrainStep(requests.train, deadline_s));
  if (optimizer == nullptr || out.train.nonfinite()) return out;
  ASSIGN_OR_RETURN(out.update, optimizer->Update(requests.update, deadline_s));
  ASSIGN_OR_RETURN(out.apply, worker.ApplyUpdates(requests.apply, deadline_s));
  return out;
}

}  // namespace lspo::scheduler
