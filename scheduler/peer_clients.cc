#include "scheduler/peer_clients.h"

#include <chrono>
#include <cstdint>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "runtime/rpc_status.h"

namespace lspo::scheduler {
namespace {

namespace v1 = lspo::v1;

// Calls a unary stub method with a deadline and maps the status (naming the peer).
template <typename Stub, typename Req, typename Rep>
absl::StatusOr<Rep> Call(Stub* stub,
                         grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Rep*),
                         const Req& req, double deadline_s, absl::string_view peer) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000)));
  Rep rep;
  absl::Status st = rpc::FromGrpc((stub->*method)(&ctx, req, &rep), peer);
  if (!st.ok()) return st;
  return rep;
}

class GrpcWorkerClient final : public WorkerClient {
 public:
  explicit GrpcWorkerClient(v1::Worker::StubInterface* stub) : stub_(stub) {}
  using S = v1::Worker::StubInterface;
  absl::StatusOr<v1::LoadJobReply> LoadJob(const v1::LoadJobRequest& r, double d) override {
    return Call(stub_, &S::LoadJob, r, d, kPeer);
  }
  absl::StatusOr<v1::UnloadJobReply> UnloadJob(const v1::UnloadJobRequest& r, double d) override {
    return Call(stub_, &S::UnloadJob, r, d, kPeer);
  }
  absl::StatusOr<v1::FitProjectorsReply> FitProjectors(const v1::FitProjectorsRequest& r,
                                                       double d) override {
    return Call(stub_, &S::FitProjectors, r, d, kPeer);
  }
  absl::StatusOr<v1::TrainStepReply> TrainStep(const v1::TrainStepRequest& r, double d) override {
    return Call(stub_, &S::TrainStep, r, d, kPeer);
  }
  absl::StatusOr<v1::ApplyReply> ApplyUpdates(const v1::ApplyRequest& r, double d) override {
    return Call(stub_, &S::ApplyUpdates, r, d, kPeer);
  }
  absl::StatusOr<v1::EvaluateReply> Evaluate(const v1::EvaluateRequest& r, double d,
                                             const std::function<bool()>& cancelled) override {
    if (!cancelled || stub_->async() == nullptr) return Call(stub_, &S::Evaluate, r, d, kPeer);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(d * 1000)));
    v1::EvaluateReply rep;
    absl::Mutex mu;
    bool done = false;
    grpc::Status status;
    stub_->async()->Evaluate(&ctx, &r, &rep, [&](grpc::Status s) {
      absl::MutexLock lock(&mu);
      status = std::move(s);
      done = true;
    });
    bool cancel_sent = false;
    {
      absl::MutexLock lock(&mu);
      while (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(200))) {
        if (!cancel_sent && cancelled()) {
          ctx.TryCancel();  // the callback still runs, with CANCELLED
          cancel_sent = true;
        }
      }
    }
    if (cancel_sent) return absl::CancelledError("cancelled by the user (during an evaluation)");
    absl::Status st = rpc::FromGrpc(status, kPeer);
    if (!st.ok()) return st;
    return rep;
  }
  absl::StatusOr<v1::SaveReply> SaveArtifacts(const v1::SaveRequest& r, double d) override {
    return Call(stub_, &S::SaveArtifacts, r, d, kPeer);
  }
  absl::StatusOr<v1::LayerWeightsReply> ImportLayerWeights(const v1::LayerWeightsRequest& r,
                                                           double d) override {
    return Call(stub_, &S::ImportLayerWeights, r, d, kPeer);
  }
  absl::StatusOr<v1::AbortStepReply> AbortStep(const v1::AbortStepRequest& r, double d) override {
    return Call(stub_, &S::AbortStep, r, d, kPeer);
  }
  absl::StatusOr<v1::StateReply> SaveState(const v1::StateRequest& r, double d) override {
    return Call(stub_, &S::SaveState, r, d, kPeer);
  }
  absl::StatusOr<v1::StateReply> LoadState(const v1::StateRequest& r, double d) override {
    return Call(stub_, &S::LoadState, r, d, kPeer);
  }

 private:
  static constexpr char kPeer[] = "worker";
  v1::Worker::StubInterface* stub_;
};

class GrpcOptimizerClient final : public OptimizerClient {
 public:
  explicit GrpcOptimizerClient(v1::Optimizer::StubInterface* stub) : stub_(stub) {}
  using S = v1::Optimizer::StubInterface;
  absl::StatusOr<v1::LoadJobReply> LoadJob(const v1::LoadJobRequest& r, double d) override {
    return Call(stub_, &S::LoadJob, r, d, kPeer);
  }
  absl::StatusOr<v1::UnloadJobReply> UnloadJob(const v1::UnloadJobRequest& r, double d) override {
    return Call(stub_, &S::UnloadJob, r, d, kPeer);
  }
  absl::StatusOr<v1::SetProjectorsReply> SetProjectors(const v1::SetProjectorsRequest& r,
                                                       double d) override {
    return Call(stub_, &S::SetProjectors, r, d, kPeer);
  }
  absl::StatusOr<v1::UpdateReply> Update(const v1::UpdateRequest& r, double d) override {
    return Call(stub_, &S::Update, r, d, kPeer);
  }
  absl::StatusOr<v1::SaveReply> SaveModel(const v1::SaveRequest& r, double d) override {
    return Call(stub_, &S::SaveModel, r, d, kPeer);
  }
  absl::StatusOr<v1::AbortStepReply> AbortStep(const v1::AbortStepRequest& r, double d) override {
    return Call(stub_, &S::AbortStep, r, d, kPeer);
  }
  absl::StatusOr<v1::LayerWeightsReply> ExportLayerWeights(const v1::LayerWeightsRequest& r,
                                                           double d) override {
    return Call(stub_, &S::ExportLayerWeights, r, d, kPeer);
  }
  absl::StatusOr<v1::StateReply> SaveState(const v1::StateRequest& r, double d) override {
    return Call(stub_, &S::SaveState, r, d, kPeer);
  }
  absl::StatusOr<v1::StateReply> LoadState(const v1::StateRequest& r, double d) override {
    return Call(stub_, &S::LoadState, r, d, kPeer);
  }

 private:
  static constexpr char kPeer[] = "optimizer";
  v1::Optimizer::StubInterface* stub_;
};

}  // namespace

std::unique_ptr<WorkerClient> MakeGrpcWorkerClient(v1::Worker::StubInterface* stub) {
  return std::make_unique<GrpcWorkerClient>(stub);
}

std::unique_ptr<OptimizerClient> MakeGrpcOptimizerClient(v1::Optimizer::StubInterface* stub) {
  return std::make_unique<GrpcOptimizerClient>(stub);
}

}  // namespace lspo::scheduler
