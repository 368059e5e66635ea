// lsp_scheduler: the scheduler service (job queue, per-step plan, status RPCs).
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "runtime/grpc_flags.h"
#include "runtime/process_env.h"
#include "scheduler/scheduler_service.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50060", "host:port to serve lspo.v1.Scheduler on");
ABSL_FLAG(std::string, worker, "127.0.0.1:50061", "address of the lsp_gpu_worker service");
ABSL_FLAG(std::string, optimizer, "127.0.0.1:50062", "address of the lsp_cpu_optimizer service");
ABSL_FLAG(std::string, runs_root, "runs", "parent directory of default job output directories");
ABSL_FLAG(double, rpc_deadline_seconds, 1800, "deadline of each worker/optimizer call");
ABSL_FLAG(int, max_restarts, 3,
          "automatic resumes of a job interrupted by scheduler restarts (0 = none); the next "
          "interruption leaves it FAILED");
ABSL_FLAG(
    std::string, state_dir, "",
    "directory where jobs are persisted and resumed from after a restart (empty = memory only)");
ABSL_FLAG(std::vector<std::string>, allowed_roots, {},
          "comma-separated directories job specs may read and write (empty = anywhere)");

int main(int argc, char** argv) {
  lspo::runtime::UsePassiveOpenMpWaits(argc, argv);
  lspo::runtime::UseOneMallocArena();
  absl::SetProgramUsageMessage(
      "LSP-Offload scheduler service. Usage: lsp_scheduler --listen=... --worker=... "
      "--optimizer=...");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  lspo::runtime::ServerOptions server;
  server.listen = absl::GetFlag(FLAGS_listen);
  server.security = lspo::runtime::ServerSecurityFromFlags();
  // Refuse an unsafe listen address before any persisted job is resumed.
  if (const absl::Status st = lspo::runtime::CheckServerSecurity(server); !st.ok()) {
    LOG(ERROR) << "lsp_scheduler: " << st.message();
    return 1;
  }
  // Worker and optimizer calls carry --auth_token_file and verify TLS with --tls_ca.
  const lspo::runtime::ChannelSecurity peers = lspo::runtime::ChannelSecurityFromFlags();
  auto wch = lspo::runtime::MakeChannel(absl::GetFlag(FLAGS_worker), peers, 64 << 20);
  auto och = lspo::runtime::MakeChannel(absl::GetFlag(FLAGS_optimizer), peers, 64 << 20);
  for (const auto* ch : {&wch, &och}) {
    if (!ch->ok()) {
      LOG(ERROR) << "lsp_scheduler: " << ch->status().message();
      return 1;
    }
  }
  auto worker = lspo::v1::Worker::NewStub(*wch);
  auto optimizer = lspo::v1::Optimizer::NewStub(*och);
  lspo::scheduler::SchedulerOptions opts;
  opts.runs_root = absl::GetFlag(FLAGS_runs_root);
  opts.rpc_deadline_seconds = absl::GetFlag(FLAGS_rpc_deadline_seconds);
  opts.state_dir = absl::GetFlag(FLAGS_state_dir);
  opts.allowed_roots = absl::GetFlag(FLAGS_allowed_roots);
  opts.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  if (opts.max_restarts < 0) {
    LOG(ERROR) << "lsp_scheduler: --max_restarts " << opts.max_restarts << " must be >= 0";
    return 2;
  }
  auto core = lspo::scheduler::SchedulerCore::Create(worker.get(), optimizer.get(), opts);
  if (!core.ok()) {
    LOG(ERROR) << "lsp_scheduler: --state_dir: " << core.status();
    return 1;
  }
  lspo::scheduler::SchedulerService service(core->get());
  server.services = {{lspo::v1::Scheduler::service_full_name(), &service}};
  return lspo::runtime::ServeMain(
      server, "lsp_scheduler",
      absl::StrCat("(worker ", absl::GetFlag(FLAGS_worker), ", optimizer ",
                   absl::GetFlag(FLAGS_optimizer), ")"));
}
