// gRPC adapter of OptimizerCore (lspo.v1.Optimizer): translates messages, maps codes 1:1.
#ifndef LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_SERVICE_H_
#define LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_SERVICE_H_

#include "cpu_optimizer_service/optimizer_core.h"
#include "proto/optimizer.grpc.pb.h"
#include "proto/optimizer.pb.h"
#include "proto/peer.pb.h"

namespace lspo::optimizer {

class OptimizerService final : public lspo::v1::Optimizer::Service {
 public:
  explicit OptimizerService(OptimizerCore* core) : core_(core) {}
  grpc::Status LoadJob(grpc::ServerContext*, const lspo::v1::LoadJobRequest*,
                       lspo::v1::LoadJobReply*) override;
  grpc::Status SetProjectors(grpc::ServerContext*, const lspo::v1::SetProjectorsRequest*,
                             lspo::v1::SetProjectorsReply*) override;
  grpc::Status Update(grpc::ServerContext*, const lspo::v1::UpdateRequest*,
                      lspo::v1::UpdateReply*) override;
  grpc::Status SaveModel(grpc::ServerContext*, const lspo::v1::SaveRequest*,
                         lspo::v1::SaveReply*) override;
  grpc::Status UnloadJob(grpc::ServerContext*, const lspo::v1::UnloadJobRequest*,
                         lspo::v1::UnloadJobReply*) override;
  grpc::Status SaveState(grpc::ServerContext*, const lspo::v1::StateRequest*,
                         lspo::v1::StateReply*) override;
  grpc::Status LoadState(grpc::ServerContext*, const lspo::v1::StateRequest*,
                         lspo::v1::StateReply*) override;
  grpc::Status AbortStep(grpc::ServerContext*, const lspo::v1::AbortStepRequest*,
                         lspo::v1::AbortStepReply*) override;
  grpc::Status ExportLayerWeights(grpc::ServerContext*, const lspo::v1::LayerWeightsRequest*,
                                  lspo::v1::LayerWeightsReply*) override;

 private:
  OptimizerCore* core_;  // Not owned.
};

}  // namespace lspo::optimizer

#endif  // LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_SERVICE_H_
