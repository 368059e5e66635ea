// Typed clients of the scheduler's two peers, the worker and the optimizer services: one
// interface per peer (so the job runner can be driven by fakes in unit tests,
// tests/scheduler/fake_peers.h) and the gRPC implementation over the generated stubs.
//
// Every call takes a deadline in seconds: a peer that does not answer in time fails the call
// with kDeadlineExceeded (a dead or frozen peer never hangs the scheduler). Errors keep the
// peer's status code 1:1 (runtime/rpc_status.h) and the message starts with the peer's name
// ("worker: ...", "optimizer: ..."); kUnavailable adds how to check the service.
//
// Thread-safety: the gRPC clients are thread-safe (the overlapped step calls the optimizer
// and the worker from two threads at once); fakes document their own.
#ifndef LSPO_SCHEDULER_PEER_CLIENTS_H_
#define LSPO_SCHEDULER_PEER_CLIENTS_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "proto/optimizer.grpc.pb.h"
#include "proto/optimizer.pb.h"
#include "proto/peer.pb.h"
#include "proto/worker.grpc.pb.h"
#include "proto/worker.pb.h"

namespace lspo::scheduler {

// The worker service (proto/worker.proto, service Worker): model, forward/backward,
// compress/apply, calibration, evaluation, state.
class WorkerClient {
 public:
  virtual ~WorkerClient() = default;
  virtual absl::StatusOr<lspo::v1::LoadJobReply> LoadJob(const lspo::v1::LoadJobRequest& req,
                                                         double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::UnloadJobReply> UnloadJob(const lspo::v1::UnloadJobRequest& req,
                                                             double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::FitProjectorsReply> FitProjectors(
      const lspo::v1::FitProjectorsRequest& req, double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::TrainStepReply> TrainStep(const lspo::v1::TrainStepRequest& req,
                                                             double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::ApplyReply> ApplyUpdates(const lspo::v1::ApplyRequest& req,
                                                            double deadline_s) = 0;
  // `cancelled` (may be empty) is polled while the evaluation runs (every 200 ms); once it
  // returns true the call is cancelled, the worker stops between batches, and the result is
  // kCancelled.
  virtual absl::StatusOr<lspo::v1::EvaluateReply> Evaluate(
      const lspo::v1::EvaluateRequest& req, double deadline_s,
      const std::function<bool()>& cancelled) = 0;
  virtual absl::StatusOr<lspo::v1::SaveReply> SaveArtifacts(const lspo::v1::SaveRequest& req,
                                                            double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::LayerWeightsReply> ImportLayerWeights(
      const lspo::v1::LayerWeightsRequest& req, double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::AbortStepReply> AbortStep(const lspo::v1::AbortStepRequest& req,
                                                             double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::StateReply> SaveState(const lspo::v1::StateRequest& req,
                                                         double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::StateReply> LoadState(const lspo::v1::StateRequest& req,
                                                         double deadline_s) = 0;
};

// The optimizer service (service Optimizer): fp32 master weights, subspace or full Adam.
class OptimizerClient {
 public:
  virtual ~OptimizerClient() = default;
  virtual absl::StatusOr<lspo::v1::LoadJobReply> LoadJob(const lspo::v1::LoadJobRequest& req,
                                                         double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::UnloadJobReply> UnloadJob(const lspo::v1::UnloadJobRequest& req,
                                                             double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::SetProjectorsReply> SetProjectors(
      const lspo::v1::SetProjectorsRequest& req, double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::UpdateReply> Update(const lspo::v1::UpdateRequest& req,
                                                       double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::SaveReply> SaveModel(const lspo::v1::SaveRequest& req,
                                                        double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::AbortStepReply> AbortStep(const lspo::v1::AbortStepRequest& req,
                                                             double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::LayerWeightsReply> ExportLayerWeights(
      const lspo::v1::LayerWeightsRequest& req, double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::StateReply> SaveState(const lspo::v1::StateRequest& req,
                                                         double deadline_s) = 0;
  virtual absl::StatusOr<lspo::v1::StateReply> LoadState(const lspo::v1::StateRequest& req,
                                                         double deadline_s) = 0;
};

// gRPC clients over `stub` (not owned; must outlive the client).
std::unique_ptr<WorkerClient> MakeGrpcWorkerClient(lspo::v1::Worker::StubInterface* stub);
std::unique_ptr<OptimizerClient> MakeGrpcOptimizerClient(lspo::v1::Optimizer::StubInterface* stub);

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_PEER_CLIENTS_H_
