#include "client/embedded.h"

#include <utility>

#include "runtime/status_macros.h"

namespace lspo::client {

EmbeddedRuntime::EmbeddedRuntime(worker::WorkerOptions worker)
    : worker_core_(worker),
      optimizer_core_(optimizer::OptimizerOptions{worker.allowed_roots}),
      worker_service_(&worker_core_),
      optimizer_service_(&optimizer_core_) {}

absl::StatusOr<std::unique_ptr<EmbeddedRuntime>> EmbeddedRuntime::Start(
    scheduler::SchedulerOptions options, worker::WorkerOptions worker) {
  worker.allowed_roots = options.allowed_roots;  // One set of roots for the three services.
  std::unique_ptr<EmbeddedRuntime> rt(new EmbeddedRuntime(std::move(worker)));
  grpc::ServerBuilder actors;
  actors.RegisterService(&rt->worker_service_);
  actors.RegisterService(&rt->optimizer_service_);
  rt->actors_server_ = actors.BuildAndStart();
  if (rt->actors_server_ == nullptr) {
    return absl::InternalError(
        "embedded runtime: the in-process server of the worker and optimizer did not start");
  }
  grpc::ChannelArguments args;
  auto channel = rt->actors_server_->InProcessChannel(args);
  rt->worker_stub_ = lspo::v1::Worker::NewStub(channel);
  rt->optimizer_stub_ = lspo::v1::Optimizer::NewStub(channel);
  ASSIGN_OR_RETURN(rt->scheduler_core_,
                   scheduler::SchedulerCore::Create(rt->worker_stub_.get(),
                                                    rt->optimizer_stub_.get(), std::move(options)));
  rt->scheduler_service_ = std::make_unique<scheduler::SchedulerService>(rt->scheduler_core_.get());
  grpc::ServerBuilder sched;
  sched.RegisterService(rt->scheduler_service_.get());
  rt->scheduler_server_ = sched.BuildAndStart();
  if (rt->scheduler_server_ == nullptr) {
    return absl::InternalError("embedded runtime: the in-process scheduler server did not start");
  }
  rt->scheduler_channel_ = rt->scheduler_server_->InProcessChannel(args);
  return rt;
}

EmbeddedRuntime::~EmbeddedRuntime() {
  if (scheduler_server_ != nullptr) scheduler_server_->Shutdown();
  scheduler_core_.reset();  // Cancels and joins the runner before the actors go away.
  if (actors_server_ != nullptr) actors_server_->Shutdown();
}

}  // namespace lspo::client
