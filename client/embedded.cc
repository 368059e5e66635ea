#include "client/embedded.h"

namespace lspo::client {

EmbeddedRuntime::EmbeddedRuntime(scheduler::SchedulerOptions options)
    : worker_service_(&worker_core_), optimizer_service_(&optimizer_core_) {
  grpc::ServerBuilder actors;
  actors.RegisterService(&worker_service_);
  actors.RegisterService(&optimizer_service_);
  actors_server_ = actors.BuildAndStart();
  grpc::ChannelArguments args;
  auto channel = actors_server_->InProcessChannel(args);
  worker_stub_ = lspo::v1::Worker::NewStub(channel);
  optimizer_stub_ = lspo::v1::Optimizer::NewStub(channel);
  scheduler_core_ = std::make_unique<scheduler::SchedulerCore>(
      worker_stub_.get(), optimizer_stub_.get(), std::move(options));
  scheduler_service_ = std::make_unique<scheduler::SchedulerService>(scheduler_core_.get());
  grpc::ServerBuilder sched;
  sched.RegisterService(scheduler_service_.get());
  scheduler_server_ = sched.BuildAndStart();
  scheduler_channel_ = scheduler_server_->InProcessChannel(args);
}

EmbeddedRuntime::~EmbeddedRuntime() {
  scheduler_server_->Shutdown();
  scheduler_core_.reset();  // Cancels and joins the runner before the actors go away.
  actors_server_->Shutdown();
}

}  // namespace lspo::client
