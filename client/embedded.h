// Embedded mode: the scheduler, worker and optimizer services in one process, wired through
// in-process gRPC channels (the same service interfaces and arena code as the multi-process
// deployment, without ports). The composition root of `lspctl run`.
#ifndef LSPO_CLIENT_EMBEDDED_H_
#define LSPO_CLIENT_EMBEDDED_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cpu_optimizer_service/optimizer_service.h"
#include "gpu_worker/worker_service.h"
#include "grpcpp/grpcpp.h"
#include "scheduler/scheduler_service.h"

namespace lspo::client {

// The three services of one process (see the file comment). Shutdown order on destruction:
// the scheduler's server, the scheduler (cancels and joins its job), then the peers.
class EmbeddedRuntime {
 public:
  // Starts the three services; `options` configures the scheduler, and its allowed_roots
  // the worker's and the optimizer's too (their RPCs check the same roots, replacing
  // worker.allowed_roots); `worker` the rest of the worker (gpu_worker/worker_options.h: the
  // memory check, the tests' fault injection). Errors: kInternal when an in-process gRPC
  // server does not start; SchedulerCore::Create's (an unusable options.state_dir, named).
  static absl::StatusOr<std::unique_ptr<EmbeddedRuntime>> Start(
      scheduler::SchedulerOptions options = {}, worker::WorkerOptions worker = {});
  ~EmbeddedRuntime();

  // A channel to the in-process Scheduler service (use lspo::v1::Scheduler::NewStub).
  std::shared_ptr<grpc::Channel> scheduler_channel() const { return scheduler_channel_; }

 private:
  // The worker's core set up by `worker`, the optimizer's confined to its allowed_roots.
  explicit EmbeddedRuntime(worker::WorkerOptions worker);

  worker::WorkerCore worker_core_;
  optimizer::OptimizerCore optimizer_core_;
  worker::WorkerService worker_service_;
  optimizer::OptimizerService optimizer_service_;
  std::unique_ptr<grpc::Server> actors_server_;
  std::unique_ptr<lspo::v1::Worker::Stub> worker_stub_;
  std::unique_ptr<lspo::v1::Optimizer::Stub> optimizer_stub_;
  std::unique_ptr<scheduler::SchedulerCore> scheduler_core_;
  std::unique_ptr<scheduler::SchedulerService> scheduler_service_;
  std::unique_ptr<grpc::Server> scheduler_server_;
  std::shared_ptr<grpc::Channel> scheduler_channel_;
};

}  // namespace lspo::client

#endif  // LSPO_CLIENT_EMBEDDED_H_
