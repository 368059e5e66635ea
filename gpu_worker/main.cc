// lsp_gpu_worker: the GPU worker service (model, forward/backward, projector compress/apply).
#include <csignal>
#include <memory>

#include "runtime/process_env.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "glog/logging.h"
#include "gpu_worker/worker_service.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50061",
          "host:port to serve lspo.v1.Worker on (loopback by default)");

int main(int argc, char** argv) {
  lspo::runtime::UsePassiveOpenMpWaits(argc, argv);
  absl::SetProgramUsageMessage("LSP-Offload GPU worker service. Usage: lsp_gpu_worker --listen=127.0.0.1:50061");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  lspo::worker::WorkerCore core;
  lspo::worker::WorkerService service(&core);
  grpc::ServerBuilder builder;
  // A second instance on the same port must fail, not silently share it (SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_listen), grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    LOG(ERROR) << "cannot listen on " << absl::GetFlag(FLAGS_listen)
               << ": is the port in use? pass --listen=127.0.0.1:<free port>";
    return 1;
  }
  LOG(INFO) << "lsp_gpu_worker listening on " << absl::GetFlag(FLAGS_listen);
  server->Wait();
  return 0;
}
