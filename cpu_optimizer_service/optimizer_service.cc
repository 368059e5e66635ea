#include "cpu_optimizer_service/optimizer_service.h"

#include "runtime/rpc_status.h"

namespace lspo::optimizer {

grpc::Status OptimizerService::LoadJob(grpc::ServerContext*, const lspo::v1::LoadJobRequest* req,
                                       lspo::v1::LoadJobReply* out) {
  auto r = core_->LoadJob(req->job_id(), req->spec(), req->arena());
  if (!r.ok()) return rpc::ToGrpc(r.status());
  *out = std::move(*r);
  return grpc::Status::OK;
}
grpc::Status OptimizerService::SetProjectors(grpc::ServerContext*,
                                             const lspo::v1::SetProjectorsRequest* req,
                                             lspo::v1::SetProjectorsReply*) {
  std::vector<int> idx(req->indices().begin(), req->indices().end());
  return rpc::ToGrpc(core_->SetProjectors(req->job_id(), idx));
}
grpc::Status OptimizerService::Update(grpc::ServerContext*, const lspo::v1::UpdateRequest* req,
                                      lspo::v1::UpdateReply* out) {
  auto r = core_->Update(*req);
  if (!r.ok()) return rpc::ToGrpc(r.status());
  *out = std::move(*r);
  return grpc::Status::OK;
}
grpc::Status OptimizerService::SaveModel(grpc::ServerContext*, const lspo::v1::SaveRequest* req,
                                         lspo::v1::SaveReply* out) {
  auto r = core_->SaveModel(req->job_id(), req->dir());
  if (!r.ok()) return rpc::ToGrpc(r.status());
  *out = std::move(*r);
  return grpc::Status::OK;
}
grpc::Status OptimizerService::AbortStep(grpc::ServerContext*,
                                         const lspo::v1::AbortStepRequest* req,
                                         lspo::v1::AbortStepReply*) {
  return rpc::ToGrpc(core_->AbortStep(req->job_id(), req->step()));
}
grpc::Status OptimizerService::ExportLayerWeights(grpc::ServerContext*,
                                                  const lspo::v1::LayerWeightsRequest* req,
                                                  lspo::v1::LayerWeightsReply* out) {
  auto r = core_->ExportLayerWeights(req->job_id(), req->layer());
  if (!r.ok()) return rpc::ToGrpc(r.status());
  *out = std::move(*r);
  return grpc::Status::OK;
}
grpc::Status OptimizerService::UnloadJob(grpc::ServerContext*,
                                         const lspo::v1::UnloadJobRequest* req,
                                         lspo::v1::UnloadJobReply*) {
  return rpc::ToGrpc(core_->UnloadJob(req->job_id()));
}

grpc::Status OptimizerService::SaveState(grpc::ServerContext*, const lspo::v1::StateRequest* req,
                                         lspo::v1::StateReply* out) {
  return rpc::Reply(core_->SaveState(req->job_id(), req->dir(), req->step()), out);
}
grpc::Status OptimizerService::LoadState(grpc::ServerContext*, const lspo::v1::StateRequest* req,
                                         lspo::v1::StateReply* out) {
  return rpc::Reply(core_->LoadState(req->job_id(), req->dir(), req->step()), out);
}

}  // namespace lspo::optimizer
