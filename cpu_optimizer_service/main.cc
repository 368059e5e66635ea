// lsp_cpu_optimizer: the CPU optimizer service (fp32 master weights, subspace Adam).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cpu_optimizer_service/optimizer_service.h"
#include "glog/logging.h"
#include "runtime/cpu_blas.h"
#include "runtime/grpc_flags.h"
#include "runtime/process_env.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50062",
          "host:port to serve lspo.v1.Optimizer on (loopback by default)");
ABSL_FLAG(std::vector<std::string>, allowed_roots, {},
          "comma-separated directories job specs may read and write (empty = anywhere)");

int main(int argc, char** argv) {
  lspo::runtime::UsePassiveOpenMpWaits(argc, argv);
  lspo::runtime::UseOneMallocArena();
  absl::SetProgramUsageMessage(
      "LSP-Offload CPU optimizer service. Usage: lsp_cpu_optimizer --listen=127.0.0.1:50062");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (const auto& blas = lspo::runtime::CpuBlas(); blas.warning.empty()) {
    LOG(INFO) << "CPU BLAS: " << blas.Line();
  } else {
    LOG(WARNING) << "CPU BLAS: " << blas.Line();
  }
  lspo::optimizer::OptimizerOptions options;
  options.allowed_roots = absl::GetFlag(FLAGS_allowed_roots);
  lspo::optimizer::OptimizerCore core(std::move(options));
  lspo::optimizer::OptimizerService service(&core);
  lspo::runtime::ServerOptions server;
  server.listen = absl::GetFlag(FLAGS_listen);
  server.services = {{lspo::v1::Optimizer::service_full_name(), &service}};
  return lspo::runtime::ServeMain(server, "lsp_cpu_optimizer");
}
