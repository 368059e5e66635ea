#include "scheduler/scheduler_service.h"

#include "runtime/rpc_status.h"

namespace lspo::scheduler {

grpc::Status SchedulerService::SubmitJob(grpc::ServerContext*,
                                         const lspo::v1::SubmitJobRequest* req,
                                         lspo::v1::SubmitJobReply* out) {
  auto id = core_->Submit(req->spec());
  if (!id.ok()) return rpc::ToGrpc(id.status());
  out->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::GetJob(grpc::ServerContext*, const lspo::v1::GetJobRequest* req,
                                      lspo::v1::JobStatus* out) {
  auto s = core_->Get(req->job_id());
  if (!s.ok()) return rpc::ToGrpc(s.status());
  *out = std::move(*s);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::ListJobs(grpc::ServerContext*, const lspo::v1::ListJobsRequest*,
                                        lspo::v1::ListJobsReply* out) {
  for (auto& s : core_->List()) *out->add_jobs() = std::move(s);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::CancelJob(grpc::ServerContext*,
                                         const lspo::v1::CancelJobRequest* req,
                                         lspo::v1::CancelJobReply* out) {
  auto s = core_->Cancel(req->job_id());
  if (!s.ok()) return rpc::ToGrpc(s.status());
  out->set_state(*s);
  return grpc::Status::OK;
}

grpc::Status SchedulerService::WatchJob(grpc::ServerContext* ctx,
                                        const lspo::v1::WatchJobRequest* req,
                                        grpc::ServerWriter<lspo::v1::JobStatus>* writer) {
  return rpc::ToGrpc(core_->Watch(req->job_id(), [&](const lspo::v1::JobStatus& s) {
    if (ctx->IsCancelled()) return false;
    return writer->Write(s);
  }));
}

}  // namespace lspo::scheduler
