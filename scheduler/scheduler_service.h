// gRPC adapter of SchedulerCore (lspo.v1.Scheduler): translates messages, maps codes 1:1.
#ifndef LSPO_SCHEDULER_SCHEDULER_SERVICE_H_
#define LSPO_SCHEDULER_SCHEDULER_SERVICE_H_

#include "proto/scheduler.grpc.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/scheduler_core.h"

namespace lspo::scheduler {

class SchedulerService final : public lspo::v1::Scheduler::Service {
 public:
  explicit SchedulerService(SchedulerCore* core) : core_(core) {}
  grpc::Status SubmitJob(grpc::ServerContext*, const lspo::v1::SubmitJobRequest*,
                         lspo::v1::SubmitJobReply*) override;
  grpc::Status GetJob(grpc::ServerContext*, const lspo::v1::GetJobRequest*,
                      lspo::v1::JobStatus*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const lspo::v1::ListJobsRequest*,
                        lspo::v1::ListJobsReply*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const lspo::v1::CancelJobRequest*,
                         lspo::v1::CancelJobReply*) override;
  // Streams until the job is final or the client goes away.
  grpc::Status WatchJob(grpc::ServerContext*, const lspo::v1::WatchJobRequest*,
                        grpc::ServerWriter<lspo::v1::JobStatus>*) override;

 private:
  SchedulerCore* core_;  // Not owned.
};

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_SCHEDULER_SERVICE_H_
