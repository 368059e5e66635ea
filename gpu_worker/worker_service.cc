#include "gpu_worker/worker_service.h"

#include <vector>

#include "runtime/rpc_status.h"

namespace lspo::worker {

grpc::Status WorkerService::LoadJob(grpc::ServerContext*, const lspo::v1::LoadJobRequest* req,
                                    lspo::v1::LoadJobReply* out) {
  const std::vector<int> candidates(req->resume_candidate_steps().begin(),
                                    req->resume_candidate_steps().end());
  return rpc::Reply(
      core_->LoadJob(req->job_id(), req->spec(), req->agree_resume() ? &candidates : nullptr), out);
}
grpc::Status WorkerService::FitProjectors(grpc::ServerContext*,
                                          const lspo::v1::FitProjectorsRequest* req,
                                          lspo::v1::FitProjectorsReply* out) {
  return rpc::Reply(core_->FitProjectors(req->job_id(), req->step()), out);
}
grpc::Status WorkerService::TrainStep(grpc::ServerContext*, const lspo::v1::TrainStepRequest* req,
                                      lspo::v1::TrainStepReply* out) {
  return rpc::Reply(core_->TrainStep(req->job_id(), req->step(), req->lr(), req->plan()), out);
}
grpc::Status WorkerService::ApplyUpdates(grpc::ServerContext*, const lspo::v1::ApplyRequest* req,
                                         lspo::v1::ApplyReply* out) {
  return rpc::Reply(core_->ApplyUpdates(req->job_id(), req->step(), *req), out);
}
grpc::Status WorkerService::Evaluate(grpc::ServerContext* ctx, const lspo::v1::EvaluateRequest* req,
                                     lspo::v1::EvaluateReply* out) {
  // A cancelled call (the scheduler cancels it when the job is cancelled, or its deadline
  // passed) stops the evaluation between batches instead of running it to the end.
  auto r = core_->Evaluate(req->job_id(), req->step(), [ctx] { return ctx->IsCancelled(); });
  if (!r.ok()) return rpc::ToGrpc(r.status());
  *out->mutable_metrics() = std::move(*r);
  return grpc::Status::OK;
}
grpc::Status WorkerService::SaveArtifacts(grpc::ServerContext*, const lspo::v1::SaveRequest* req,
                                          lspo::v1::SaveReply* out) {
  return rpc::Reply(core_->SaveArtifacts(req->job_id(), req->dir()), out);
}
grpc::Status WorkerService::ImportLayerWeights(grpc::ServerContext*,
                                               const lspo::v1::LayerWeightsRequest* req,
                                               lspo::v1::LayerWeightsReply* out) {
  return rpc::Reply(core_->ImportLayerWeights(*req), out);
}
grpc::Status WorkerService::AbortStep(grpc::ServerContext*, const lspo::v1::AbortStepRequest* req,
                                      lspo::v1::AbortStepReply*) {
  return rpc::ToGrpc(core_->AbortStep(req->job_id(), req->step()));
}
grpc::Status WorkerService::UnloadJob(grpc::ServerContext*, const lspo::v1::UnloadJobRequest* req,
                                      lspo::v1::UnloadJobReply*) {
  return rpc::ToGrpc(core_->UnloadJob(req->job_id()));
}

grpc::Status WorkerService::SaveState(grpc::ServerContext*, const lspo::v1::StateRequest* req,
                                      lspo::v1::StateReply* out) {
  return rpc::Reply(core_->SaveState(req->job_id(), req->dir(), req->step()), out);
}
grpc::Status WorkerService::LoadState(grpc::ServerContext*, const lspo::v1::StateRequest* req,
                                      lspo::v1::StateReply* out) {
  return rpc::Reply(core_->LoadState(req->job_id(), req->dir(), req->step()), out);
}

}  // namespace lspo::worker
