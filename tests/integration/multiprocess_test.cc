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
#include <memory>
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

int ShmLeftovers(const std::string& job_id) {
  int leftovers = 0;
  const std::string cmd = "ls /dev/shm | grep -c '^lspo-" + job_id + "-' || true";
  if (FILE* p = popen(cmd.c_str(), "r")) {
    if (fscanf(p, "%d", &leftovers) != 1) leftovers = -1;
    pclose(p);
  }
  return leftovers;
}

// kill -9 of the worker mid-step: the job fails within seconds naming the worker, and its
// arena (which only the worker could remove) is removed by the scheduler.
TEST(MultiProcessTest, WorkerKilledMidStepFailsTheJobAndLeavesNoSegment) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string w = "127.0.0.1:" + std::to_string(FreePort());
  const std::string o = "127.0.0.1:" + std::to_string(FreePort());
  const std::string s = "127.0.0.1:" + std::to_string(FreePort());
  Process worker(LSPO_WORKER_BIN, {"--listen=" + w});
  Process optimizer(LSPO_OPTIMIZER_BIN, {"--listen=" + o});
  Process scheduler(LSPO_SCHEDULER_BIN, {"--listen=" + s, "--worker=" + w, "--optimizer=" + o,
                                         "--rpc_deadline_seconds=300"});
  ASSERT_TRUE(WaitReady(w) && WaitReady(o) && WaitReady(s));
  auto stub = v1::Scheduler::NewStub(grpc::CreateChannel(s, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() =
      testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("mp-wkill"), v1::MODE_LSP, 100000);
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
    if (!killed && st.step() >= 3) {
      worker.Kill(SIGKILL);
      killed = true;
      killed_at = std::chrono::steady_clock::now();
    }
  }
  reader->Finish();
  ASSERT_TRUE(killed);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_EQ(last.state(), v1::FAILED);
  EXPECT_NE(last.error().find("worker"), std::string::npos) << last.error();
  EXPECT_LT(secs, 60.0) << "the job took " << secs << " s to fail after the worker died";
  EXPECT_EQ(ShmLeftovers(last.job_id()), 0);
}

// kill -9 of the scheduler mid-job: restarted with the same --state_dir it resumes the job
// from its newest checkpoint (the worker and optimizer kept running) and completes it; no
// completed checkpoint is lost and no segment is left behind.
TEST(MultiProcessTest, SchedulerKilledMidJobResumesAfterRestart) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string w = "127.0.0.1:" + std::to_string(FreePort());
  const std::string o = "127.0.0.1:" + std::to_string(FreePort());
  const std::string s = "127.0.0.1:" + std::to_string(FreePort());
  const std::string state_dir = testing_jobs::TempDir("mp-state");
  const std::vector<std::string> sched_args = {"--listen=" + s, "--worker=" + w,
                                               "--optimizer=" + o, "--rpc_deadline_seconds=300",
                                               "--state_dir=" + state_dir};
  Process worker(LSPO_WORKER_BIN, {"--listen=" + w});
  Process optimizer(LSPO_OPTIMIZER_BIN, {"--listen=" + o});
  auto scheduler = std::make_unique<Process>(LSPO_SCHEDULER_BIN, sched_args);
  ASSERT_TRUE(WaitReady(w) && WaitReady(o) && WaitReady(s));
  v1::JobSpec spec =
      testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("mp-skill"), v1::MODE_LSP, 12);
  spec.set_checkpoint_every(3);
  spec.set_skip_initial_eval(true);
  std::string job_id;
  int killed_at_step = 0;
  {
    auto stub =
        v1::Scheduler::NewStub(grpc::CreateChannel(s, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    v1::SubmitJobReply rep;
    ASSERT_TRUE(stub->SubmitJob(&ctx, req, &rep).ok());
    job_id = rep.job_id();
    grpc::ClientContext wctx;
    v1::WatchJobRequest wreq;
    wreq.set_job_id(job_id);
    wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
    auto reader = stub->WatchJob(&wctx, wreq);
    v1::JobStatus st;
    while (reader->Read(&st)) {
      if (st.last_checkpoint_step() >= 3 && st.step() >= 4) {
        killed_at_step = st.step();
        scheduler->Kill(SIGKILL);
        break;
      }
    }
    wctx.TryCancel();
    reader->Finish();
  }
  ASSERT_GE(killed_at_step, 4);
  scheduler = std::make_unique<Process>(LSPO_SCHEDULER_BIN, sched_args);
  ASSERT_TRUE(WaitReady(s));
  auto stub = v1::Scheduler::NewStub(grpc::CreateChannel(s, grpc::InsecureChannelCredentials()));
  grpc::ClientContext wctx;
  v1::WatchJobRequest wreq;
  wreq.set_job_id(job_id);
  wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  auto reader = stub->WatchJob(&wctx, wreq);
  v1::JobStatus st, last;
  while (reader->Read(&st)) last = st;
  ASSERT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last.state(), v1::SUCCEEDED) << last.error();
  EXPECT_EQ(last.step(), 12);
  EXPECT_EQ(last.restarts(), 1);
  EXPECT_GE(last.resumed_from_step(), 3);
  EXPECT_LE(last.resumed_from_step(), killed_at_step);
  EXPECT_EQ(last.last_checkpoint_step(), 12);
  EXPECT_EQ(ShmLeftovers(job_id), 0);
}

}  // namespace
}  // namespace lspo
