// The three services as separate processes on loopback (as the systemd units start them),
// a job submitted over gRPC, watched to completion; then the optimizer is killed and a new
// job fails with a clear "optimizer ... unavailable" error instead of hanging.
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/lsp_offload.grpc.pb.h"
#include "tests/integration/test_jobs.h"

extern char** environ;

namespace lspo {
namespace {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class Process {
 public:
  Process(const std::string& binary, const std::vector<std::string>& args) {
    std::vector<char*> argv;
    std::vector<std::string> all = {binary};
    all.insert(all.end(), args.begin(), args.end());
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, binary.c_str(), nullptr, nullptr, argv.data(), environ), 0)
        << binary;
  }
  ~Process() { Kill(SIGTERM); }
  void Kill(int sig) {
    if (pid_ > 0) {
      kill(pid_, sig);
      int status;
      waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

 private:
  pid_t pid_ = -1;
};

bool WaitReady(const std::string& addr) {
  auto ch = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  return ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30));
}

v1::JobStatus RunJob(v1::Scheduler::Stub* stub, const v1::JobSpec& spec, int* steps_seen) {
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobReply rep;
  EXPECT_TRUE(stub->SubmitJob(&ctx, req, &rep).ok());
  grpc::ClientContext wctx;
  v1::WatchJobRequest wreq;
  wreq.set_job_id(rep.job_id());
  wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
  auto reader = stub->WatchJob(&wctx, wreq);
  v1::JobStatus s, last;
  std::map<int, double> steps;
  while (reader->Read(&s)) {
    if (s.has_last_step()) steps[s.last_step().step()] = s.last_step().loss();
    last = s;
  }
  reader->Finish();
  if (steps_seen) *steps_seen = steps.size();
  if (steps.size() >= 10) {
    double first = 0, end = 0;
    for (int k = 1; k <= 5; ++k) first += steps[k];
    for (int k = static_cast<int>(steps.size()) - 4; k <= static_cast<int>(steps.size()); ++k) {
      end += steps[k];
    }
    EXPECT_LT(end, first) << "loss did not decrease across the run";
  }
  return last;
}

TEST(MultiProcessTest, ThreeServicesOnLoopbackTrainAJobAndSurviveADeadPeer) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string w = "127.0.0.1:" + std::to_string(FreePort());
  const std::string o = "127.0.0.1:" + std::to_string(FreePort());
  const std::string s = "127.0.0.1:" + std::to_string(FreePort());
  Process worker(LSPO_WORKER_BIN, {"--listen=" + w});
  Process optimizer(LSPO_OPTIMIZER_BIN, {"--listen=" + o});
  Process scheduler(LSPO_SCHEDULER_BIN, {"--listen=" + s, "--worker=" + w, "--optimizer=" + o,
                                         "--rpc_deadline_seconds=120"});
  ASSERT_TRUE(WaitReady(w) && WaitReady(o) && WaitReady(s));
  auto stub = v1::Scheduler::NewStub(grpc::CreateChannel(s, grpc::InsecureChannelCredentials()));
  int steps_seen = 0;
  v1::JobStatus fin = RunJob(
      stub.get(),
      testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("mp"), v1::MODE_LSP, 20),
      &steps_seen);
  ASSERT_EQ(fin.state(), v1::SUCCEEDED) << fin.error();
  EXPECT_EQ(steps_seen, 20);
  // No shared-memory segment of this job is left behind (arena names are /lspo-<job id>-*).
  int leftovers = 0;
  const std::string cmd = "ls /dev/shm | grep -c '^lspo-" + fin.job_id() + "-' || true";
  if (FILE* p = popen(cmd.c_str(), "r")) {
    fscanf(p, "%d", &leftovers);
    pclose(p);
  }
  EXPECT_EQ(leftovers, 0);

  optimizer.Kill(SIGKILL);
  v1::JobStatus dead = RunJob(
      stub.get(),
      testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("mp-dead"), v1::MODE_LSP, 3),
      nullptr);
  EXPECT_EQ(dead.state(), v1::FAILED);
  EXPECT_NE(dead.error().find("optimizer"), std::string::npos) << dead.error();
}

// kill -9 of the optimizer in the middle of an overlapped job: the worker, waiting for that
// step's updates, is released at once (AbortStep) and the job fails with a clear reason within
// seconds instead of a timeout; no shared-memory segment is left behind.
TEST(MultiProcessTest, OptimizerKilledMidStepFailsTheJobPromptly) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  for (v1::TrainingMode mode : {v1::MODE_LSP, v1::MODE_ZERO}) {
    const std::string w = "127.0.0.1:" + std::to_string(FreePort());
    const std::string o = "127.0.0.1:" + std::to_string(FreePort());
    const std::string s = "127.0.0.1:" + std::to_string(FreePort());
    Process worker(LSPO_WORKER_BIN, {"--listen=" + w});
    Process optimizer(LSPO_OPTIMIZER_BIN, {"--listen=" + o});
    Process scheduler(LSPO_SCHEDULER_BIN, {"--listen=" + s, "--worker=" + w,
                                           "--optimizer=" + o, "--rpc_deadline_seconds=300"});
    ASSERT_TRUE(WaitReady(w) && WaitReady(o) && WaitReady(s));
    auto stub =
        v1::Scheduler::NewStub(grpc::CreateChannel(s, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    *req.mutable_spec() =
        testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("mp-kill"), mode, 100000);
    req.mutable_spec()->set_schedule("overlap");
    v1::SubmitJobReply rep;
    ASSERT_TRUE(stub->SubmitJob(&ctx, req, &rep).ok());
    grpc::ClientContext wctx;
    v1::WatchJobRequest wreq;
    wreq.set_job_id(rep.job_id());
    wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
    auto reader = stub->WatchJob(&wctx, wreq);
    v1::JobStatus st, last;
    std::chrono::steady_clock::time_point killed_at;
    bool killed = false;
    while (reader->Read(&st)) {
      last = st;
      if (!killed && st.step() >= 5) {
        optimizer.Kill(SIGKILL);
        killed = true;
        killed_at = std::chrono::steady_clock::now();
      }
    }
    reader->Finish();
    ASSERT_TRUE(killed);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
    EXPECT_EQ(last.state(), v1::FAILED) << v1::TrainingMode_Name(mode);
    EXPECT_NE(last.error().find("optimizer"), std::string::npos) << last.error();
    EXPECT_LT(secs, 60.0) << "the job took " << secs << " s to fail after the optimizer died";
    int leftovers = 0;
    const std::string cmd = "ls /dev/shm | grep -c '^lspo-" + last.job_id() + "-' || true";
    if (FILE* p = popen(cmd.c_str(), "r")) {
      fscanf(p, "%d", &leftovers);
      pclose(p);
    }
    EXPECT_EQ(leftovers, 0);
  }
}

}  // namespace
}  // namespace lspo
