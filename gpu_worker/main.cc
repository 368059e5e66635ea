// lsp_gpu_worker: the GPU worker service (model, forward/backward, projector compress/apply).
#include <csignal>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "glog/logging.h"
#include "gpu_worker/worker_service.h"
#include "runtime/cpu_blas.h"
#include "runtime/grpc_flags.h"
#include "runtime/process_env.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50061",
          "host:port to serve lspo.v1.Worker on (loopback by default)");
ABSL_FLAG(std::vector<std::string>, allowed_roots, {},
          "comma-separated directories job specs may read and write (empty = anywhere)");
ABSL_FLAG(bool, skip_memory_check, false,
          "load jobs whose memory plan does not fit the device (for a plan that overestimates a "
          "job known to fit; `lspctl plan` prints the plan)");

int main(int argc, char** argv) {
  lspo::runtime::UsePassiveOpenMpWaits(argc, argv);
  lspo::runtime::UseOneMallocArena();
  absl::SetProgramUsageMessage(
      "LSP-Offload GPU worker service. Usage: lsp_gpu_worker --listen=127.0.0.1:50061");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (const auto& blas = lspo::runtime::CpuBlas(); blas.warning.empty()) {
    LOG(INFO) << "CPU BLAS: " << blas.Line();
  } else {
    LOG(WARNING) << "CPU BLAS: " << blas.Line();
  }
  lspo::worker::WorkerOptions options;
  options.allowed_roots = absl::GetFlag(FLAGS_allowed_roots);
  options.skip_memory_check = absl::GetFlag(FLAGS_skip_memory_check);
  lspo::worker::WorkerCore core(std::move(options));
  lspo::worker::WorkerService service(&core);
  lspo::runtime::ServerOptions server;
  server.listen = absl::GetFlag(FLAGS_listen);
  server.services = {{lspo::v1::Worker::service_full_name(), &service}};
  server.max_receive_message_bytes = 64 << 20;
  return lspo::runtime::ServeMain(server, "lsp_gpu_worker");
}
