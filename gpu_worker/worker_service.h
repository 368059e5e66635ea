// gRPC adapter of WorkerCore (lspo.v1.Worker): translates messages, maps status codes 1:1.
#ifndef LSPO_GPU_WORKER_WORKER_SERVICE_H_
#define LSPO_GPU_WORKER_WORKER_SERVICE_H_

#include "gpu_worker/worker_core.h"
#include "proto/peer.pb.h"
#include "proto/worker.grpc.pb.h"
#include "proto/worker.pb.h"

namespace lspo::worker {

class WorkerService final : public lspo::v1::Worker::Service {
 public:
  explicit WorkerService(WorkerCore* core) : core_(core) {}
  grpc::Status LoadJob(grpc::ServerContext*, const lspo::v1::LoadJobRequest*,
                       lspo::v1::LoadJobReply*) override;
  grpc::Status FitProjectors(grpc::ServerContext*, const lspo::v1::FitProjectorsRequest*,
                             lspo::v1::FitProjectorsReply*) override;
  grpc::Status TrainStep(grpc::ServerContext*, const lspo::v1::TrainStepRequest*,
                         lspo::v1::TrainStepReply*) override;
  grpc::Status ApplyUpdates(grpc::ServerContext*, const lspo::v1::ApplyRequest*,
                            lspo::v1::ApplyReply*) override;
  grpc::Status Evaluate(grpc::ServerContext*, const lspo::v1::EvaluateRequest*,
                        lspo::v1::EvaluateReply*) override;
  grpc::Status SaveArtifacts(grpc::ServerContext*, const lspo::v1::SaveRequest*,
                             lspo::v1::SaveReply*) override;
  grpc::Status UnloadJob(grpc::ServerContext*, const lspo::v1::UnloadJobRequest*,
                         lspo::v1::UnloadJobReply*) override;
  grpc::Status ImportLayerWeights(grpc::ServerContext*, const lspo::v1::LayerWeightsRequest*,
                                  lspo::v1::LayerWeightsReply*) override;
  grpc::Status SaveState(grpc::ServerContext*, const lspo::v1::StateRequest*,
                         lspo::v1::StateReply*) override;
  grpc::Status LoadState(grpc::ServerContext*, const lspo::v1::StateRequest*,
                         lspo::v1::StateReply*) override;
  grpc::Status AbortStep(grpc::ServerContext*, const lspo::v1::AbortStepRequest*,
                         lspo::v1::AbortStepReply*) override;

 private:
  WorkerCore* core_;  // Not owned.
};

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_WORKER_SERVICE_H_
