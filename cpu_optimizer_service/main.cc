// lsp_cpu_optimizer: the CPU optimizer service (fp32 master weights, subspace Adam).
#include <memory>

#include "runtime/process_env.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cpu_optimizer_service/optimizer_service.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50062",
          "host:port to serve lspo.v1.Optimizer on (loopback by default)");

int main(int argc, char** argv) {
  lspo::runtime::UsePassiveOpenMpWaits(argc, argv);
  absl::SetProgramUsageMessage("LSP-Offload CPU optimizer service. Usage: lsp_cpu_optimizer --listen=127.0.0.1:50062");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  lspo::optimizer::OptimizerCore core;
  lspo::optimizer::OptimizerService service(&core);
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
  LOG(INFO) << "lsp_cpu_optimizer listening on " << absl::GetFlag(FLAGS_listen);
  server->Wait();
  return 0;
}
