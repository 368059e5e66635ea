// The three services as separate processes on loopback (as the systemd units start them),
// a job submitted over gRPC, watched to completion; then the optimizer is killed and a new
// job fails with a clear "optimizer ... unavailable" error instead of hanging.
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/job_spec.pb.h"
#include "proto/scheduler.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "tests/free_port.h"
#include "tests/integration/test_jobs.h"

extern char** environ;

namespace lspo {
namespace {

using tests::FreePort;

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
  void Signal(int sig) {
    if (pid_ > 0) kill(pid_, sig);
  }
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

int ShmLeftovers(const std::string& job_id) {
  int leftovers = 0;
  const std::string cmd = "ls /dev/shm | grep -c '^lspo-" + job_id + "-' || true";
  if (FILE* p = popen(cmd.c_str(), "r")) {
    if (fscanf(p, "%d", &leftovers) != 1) leftovers = -1;
    pclose(p);
  }
  return leftovers;
}

// The three services on free loopback ports, as the systemd units start them.
struct Services {
  std::string w = "127.0.0.1:" + std::to_string(FreePort());
  std::string o = "127.0.0.1:" + std::to_string(FreePort());
  std::string s = "127.0.0.1:" + std::to_string(FreePort());
  Process worker{LSPO_WORKER_BIN, {"--listen=" + w}};
  Process optimizer{LSPO_OPTIMIZER_BIN, {"--listen=" + o}};
  Process scheduler;
  explicit Services(double deadline_seconds)
      : scheduler(LSPO_SCHEDULER_BIN,
                  {"--listen=" + s, "--worker=" + w, "--optimizer=" + o,
                   "--rpc_deadline_seconds=" + std::to_string(deadline_seconds)}) {}
  bool Ready() { return WaitReady(w) && WaitReady(o) && WaitReady(s); }
};

struct ActResult {
  v1::JobStatus last;
  bool acted = false;
  double seconds_after = 0;  // From `act` to the end of the watch (the job's final state).
};

// Submits `spec` to `scheduler_addr`, watches it, calls `act` once when the job has completed
// `at_step` steps, and returns the final status.
ActResult SubmitAndActAt(const std::string& scheduler_addr, const v1::JobSpec& spec,
                         int at_step, const std::function<void()>& act) {
  ActResult out;
  auto stub = v1::Scheduler::NewStub(
      grpc::CreateChannel(scheduler_addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobReply rep;
  EXPECT_TRUE(stub->SubmitJob(&ctx, req, &rep).ok());
  grpc::ClientContext wctx;
  v1::WatchJobRequest wreq;
  wreq.set_job_id(rep.job_id());
  wctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(8));
  auto reader = stub->WatchJob(&wctx, wreq);
  v1::JobStatus st;
  std::chrono::steady_clock::time_point acted_at;
  while (reader->Read(&st)) {
    out.last = st;
    if (!out.acted && st.step() >= at_step) {
      act();
      out.acted = true;
      acted_at = std::chrono::steady_clock::now();
    }
  }
  reader->Finish();
  if (out.acted) {
    out.seconds_after =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - acted_at).count();
  }
  return out;
}

// kill -9 of the optimizer in the middle of an overlapped job: the worker, waiting for that
// step's updates, is released at once (AbortStep) and the job fails with a clear reason within
// seconds instead of a timeout; no shared-memory segment is left behind.
TEST(MultiProcessTest, OptimizerKilledMidStepFailsTheJobPromptly) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  for (v1::TrainingMode mode : {v1::MODE_LSP, v1::MODE_ZERO}) {
    Services svc(300);
    ASSERT_TRUE(svc.Ready());
    v1::JobSpec spec =
        testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("mp-kill"), mode, 100000);
    spec.set_schedule(v1::STEP_SCHEDULE_OVERLAP);
    ActResult r = SubmitAndActAt(svc.s, spec, 5, [&] { svc.optimizer.Kill(SIGKILL); });
    ASSERT_TRUE(r.acted);
    EXPECT_EQ(r.last.state(), v1::FAILED) << v1::TrainingMode_Name(mode);
    EXPECT_NE(r.last.error().find("optimizer"), std::string::npos) << r.last.error();
    EXPECT_LT(r.seconds_after, 60.0)
        << "the job took " << r.seconds_after << " s to fail after the optimizer died";
    EXPECT_EQ(ShmLeftovers(r.last.job_id()), 0);
  }
}

// kill -9 of the worker mid-step: the job fails within seconds naming the worker, and its
// arena (which only the worker could remove) is removed by the scheduler.
TEST(MultiProcessTest, WorkerKilledMidStepFailsTheJobAndLeavesNoSegment) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  Services svc(300);
  ASSERT_TRUE(svc.Ready());
  ActResult r = SubmitAndActAt(
      svc.s, testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("mp-wkill"), v1::MODE_LSP, 100000),
      3, [&] { svc.worker.Kill(SIGKILL); });
  ASSERT_TRUE(r.acted);
  EXPECT_EQ(r.last.state(), v1::FAILED);
  EXPECT_NE(r.last.error().find("worker"), std::string::npos) << r.last.error();
  EXPECT_LT(r.seconds_after, 60.0)
      << "the job took " << r.seconds_after << " s to fail after the worker died";
  EXPECT_EQ(ShmLeftovers(r.last.job_id()), 0);
}

// A data-parallel job of two ranks, each rank the three services as separate processes (as
// two hosts would run them): kill -9 of rank 1's worker, then (a new job) of rank 1's
// optimizer, mid-training. Both ranks' jobs fail within the 20 s collective timeout plus the
// time to notice, rank 0's error naming the ranks; no process hangs and no shared-memory
// segment of either rank is left behind.
TEST(MultiProcessTest, ARankKilledMidStepFailsEveryRankPromptlyNamingTheRanks) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  for (const bool kill_worker : {true, false}) {
    SCOPED_TRACE(kill_worker ? "rank 1's worker killed" : "rank 1's optimizer killed");
    Services rank0(300), rank1(300);
    ASSERT_TRUE(rank0.Ready() && rank1.Ready());
    const std::string at = "127.0.0.1:" + std::to_string(FreePort());
    std::vector<v1::JobSpec> specs;
    for (int r = 0; r < 2; ++r) {
      v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(
          testing_jobs::TempDir("mp-dp" + std::to_string(r)), v1::MODE_LSP, 100000);
      spec.set_micro_batch_size(2);
      spec.mutable_distributed()->set_world_size(2);
      spec.mutable_distributed()->set_rank(r);
      spec.mutable_distributed()->set_rendezvous(at);
      spec.mutable_distributed()->set_timeout_seconds(20);
      specs.push_back(spec);
    }
    std::chrono::steady_clock::time_point killed_at;
    std::atomic<bool> killed{false};
    ActResult r0, r1;
    std::thread t0([&] {
      r0 = SubmitAndActAt(rank0.s, specs[0], 1 << 30, [] {});
    });
    r1 = SubmitAndActAt(rank1.s, specs[1], 3, [&] {
      killed_at = std::chrono::steady_clock::now();
      killed = true;
      if (kill_worker) {
        rank1.worker.Kill(SIGKILL);
      } else {
        rank1.optimizer.Kill(SIGKILL);
      }
    });
    t0.join();
    ASSERT_TRUE(r1.acted && killed);
    const double rank0_after =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
    std::printf("%s: rank 1 failed %.2f s after the kill: %s\nrank 0 failed %.2f s after: %s\n",
                kill_worker ? "worker killed" : "optimizer killed", r1.seconds_after,
                r1.last.error().c_str(), rank0_after, r0.last.error().c_str());
    EXPECT_EQ(r1.last.state(), v1::FAILED);
    EXPECT_EQ(r0.last.state(), v1::FAILED);
    EXPECT_NE(r0.last.error().find("distributed: "), std::string::npos) << r0.last.error();
    EXPECT_NE(r0.last.error().find("on rank 0 of 2 failed"), std::string::npos)
        << r0.last.error();
    EXPECT_NE(r0.last.error().find("1 = "), std::string::npos) << r0.last.error();
    EXPECT_LT(r1.seconds_after, 60.0) << "rank 1 took " << r1.seconds_after << " s to fail";
    EXPECT_LT(rank0_after, 60.0) << "rank 0 took " << rank0_after << " s to fail";
    EXPECT_EQ(ShmLeftovers(r0.last.job_id()), 0);
    EXPECT_EQ(ShmLeftovers(r1.last.job_id()), 0);
  }
}

// Two ranks whose spec is the same text but whose files differ (a relative data.train_path
// read from each rank's own working directory, as on two hosts with different copies): the
// ranks compare checksums of what they loaded and both refuse, naming the rank and the field.
TEST(MultiProcessTest, RanksThatLoadedDifferentDataAreRefusedNamingTheFile) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  std::string text;
  {
    std::FILE* f = std::fopen(testing_jobs::MobyDickPath().c_str(), "r");
    ASSERT_NE(f, nullptr);
    char buf[20000];
    text.assign(buf, std::fread(buf, 1, sizeof(buf), f));
    std::fclose(f);
  }
  const std::string spec_path = testing_jobs::TempDir("mp-data-spec") + "/job.yaml";
  {
    std::FILE* f = std::fopen(spec_path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f,
                 "name: dp-data\nmode: MODE_NATIVE\nsteps: 3\nmicro_batch_size: 2\n"
                 "seq_len: 32\nseed: 7\nnum_threads: 1\ndevice: cpu\n"
                 "model: {format: tiny-random, tokenizer_path: %s/%s, init_seed: 1234}\n"
                 "data: {format: text, train_path: train.txt, max_blocks: 16}\n"
                 "optim: {lr: 0.003}\n"
                 "distributed: {world_size: 2, rendezvous: '127.0.0.1:%d', timeout_seconds: 20}\n",
                 cwd, testing_jobs::kModel, FreePort());
    std::fclose(f);
  }
  std::vector<std::string> dirs, out(2);
  std::vector<int> rc(2, -1);
  for (int r = 0; r < 2; ++r) {
    dirs.push_back(testing_jobs::TempDir("mp-data-rank" + std::to_string(r)));
    std::FILE* f = std::fopen((dirs[r] + "/train.txt").c_str(), "w");
    ASSERT_NE(f, nullptr);
    const std::string mine = r == 0 ? text : "Another first line.\n" + text;
    std::fwrite(mine.data(), 1, mine.size(), f);
    std::fclose(f);
  }
  auto run = [&](int r) {
    const std::string cmd = "cd " + dirs[r] + " && " + LSPO_LSPCTL_BIN + " run --spec=" +
                            spec_path + " --rank=" + std::to_string(r) + " --output_dir=out 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out[r].append(buf, n);
    const int status = pclose(p);
    rc[r] = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  std::thread rank1(run, 1);
  run(0);
  rank1.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(rc[r], 1) << "rank " << r << ": " << out[r];
    EXPECT_NE(out[r].find("distributed: rank 1 ("), std::string::npos) << out[r];
    EXPECT_NE(out[r].find("loaded other tokenized training data than rank 0 ("),
              std::string::npos)
        << out[r];
    EXPECT_NE(out[r].find("from data.train_path 'train.txt'"), std::string::npos) << out[r];
    // The progress line names the rank.
    EXPECT_NE(out[r].find("] step 0/3 rank " + std::to_string(r) + "/2 | "), std::string::npos)
        << out[r];
  }
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

// Heartbeats: a worker frozen mid-step (SIGSTOP: its sockets stay open, so no connection
// reset tells the scheduler) is detected by the channel's keepalive pings and the job fails
// naming the worker well before the 600 s RPC deadline.
TEST(MultiProcessTest, FrozenWorkerIsDetectedByHeartbeatsNotTheDeadline) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  Services svc(600);
  ASSERT_TRUE(svc.Ready());
  ActResult r = SubmitAndActAt(
      svc.s, testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("mp-freeze"), v1::MODE_LSP, 100000),
      3, [&] { svc.worker.Signal(SIGSTOP); });
  svc.worker.Signal(SIGCONT);
  ASSERT_TRUE(r.acted);
  EXPECT_EQ(r.last.state(), v1::FAILED);
  EXPECT_NE(r.last.error().find("worker"), std::string::npos) << r.last.error();
  // Two keepalive periods (10 s + 10 s) to notice, plus the 60 s unload attempt on the frozen
  // worker: far below the 600 s deadline a call would otherwise wait.
  EXPECT_LT(r.seconds_after, 150.0)
      << "the job took " << r.seconds_after << " s to fail after the worker froze";
  std::printf("frozen worker detected, job FAILED after %.1f s\n", r.seconds_after);
}

// "As deployed": the three binaries started with the flags of deploy/systemd (loopback,
// --state_dir, --allowed_roots, --runs_root), a job spec file submitted with `lspctl submit
// --watch`, which exits 0 when the job succeeds; a spec reaching outside the allowed roots is
// refused by lspctl with the field named.
TEST(MultiProcessTest, AsDeployedLspctlSubmitWatchesAJobToCompletion) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  const std::string repo(cwd);
  const std::string var = testing_jobs::TempDir("var-lib-lsp-offload");
  const std::string w = "127.0.0.1:" + std::to_string(FreePort());
  const std::string o = "127.0.0.1:" + std::to_string(FreePort());
  const std::string s = "127.0.0.1:" + std::to_string(FreePort());
  char shared[4096];
  ASSERT_NE(realpath((repo + "/datasets").c_str(), shared), nullptr);
  const std::string roots = var + "," + repo + "/models," + shared;
  // One bearer token for the three services and lspctl, mode 0600, as
  // deploy/systemd/lsp-offload-token.service writes it; the scheduler sends it to its peers.
  const std::string token_file = var + "/auth_token";
  std::ofstream(token_file) << "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n";
  ASSERT_EQ(chmod(token_file.c_str(), 0600), 0);
  const std::string auth = "--auth_token_file=" + token_file;
  Process worker(LSPO_WORKER_BIN, {"--listen=" + w, "--allowed_roots=" + roots, auth});
  Process optimizer(LSPO_OPTIMIZER_BIN, {"--listen=" + o, "--allowed_roots=" + roots, auth});
  Process scheduler(LSPO_SCHEDULER_BIN,
                    {"--listen=" + s, "--worker=" + w, "--optimizer=" + o,
                     "--runs_root=" + var + "/runs", "--state_dir=" + var + "/state",
                     "--allowed_roots=" + roots, auth});
  ASSERT_TRUE(WaitReady(w) && WaitReady(o) && WaitReady(s));
  const std::string spec_path = var + "/job.yaml";
  {
    std::FILE* f = std::fopen(spec_path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f,
                 "name: as-deployed\nmode: MODE_LSP\nsteps: 3\nmicro_batch_size: 4\n"
                 "seq_len: 32\nseed: 7\nnum_threads: 2\ncheckpoint_every: 2\n"
                 "model: {format: tiny-random, tokenizer_path: %s/%s, init_seed: 1234}\n"
                 "data: {format: text, train_path: %s/moby-dick/moby-dick.txt, max_blocks: 64}\n"
                 "lsp: {d: 16, r: 4, fit_iters: 5, calibration_examples: 8}\n"
                 "optim: {lr: 0.01}\n",
                 repo.c_str(), testing_jobs::kModel, shared);
    std::fclose(f);
  }
  auto run = [&](const std::string& args, std::string* out) {
    const std::string cmd = std::string(LSPO_LSPCTL_BIN) + " " + args + " 2>&1";
    out->clear();
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return -1;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
    const int rc = pclose(p);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  };
  std::string out;
  EXPECT_EQ(run("submit --spec=" + spec_path + " --watch --scheduler=" + s + " " + auth, &out), 0)
      << out;
  EXPECT_NE(out.find("SUCCEEDED"), std::string::npos) << out;
  EXPECT_NE(out.find("last checkpoint: step 3"), std::string::npos) << out;
  // The scheduler lists it (persisted in --state_dir).
  std::string ls;
  EXPECT_EQ(run("list --scheduler=" + s + " " + auth, &ls), 0) << ls;
  EXPECT_NE(ls.find("SUCCEEDED"), std::string::npos) << ls;
  EXPECT_NE(ls.find("3/3"), std::string::npos) << ls;
  // Without the token neither the scheduler nor a peer answers (a call straight to the
  // worker's port is refused before its method is looked up).
  for (const std::string& addr : {s, w, o}) {
    EXPECT_NE(run("list --scheduler=" + addr, &ls), 0) << addr << ": " << ls;
    EXPECT_NE(ls.find("authorization: Bearer"), std::string::npos) << addr << ": " << ls;
  }
  // Outside the allowed roots: refused at submit, naming the field.
  const std::string bad_path = var + "/bad.yaml";
  {
    std::FILE* f = std::fopen(bad_path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fprintf(f,
                 "name: escape\nsteps: 1\noutput_dir: /tmp/lspo-not-allowed\n"
                 "model: {format: tiny-random, tokenizer_path: %s/%s}\n"
                 "data: {format: text, train_path: %s/moby-dick/moby-dick.txt}\n",
                 repo.c_str(), testing_jobs::kModel, shared);
    std::fclose(f);
  }
  EXPECT_NE(run("submit --spec=" + bad_path + " --scheduler=" + s + " " + auth, &out), 0) << out;
  EXPECT_NE(out.find("output_dir"), std::string::npos) << out;
  EXPECT_NE(out.find("allowed roots"), std::string::npos) << out;
}

}  // namespace
}  // namespace lspo
