// The lspctl binary against an in-process fake Scheduler served by runtime/grpc_server:
// --help, health (open without the token), metrics, token flags, cancel of a finished job.
#include <sys/stat.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/prometheus.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/scheduler.pb.h"
#include "proto/worker.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "runtime/grpc_server.h"

namespace lspo {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// ListJobs/GetJob answer from `jobs`; CancelJob counts its calls and answers RUNNING.
class FakeScheduler : public v1::Scheduler::Service {
 public:
  v1::ListJobsReply jobs;

  int cancels() {
    absl::MutexLock lock(&mu_);
    return cancels_;
  }
  // The spec of the last SubmitJob (answered with job id "sub-1").
  v1::JobSpec submitted() {
    absl::MutexLock lock(&mu_);
    return submitted_;
  }

 private:
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                        v1::ListJobsReply* reply) override {
    *reply = jobs;
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req,
                      v1::JobStatus* out) override {
    for (const v1::JobStatus& s : jobs.jobs()) {
      if (s.job_id() == req->job_id()) {
        *out = s;
        return grpc::Status::OK;
      }
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job");
  }
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest*,
                         v1::CancelJobReply* out) override {
    absl::MutexLock lock(&mu_);
    ++cancels_;
    out->set_state(v1::RUNNING);
    return grpc::Status::OK;
  }

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* req,
                         v1::SubmitJobReply* out) override {
    absl::MutexLock lock(&mu_);
    submitted_ = req->spec();
    out->set_job_id("sub-1");
    return grpc::Status::OK;
  }

  absl::Mutex mu_;
  int cancels_ ABSL_GUARDED_BY(mu_) = 0;
  v1::JobSpec submitted_ ABSL_GUARDED_BY(mu_);
};

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr.
};

// Runs the lspctl binary with `args` (and `env`, "NAME=value " assignments put before it).
Result Lspctl(const std::string& args, const std::string& env = "") {
  Result r;
  const std::string cmd = absl::StrCat(env, LSPO_LSPCTL_BIN, " ", args, " 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

class LspctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::JobStatus* done = fake_.jobs.add_jobs();
    done->set_job_id("done-1");
    done->mutable_spec()->set_name("finished \"job\"");
    done->set_state(v1::SUCCEEDED);
    done->set_step(3);
    done->set_total_steps(3);
    v1::JobStatus* running = fake_.jobs.add_jobs();
    running->set_job_id("run-2");
    running->set_state(v1::RUNNING);
  }

  // Serves the fake on 127.0.0.1:0 (with `token_file` unless empty); returns "--scheduler=...".
  std::string Serve(const std::string& token_file = "") {
    runtime::ServerOptions options;
    options.services = {{v1::Scheduler::service_full_name(), &fake_}};
    options.security.auth_token_file = token_file;
    auto server = runtime::StartGrpcServer(options);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "--scheduler=127.0.0.1:1";
    server_ = std::move(*server);
    return absl::StrCat("--scheduler=127.0.0.1:", server_->port());
  }

  FakeScheduler fake_;
  std::unique_ptr<runtime::GrpcServer> server_;
};

TEST_F(LspctlTest, HelpExitsZeroWithUsage) {
  for (const char* help : {"--help", "-h", "help", "list --help"}) {
    const Result r = Lspctl(help);
    EXPECT_EQ(r.exit_code, 0) << help << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("lspctl health")) << help;
    EXPECT_THAT(r.output, HasSubstr("lspctl metrics")) << help;
  }
  EXPECT_EQ(Lspctl("").exit_code, 2);
  EXPECT_EQ(Lspctl("frobnicate").exit_code, 2);
}

// lspctl convert: a missing flag is a usage error (2, naming both flags); a missing file is a
// failure (1) naming --model.
TEST_F(LspctlTest, ConvertUsageErrorsExitTwo) {
  EXPECT_THAT(Lspctl("--help").output, HasSubstr("lspctl convert --model=FILE.gguf"));
  for (const char* args : {"convert", "convert --model=m.gguf", "convert --output_dir=/tmp/x"}) {
    const Result r = Lspctl(args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("--model=FILE.gguf and --output_dir=DIR")) << args;
  }
  const Result r = Lspctl("convert --model=/no/such/model.gguf --output_dir=/tmp/lspo-never");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--model '/no/such/model.gguf' does not exist"));
}

TEST_F(LspctlTest, HealthIsZeroWhenServingAndOneOtherwise) {
  const std::string flag = Serve();
  Result r = Lspctl("health " + flag);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(": SERVING"));
  r = Lspctl("health lspo.v1.Scheduler " + flag);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Lspctl("health lspo.v1.Worker " + flag);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const std::string port = flag.substr(flag.rfind(':') + 1);
  // --address names any service's address (--scheduler then plays no part).
  r = Lspctl("health --scheduler=127.0.0.1:1 --address=127.0.0.1:" + port);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr(": SERVING"));
  server_.reset();  // Nothing listens there any more.
  r = Lspctl("health --timeout_seconds=2 --scheduler=127.0.0.1:" + port);
  EXPECT_EQ(r.exit_code, 1) << r.output;
}

TEST_F(LspctlTest, MetricsPrintsThePrometheusText) {
  const Result r = Lspctl("metrics " + Serve());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, client::JobsToPrometheus(fake_.jobs));
}

TEST_F(LspctlTest, TokenFlagAndOpenHealth) {
  std::string dir = testing::TempDir() + "/lspctl_test.XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string token = dir + "/token";
  std::ofstream(token) << "lspctl-test-token-0123456789\n";
  chmod(token.c_str(), 0600);
  const std::string flag = Serve(token);
  Result r = Lspctl("health " + flag);  // No token needed.
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = Lspctl("list " + flag);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("auth_token_file"));
  r = Lspctl("list --auth_token_file=" + token + " " + flag);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("done-1"));
  chmod(token.c_str(), 0644);
  r = Lspctl("list --auth_token_file=" + token + " " + flag);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("chmod 600"));
  std::remove(token.c_str());
  rmdir(dir.c_str());
}

TEST_F(LspctlTest, CancelOfAFinishedJobSaysSoAndFails) {
  const std::string flag = Serve();
  Result r = Lspctl("cancel done-1 " + flag);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("already finished (SUCCEEDED)"));
  EXPECT_EQ(fake_.cancels(), 0);
  r = Lspctl("cancel run-2 " + flag);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("cancel requested"));
  EXPECT_EQ(fake_.cancels(), 1);
  r = Lspctl("cancel nope " + flag);
  EXPECT_EQ(r.exit_code, 1) << r.output;
}

// --mode overrides the spec's mode whatever its case or MODE_ prefix; galore-offload is its
// own mode (MODE_GALORE_OFFLOAD); the spec's settings of another mode are dropped with a note
// (they would be refused with the new mode); a word that is no mode is refused, listing them.
TEST_F(LspctlTest, ModeFlagOverridesTheSpec) {
  const std::string flag = Serve();
  const std::string spec = ::testing::TempDir() + "/lspctl-mode.yaml";
  std::ofstream(spec) << "name: m\nmode: galore\nmodel: {format: tiny-random}\n"
                         "data: {format: text, train_path: x.txt}\n"
                         "galore: {rank: 4}\nlora: {r: 2}\nsteps: 1\n";
  struct Case {
    std::string arg;
    v1::TrainingMode mode;
    bool offload, galore_kept;
  };
  for (const Case& c :
       {Case{"GALORE", v1::MODE_GALORE, false, true},
        Case{"galore-offload", v1::MODE_GALORE_OFFLOAD, false, true},
        Case{"Galore_Offload", v1::MODE_GALORE_OFFLOAD, false, true},
        Case{"MODE_LSP", v1::MODE_LSP, false, false}, Case{"zero", v1::MODE_ZERO, false, false}}) {
    const Result r = Lspctl(absl::StrCat("submit --spec=", spec, " --mode=", c.arg, " ", flag));
    EXPECT_EQ(r.exit_code, 0) << c.arg << ": " << r.output;
    const v1::JobSpec got = fake_.submitted();
    EXPECT_EQ(got.mode(), c.mode) << c.arg;
    EXPECT_EQ(got.galore().offload(), c.offload) << c.arg;
    EXPECT_EQ(got.galore().rank(), c.galore_kept ? 4 : 0) << c.arg;
    EXPECT_EQ(got.lora().r(), 0) << c.arg << ": another mode's lora settings were kept";
    EXPECT_THAT(r.output, HasSubstr("the spec's lora settings are not used")) << c.arg;
  }
  const Result bad = Lspctl(absl::StrCat("submit --spec=", spec, " --mode=fast ", flag));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_THAT(bad.output,
              HasSubstr("--mode=fast is not a mode: use lsp, zero, native, lora, galore or "
                        "galore-offload"));
}

// `lspctl plan` on a CUDA budget says what the worker chooses for an unset
// activation_checkpointing (issue 42): on where only it makes the job fit, nothing otherwise.
TEST(LspctlPlanTest, SaysWhenTheWorkerWouldTurnOnActivationCheckpointing) {
  const std::string dir = ::testing::TempDir() + "/lspctl-plan-1b";
  std::filesystem::create_directories(dir);
  // The ~1.1B Llama shape (TinyLlama's): 22 layers, hidden 2048, intermediate 5632.
  std::ofstream(dir + "/config.json")
      << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 2048,
             "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
             "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048,
             "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false})";
  const std::string spec = ::testing::TempDir() + "/lspctl-plan.yaml";
  auto write = [&](const std::string& extra) {
    std::ofstream(spec) << "name: p\nmode: lsp\nmodel: {path: " << dir << "}\n"
                        << "data: {format: text, train_path: x.txt}\n"
                        << "lsp: {d: 256, r: 8}\nmicro_batch_size: 4\nseq_len: 512\n"
                        << "steps: 1\n" << extra;
  };
  // Without checkpointing the plan needs ~13 GiB, with it ~5: a 8 GiB cap sits between.
  write("device_memory_limit_mb: 8192\n");
  Result r = Lspctl(absl::StrCat("plan --spec=", spec, " --device=cuda --device_memory_gb=80"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the worker would choose: activation checkpointing: on"))
      << r.output;
  // Explicitly off, or a cap the job fits anyway: no choice.
  write("device_memory_limit_mb: 8192\nactivation_checkpointing: false\n");
  r = Lspctl(absl::StrCat("plan --spec=", spec, " --device=cuda --device_memory_gb=80"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("the worker would choose"))) << r.output;
  write("");
  r = Lspctl(absl::StrCat("plan --spec=", spec, " --device=cuda --device_memory_gb=80"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("the worker would choose"))) << r.output;
  // The MiB / GiB spellings: device_memory_limit_mib in the spec, --device_memory_gib (which
  // must agree with --device_memory_gb when both are given).
  write("device_memory_limit_mib: 8192\n");
  r = Lspctl(absl::StrCat("plan --spec=", spec, " --device=cuda --device_memory_gib=80"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the worker would choose: activation checkpointing: on"))
      << r.output;
  r = Lspctl(absl::StrCat("plan --spec=", spec,
                          " --device=cuda --device_memory_gib=80 --device_memory_gb=40"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("disagree")) << r.output;
  // micro_batch_size unset: the largest power of two that fits the 8 GiB cap is chosen too.
  std::ofstream(spec) << "name: p\nmode: lsp\nmodel: {path: " << dir << "}\n"
                      << "data: {format: text, train_path: x.txt}\n"
                      << "lsp: {d: 256, r: 8}\nseq_len: 512\nsteps: 1\n"
                      << "device_memory_limit_mb: 8192\n";
  r = Lspctl(absl::StrCat("plan --spec=", spec, " --device=cuda --device_memory_gb=80"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("the worker would choose: micro_batch_size: ")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("whose lsp plan fits")) << r.output;
  // A spec a run would refuse gets no plan, with the run's message and exit status (2); the
  // data file (absent here) is not looked for.
  r = Lspctl(absl::StrCat("plan --spec=", spec, " --device=cuda warmup_ratio=1.5"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("optim.warmup_ratio = 1.5 is invalid")) << r.output;
  EXPECT_THAT(r.output, Not(HasSubstr("memory plan"))) << r.output;
  r = Lspctl(absl::StrCat("plan --spec=", spec, " --device=cuda max_steps=0"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("run at least 1 step")) << r.output;
}

// lspctl spec: the spec as read (aliases resolved, overrides applied, defaults not filled in)
// as JSON with proto names and short enum names; a bad spec is exit status 2 with its error.
TEST(LspctlSpecTest, PrintsTheSpecAsReadOrItsError) {
  const std::string spec = ::testing::TempDir() + "/lspctl-spec.yaml";
  std::ofstream(spec) << "mode: lsp\nlearning_rate: 0.001\nmax_steps: 4\n";
  Result r = Lspctl(absl::StrCat("spec --spec=", spec, " bf16=true lora.target_modules=q_proj,v_proj"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output);
  EXPECT_EQ(j["mode"], "lsp");
  EXPECT_EQ(j["optim"]["lr"], 0.001);
  EXPECT_EQ(j["steps"], 4);
  EXPECT_EQ(j["weight_dtype"], "bf16");
  EXPECT_EQ(j["lora"]["target_modules"], nlohmann::json({"q_proj", "v_proj"}));
  EXPECT_FALSE(j.contains("seq_len"));  // defaults are the scheduler's to fill in
  r = Lspctl(absl::StrCat("spec --spec=", spec, " stepz=3"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("'stepz' names no field (did you mean steps")) << r.output;
}

// generate and eval take a model id from the local Hugging Face cache (HF_HUB_CACHE), as a
// job's model.path does; an id the cache lacks is refused naming the cache and the fix.
TEST(LspctlModelIdTest, GenerateAndEvalReadAModelIdFromTheHfCache) {
  namespace fs = std::filesystem;
  const fs::path cache = fs::path(::testing::TempDir()) / "lspctl_hf_cache";
  fs::remove_all(cache);
  const fs::path snapshot = cache / "models--tiny-org--llama-job" / "snapshots" / "c0ffee";
  fs::create_directories(snapshot);
  for (const auto& e : fs::directory_iterator("tests/oracle/data/hf_models/llama-job")) {
    fs::create_symlink(fs::absolute(e.path()), snapshot / e.path().filename());
  }
  const std::string env = absl::StrCat("HF_HUB_CACHE=", cache.string(), " ");
  auto run = [&](const std::string& args) { return Lspctl(args, env); };
  Result gen = run("generate --model=tiny-org/llama-job --prompt=Call --max_new_tokens=3");
  EXPECT_EQ(gen.exit_code, 0) << gen.output;
  EXPECT_THAT(gen.output, HasSubstr("[3 tokens")) << gen.output;
  Result eval = run("eval --model=tiny-org/llama-job --data=datasets/moby-dick/moby-dick.txt "
                    "--seq_len=16 --max_examples=2");
  EXPECT_EQ(eval.exit_code, 0) << eval.output;
  Result absent = run("generate --model=tiny-org/absent --prompt=Call --max_new_tokens=3");
  EXPECT_NE(absent.exit_code, 0);
  EXPECT_THAT(absent.output, HasSubstr("--model: model 'tiny-org/absent' is not in the Hugging "
                                       "Face cache " + cache.string()))
      << absent.output;
}

// Ctrl-C during `lspctl run` (embedded): the first SIGINT cancels the job through the
// scheduler, so lspctl exits 1 after the job ends CANCELLED, with the run's report.html
// written and the output folder named; the job stopped long before its 100000 steps.
TEST(LspctlRunTest, InterruptCancelsTheJobAndKeepsItsReport) {
  if (!std::ifstream("models/SmolLM2-135M-Instruct.Q4_1.gguf").good()) {
    GTEST_SKIP() << "models/SmolLM2-135M-Instruct.Q4_1.gguf is absent (scripts/setup)";
  }
  const std::string bin = LSPO_LSPCTL_BIN;  // a string expression under Bazel
  char dir_template[] = "/tmp/lspctl-interrupt-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template, log = dir + "/lspctl.out", out = dir + "/run";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    if (f == nullptr || dup2(fileno(stdout), 2) < 0) _exit(99);
    const std::string spec = "--spec=examples/tiny-moby-dick.yaml";
    const std::string out_flag = "--output_dir=" + out;
    execl(bin.c_str(), bin.c_str(), "run", spec.c_str(), out_flag.c_str(),
          "--steps=100000", static_cast<char*>(nullptr));
    _exit(98);
  }
  // Wait until training runs: a step line in metrics.jsonl.
  bool training = false;
  for (int i = 0; i < 6000 && !training; ++i) {
    std::ifstream in(out + "/metrics.jsonl");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    training = text.find("\"kind\":\"step\"") != std::string::npos;
    if (!training) usleep(20 * 1000);
  }
  ASSERT_TRUE(training) << "no step within 120 s";
  ASSERT_EQ(kill(pid, SIGINT), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "lspctl died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 1);
  std::ifstream in(log);
  const std::string output((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(output, HasSubstr("cancelling job"));
  EXPECT_THAT(output, HasSubstr("CANCELLED"));
  EXPECT_THAT(output, HasSubstr("output: " + out + " (report.html"));
  std::ifstream report_in(out + "/report.html");
  const std::string report((std::istreambuf_iterator<char>(report_in)),
                           std::istreambuf_iterator<char>());
  EXPECT_THAT(report, HasSubstr("cancelled"));
}

}  // namespace
}  // namespace lspo
