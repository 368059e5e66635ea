// lsp_scheduler: the scheduler service (job queue, per-step plan, status RPCs).
#include <memory>
#include <string>
#include <vector>

#include "runtime/process_env.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "scheduler/scheduler_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50060", "host:port to serve lspo.v1.Scheduler on");
ABSL_FLAG(std::string, worker, "127.0.0.1:50061", "address of the lsp_gpu_worker service");
ABSL_FLAG(std::string, optimizer, "127.0.0.1:50062", "address of the lsp_cpu_optimizer service");
ABSL_FLAG(std::string, runs_root, "runs", "parent directory of default job output directories");
ABSL_FLAG(double, rpc_deadline_seconds, 1800, "deadline of each worker/optimizer call");
ABSL_FLAG(std::string, state_dir, "",
          "directory where jobs are persisted and resumed from after a restart (empty = memory only)");
ABSL_FLAG(std::vector<std::string>, allowed_roots, {},
          "comma-separated directories job specs may read and write (empty = anywhere)");

int main(int argc, char** argv) {
  lspo::runtime::UsePassiveOpenMpWaits(argc, argv);
  absl::SetProgramUsageMessage("LSP-Offload scheduler service. Usage: lsp_scheduler --listen=... --worker=... --optimizer=...");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto wch = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_worker),
                                       grpc::InsecureChannelCredentials(), args);
  auto och = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_optimizer),
                                       grpc::InsecureChannelCredentials(), args);
  auto worker = lspo::v1::Worker::NewStub(wch);
  auto optimizer = lspo::v1::Optimizer::NewStub(och);
  lspo::scheduler::SchedulerOptions opts;
  opts.runs_root = absl::GetFlag(FLAGS_runs_root);
  opts.rpc_deadline_seconds = absl::GetFlag(FLAGS_rpc_deadline_seconds);
  opts.state_dir = absl::GetFlag(FLAGS_state_dir);
  opts.allowed_roots = absl::GetFlag(FLAGS_allowed_roots);
  lspo::scheduler::SchedulerCore core(worker.get(), optimizer.get(), opts);
  lspo::scheduler::SchedulerService service(&core);
  grpc::ServerBuilder builder;
  // A second instance on the same port must fail, not silently share it (SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    LOG(ERROR) << "cannot listen on " << absl::GetFlag(FLAGS_listen)
               << ": is the port in use? pass --listen=127.0.0.1:<free port>";
    return 1;
  }
  LOG(INFO) << "lsp_scheduler listening on " << absl::GetFlag(FLAGS_listen) << " (worker "
            << absl::GetFlag(FLAGS_worker) << ", optimizer " << absl::GetFlag(FLAGS_optimizer)
            << ")";
  server->Wait();
  return 0;
}
