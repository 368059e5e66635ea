// Embedded mode end to end: the three services in one process (in-process gRPC), a tiny
// randomly initialised Llama (seeded) trained on Moby-Dick blocks in lsp mode; plus the
// bad-input cases that must fail clearly without crashing.
#include <filesystem>
#include <fstream>
#include <set>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "client/embedded.h"
#include "cpu_optimizer_service/optimizer_core.h"
#include "gpu_worker/worker_core.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "offload/arena_tensors.h"
#include "offload/job_assets.h"
#include "offload/state_file.h"
#include "runtime/rpc_status.h"
#include "runtime/shm_arena.h"
#include "spec/job_spec.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

using testing_jobs::SubmitAndWatch;
using testing_jobs::WatchResult;

TEST(EmbeddedTest, TinyLlamaLspTrainsOnMobyDickAndReportsEveryStep) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string out_dir = testing_jobs::TempDir("embedded-lsp");
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(out_dir, v1::MODE_LSP, 20);
  WatchResult w = SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  // Every step 1..20 was reported by the status stream, each with its loss.
  std::map<int, double> loss;
  for (const auto& u : w.updates) {
    if (u.has_last_step()) loss[u.last_step().step()] = u.last_step().loss();
  }
  ASSERT_EQ(loss.size(), 20u);
  EXPECT_EQ(loss.begin()->first, 1);
  EXPECT_EQ(loss.rbegin()->first, 20);
  double first = 0, last = 0;
  for (int s = 1; s <= 5; ++s) first += loss[s] / 5;
  for (int s = 16; s <= 20; ++s) last += loss[s] / 5;
  EXPECT_LT(last, first - 0.05) << "loss did not decrease: first-5 mean " << first
                                << ", last-5 mean " << last;
  // A random 49152-vocabulary model starts near ln(49152) = 10.80.
  EXPECT_NEAR(loss[1], std::log(49152.0), 0.3);
  // Outputs: metrics.jsonl with one line per step, summary.json, checkpoint files.
  std::ifstream metrics(out_dir + "/metrics.jsonl");
  int step_lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    step_lines += j["kind"] == "step";
  }
  EXPECT_EQ(step_lines, 20);
  std::ifstream sfile(out_dir + "/summary.json");
  ASSERT_TRUE(sfile.good());
  auto summary = nlohmann::json::parse(sfile);
  EXPECT_EQ(summary["mode"], "lsp");
  EXPECT_EQ(summary["d"], 16);
  EXPECT_EQ(summary["steps"], 20);
  EXPECT_LT(summary["final_eval_loss"].get<double>(), summary["zero_shot_eval_loss"].get<double>());
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json"}) {
    EXPECT_TRUE(std::ifstream(out_dir + "/" + f).good()) << f;
  }
}

TEST(EmbeddedTest, StartRefusesAStateDirItCannotUse) {
  // A regular file where the state directory should be: Start names it and starts nothing.
  const std::string dir = testing_jobs::TempDir("embedded-state");
  const std::string file = dir + "/not-a-dir";
  { std::ofstream(file) << "x"; }
  scheduler::SchedulerOptions options;
  options.state_dir = file;
  auto runtime = client::EmbeddedRuntime::Start(options);
  ASSERT_FALSE(runtime.ok());
  EXPECT_EQ(runtime.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(runtime.status().message().find(file), std::string::npos) << runtime.status();
  std::filesystem::remove_all(dir);
}

TEST(OptimizerCoreTest, AnArenaOfAnotherModeIsRefusedBeforeAnythingIsAttached) {
  // The worker built a zero-mode arena, the spec given to the optimizer says lsp.
  optimizer::OptimizerCore core;
  v1::JobSpec spec;
  spec.set_mode(v1::MODE_LSP);
  v1::ArenaLayout layout;
  layout.set_name("/lspo-not-created");
  layout.set_mode(v1::MODE_ZERO);
  auto st = core.LoadJob("job-x", spec, layout);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("MODE_ZERO"), std::string::npos) << st.status();
  EXPECT_NE(st.status().message().find("MODE_LSP"), std::string::npos) << st.status();
}

// A scheduler that dies between sending the optimizer its Update of step N and the worker its
// TrainStep N leaves that Update waiting for gradients that never come, holding the core. The
// restarted scheduler's UnloadJob must abandon it at once, not after its timeout (here 120 s;
// MultiProcessTest.SchedulerKilledMidJobResumesAfterRestart met it as a 300 s stall).
TEST(OptimizerCoreTest, UnloadAbandonsAnUpdateWaitingForGradients) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("unload-wait"),
                                                    v1::MODE_ZERO, 2);
  spec::ResolveDefaults(&spec);
  worker::WorkerCore worker;
  auto wload = worker.LoadJob("job-w", spec);
  ASSERT_TRUE(wload.ok()) << wload.status();
  optimizer::OptimizerCore core;
  ASSERT_TRUE(core.LoadJob("job-w", spec, wload->arena()).ok());
  v1::UpdateRequest req;
  req.set_job_id("job-w");
  req.set_step(1);
  req.set_lr(1e-3);
  req.set_wait_for_grads(true);
  req.set_wait_timeout_seconds(120);
  req.add_tasks()->set_index(0);
  absl::StatusOr<v1::UpdateReply> reply;
  std::thread update([&] { reply = core.Update(req); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // Update is waiting now.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(core.UnloadJob("job-w").ok());
  update.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 30.0) << "UnloadJob waited for the Update's timeout";
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->aborted());
  // The core takes the job again (the restarted scheduler's LoadJob).
  EXPECT_TRUE(core.LoadJob("job-w", spec, wload->arena()).ok());
  EXPECT_TRUE(worker.UnloadJob("job-w").ok());
}

// Issue 42: a spec that leaves micro_batch_size unset keeps it unset through ResolveDefaults
// (unless it names the CPU or is data parallel), and a worker on the CPU runs 8 (the old
// default), choosing nothing; the reply says which it runs.
TEST(WorkerCoreTest, AnUnsetMicroBatchIsEightOnTheCpu) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  v1::JobSpec spec =
      testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("micro-unset"), v1::MODE_LSP, 1);
  spec.clear_micro_batch_size();
  spec.clear_device();
  spec::ResolveDefaults(&spec);
  EXPECT_FALSE(spec.has_micro_batch_size());
  v1::JobSpec on_cpu = spec;
  on_cpu.set_device(v1::DEVICE_CPU);
  on_cpu.clear_micro_batch_size();
  spec::ResolveDefaults(&on_cpu);
  EXPECT_EQ(on_cpu.micro_batch_size(), 8);
  v1::JobSpec ranks = spec;
  ranks.mutable_distributed()->set_world_size(2);
  spec::ResolveDefaults(&ranks);
  EXPECT_EQ(ranks.micro_batch_size(), 8);
  worker::WorkerCore worker;
  auto load = worker.LoadJob("job-m", spec);
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(load->micro_batch_size(), 8);
  EXPECT_EQ(load->chosen_settings_size(), 0);
  EXPECT_TRUE(worker.UnloadJob("job-m").ok());
}

// Zero mode under the overlap schedule (issue 43): the optimizer updates each matrix as its
// gradient arrives, but keeps the step only on the worker's verdict. Step 1: two matrices'
// gradients arrive and are updated, then the worker abandons the step (a non-finite gradient
// elsewhere, or loss): the master weights, moments and step counters are bitwise those of
// before (undo records). Step 2, with the verdict: the step is kept.
TEST(OptimizerCoreTest, AZeroUpdateIsKeptOnlyOnTheWorkersVerdict) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  v1::JobSpec spec =
      testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("zero-verdict"), v1::MODE_ZERO, 2);
  spec.mutable_optim()->set_weight_decay(0.1);
  spec::ResolveDefaults(&spec);
  worker::WorkerCore worker;
  auto wload = worker.LoadJob("job-z", spec);
  ASSERT_TRUE(wload.ok()) << wload.status();
  const v1::ArenaLayout& layout = wload->arena();
  optimizer::OptimizerCore core;
  ASSERT_TRUE(core.LoadJob("job-z", spec, layout).ok());
  auto arena = runtime::ShmArena::Attach(layout.name(), layout.bytes());
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto flags = offload::ArenaFlags(*arena, layout);
  ASSERT_TRUE(flags.ok()) << flags.status();
  const int last = layout.linears_size() - 1;
  auto publish = [&](uint32_t step) {
    for (int i : {last, last - 1}) {
      auto g = offload::ArenaBf16(*arena, layout.linears(i).full_grad());
      ASSERT_TRUE(g.ok()) << g.status();
      g->copy_(at::linspace(-0.5, 0.7, g->numel()).reshape(g->sizes()));
      flags->PublishGrad(i, step);
    }
  };
  auto request = [&](int step) {
    v1::UpdateRequest req;
    req.set_job_id("job-z");
    req.set_step(step);
    req.set_lr(1e-2);
    req.set_wait_for_grads(true);
    req.set_wait_timeout_seconds(30);
    req.add_tasks()->set_index(last);
    req.add_tasks()->set_index(last - 1);
    return req;
  };
  auto state = [&](const std::string& tag) {
    const std::string dir = testing_jobs::TempDir(tag);
    EXPECT_TRUE(core.SaveState("job-z", dir, 0).ok());
    std::ifstream in(dir + "/optimizer_state.safetensors", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string before = state("zero-verdict-before");
  ASSERT_GT(before.size(), 1000u);
  publish(1);
  absl::StatusOr<v1::UpdateReply> reply;
  std::thread update([&] { reply = core.Update(request(1)); });
  // Both matrices are updated (their step flags published), then Update waits for the verdict.
  ASSERT_TRUE(flags->WaitStep(last - 1, 1, absl::Seconds(30)).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  flags->Abort(1);
  update.join();
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->aborted());
  EXPECT_TRUE(state("zero-verdict-aborted") == before)
      << "an abandoned zero step changed the optimizer state";
  publish(2);
  flags->PublishVerdict(2);
  reply = core.Update(request(2));
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_FALSE(reply->aborted());
  const std::string dir = testing_jobs::TempDir("zero-verdict-kept");
  ASSERT_TRUE(core.SaveState("job-z", dir, 0).ok());
  auto file = model::SafetensorsFile::Open(dir + "/optimizer_state.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  for (int i : {last, last - 1}) {
    auto step = offload::ReadStateTensor(*file, "state", layout.linears(i).name() + ".adam_step",
                                         at::kLong, {});
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(step->item<int64_t>(), 1) << layout.linears(i).name();
  }
  auto untouched = offload::ReadStateTensor(*file, "state", layout.linears(0).name() + ".adam_step",
                                            at::kLong, {});
  ASSERT_TRUE(untouched.ok()) << untouched.status();
  EXPECT_EQ(untouched->item<int64_t>(), 0);
  EXPECT_TRUE(core.UnloadJob("job-z").ok());
  EXPECT_TRUE(worker.UnloadJob("job-z").ok());
}

// An lsp Update that fails part-way (here: matrix n-2's gradient never comes, a 1 s timeout)
// leaves no trace of the step in the optimizer's state: matrix n-1, updated before the
// failure, is rolled back (Adam step 0, sum of steps zero, as SaveState writes them), as for
// an abandoned step.
TEST(OptimizerCoreTest, AnUpdateThatFailsPartWayRollsBackTheMatricesItUpdated) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  v1::JobSpec spec =
      testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("update-fail"), v1::MODE_LSP, 2);
  spec.mutable_optim()->set_weight_decay(0.1);
  spec::ResolveDefaults(&spec);
  worker::WorkerCore worker;
  auto wload = worker.LoadJob("job-f", spec);
  ASSERT_TRUE(wload.ok()) << wload.status();
  const v1::ArenaLayout& layout = wload->arena();
  optimizer::OptimizerCore core;
  ASSERT_TRUE(core.LoadJob("job-f", spec, layout).ok());
  // Attached before FitProjectors, which unlinks the arena's name.
  auto arena = runtime::ShmArena::Attach(layout.name(), layout.bytes());
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto fit = worker.FitProjectors("job-f", 0);
  ASSERT_TRUE(fit.ok()) << fit.status();
  ASSERT_TRUE(core.SetProjectors("job-f", {fit->refitted().begin(), fit->refitted().end()}).ok());
  const int last = layout.linears_size() - 1;
  auto s = offload::ArenaF32(*arena, layout.linears(last).grad());
  ASSERT_TRUE(s.ok()) << s.status();
  s->fill_(0.01f);
  auto flags = offload::ArenaFlags(*arena, layout);
  ASSERT_TRUE(flags.ok()) << flags.status();
  flags->PublishGrad(last, 1);
  v1::UpdateRequest req;
  req.set_job_id("job-f");
  req.set_step(1);
  req.set_lr(1e-3);
  req.set_wait_for_grads(true);
  req.set_wait_timeout_seconds(1);
  req.add_tasks()->set_index(last);
  req.add_tasks()->set_index(last - 1);  // never published
  auto reply = core.Update(req);
  ASSERT_FALSE(reply.ok());
  EXPECT_EQ(reply.status().code(), absl::StatusCode::kDeadlineExceeded) << reply.status();
  const std::string dir = testing_jobs::TempDir("update-fail-state");
  ASSERT_TRUE(core.SaveState("job-f", dir, 0).ok());
  auto file = model::SafetensorsFile::Open(dir + "/optimizer_state.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const std::string name = layout.linears(last).name();
  auto adam_step = offload::ReadStateTensor(*file, "state", name + ".adam_step", at::kLong, {});
  ASSERT_TRUE(adam_step.ok()) << adam_step.status();
  EXPECT_EQ(adam_step->item<int64_t>(), 0);
  auto sum_d = offload::ReadStateTensor(*file, "state", name + ".sum_d", at::kFloat,
                                        {layout.linears(last).d_p(), layout.linears(last).d_q()});
  ASSERT_TRUE(sum_d.ok()) << sum_d.status();
  EXPECT_EQ(sum_d->abs().max().item<float>(), 0.0f);
  auto scale = offload::ReadStateTensor(*file, "state", name + ".master_scale", at::kDouble, {});
  ASSERT_TRUE(scale.ok()) << scale.status();
  EXPECT_EQ(scale->item<double>(), 1.0);
  EXPECT_TRUE(core.UnloadJob("job-f").ok());
  EXPECT_TRUE(worker.UnloadJob("job-f").ok());
}

// The mirror case: the dead scheduler sent the worker TrainStep N (overlap: it applies the
// deep layers' updates as they arrive) but never sent the optimizer Update N. The worker's
// UnloadJob abandons the step instead of waiting for the 10-minute peer timeout.
TEST(WorkerCoreTest, UnloadAbandonsATrainStepWaitingForUpdates) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("unload-train"),
                                                    v1::MODE_ZERO, 2);
  spec::ResolveDefaults(&spec);
  worker::WorkerCore worker;
  ASSERT_TRUE(worker.LoadJob("job-t", spec).ok());
  v1::StepPlan plan;
  plan.set_overlap(true);
  plan.set_split_layer(0);  // Every layer's update is awaited before TrainStep returns.
  absl::StatusOr<v1::TrainStepReply> reply;
  std::thread train([&] { reply = worker.TrainStep("job-t", 1, 1e-3, plan); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // Past the backward.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(worker.UnloadJob("job-t").ok());
  train.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 30.0) << "UnloadJob waited for the peer timeout";
  EXPECT_FALSE(reply.ok() && !reply->nonfinite()) << "the step cannot have completed";
  EXPECT_TRUE(worker.LoadJob("job-t", spec).ok());
  EXPECT_TRUE(worker.UnloadJob("job-t").ok());
}

TEST(EmbeddedTest, NativeModeTrainsTheSameJob) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string out_dir = testing_jobs::TempDir("embedded-native");
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  WatchResult w =
      SubmitAndWatch(stub.get(), testing_jobs::TinyMobyDickSpec(out_dir, v1::MODE_NATIVE, 10));
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  ASSERT_EQ(w.last.step(), 10);
  ASSERT_GE(w.last.evals_size(), 2);
  EXPECT_LT(w.last.evals(w.last.evals_size() - 1).loss(), w.last.evals(0).loss());
}

// lsp.compression: dense forms the same S as the sparse kernels (to fp32 rounding), so the same
// job trains the same way: per-step losses agree to 1e-3 over 6 steps, and the planner names
// the dense projectors' device bytes.
TEST(EmbeddedTest, DenseCompressionTrainsLikeTheSparseKernels) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  std::map<int, double> loss[2];
  for (int dense = 0; dense < 2; ++dense) {
    v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(
        testing_jobs::TempDir(dense ? "embedded-dense" : "embedded-sparse"), v1::MODE_LSP, 6);
    spec.mutable_lsp()->set_compression(dense ? v1::COMPRESSION_DENSE : v1::COMPRESSION_SPARSE);
    WatchResult w = SubmitAndWatch(stub.get(), spec);
    ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
    loss[dense] = testing_jobs::StepLosses(w);
  }
  ASSERT_EQ(loss[0].size(), 6u);
  ASSERT_EQ(loss[1].size(), 6u);
  for (const auto& [step, l] : loss[0]) {
    EXPECT_NEAR(loss[1][step], l, 1e-3) << "step " << step;
  }
}

// A subspace d wider than a matrix's narrow side (the tiny model's k_proj is 32 x 64, d = 40)
// trains under lsp.narrow (default one_sided: P is the identity there) instead of failing;
// contradictory subspace settings are refused at submission, naming the fields.
TEST(EmbeddedTest, SubspaceWiderThanANarrowMatrixTrainsAndBadSubspaceSettingsAreRefused) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  v1::JobSpec spec =
      testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("wide-d"), v1::MODE_LSP, 2);
  spec.mutable_lsp()->set_d(40);
  WatchResult w = SubmitAndWatch(stub.get(), spec);
  EXPECT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  for (const std::string fix :
       {std::string("0.5 with lsp.d 40"), std::string("1.5"), std::string("rounding 7")}) {
    v1::JobSpec bad =
        testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("bad-ratio"), v1::MODE_LSP, 2);
    if (fix == "rounding 7") {
      bad.mutable_lsp()->set_apply_rounding(static_cast<v1::ApplyRounding>(7));
    } else {
      bad.mutable_lsp()->set_d_ratio(fix == "1.5" ? 1.5 : 0.5);
      if (fix != "1.5") bad.mutable_lsp()->set_d(40);
    }
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    *req.mutable_spec() = bad;
    v1::SubmitJobReply rep;
    grpc::Status st = stub->SubmitJob(&ctx, req, &rep);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << fix;
    EXPECT_NE(st.error_message().find(fix == "1.5"          ? "lsp.d_ratio"
                                      : fix == "rounding 7" ? "lsp.apply_rounding"
                                                            : "lsp.d"),
              std::string::npos)
        << st.error_message();
  }
  // The runtime is still usable: a good job runs after the bad one.
  WatchResult ok = SubmitAndWatch(
      stub.get(), testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("after-bad"),
                                                 v1::MODE_LSP, 2));
  EXPECT_EQ(ok.last.state(), v1::SUCCEEDED) << ok.last.error();
}

// summary.json's optimizer_state_bytes and offload_bytes_per_step, per mode, against the
// numbers of the tiny Llama (hidden 64, 2 layers; q, o 64x64, k, v 32x64, gate, up 128x64,
// down 64x128: sum m n = 73728 over the 14 matrices, every side above d = 16).
TEST(EmbeddedTest, SummaryReportsOptimizerStateAndOffloadBytesOfEveryMode) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const int64_t mn = 73728;
  struct Want {
    v1::TrainingMode mode;
    int64_t state, offload;
  };
  const Want wants[] = {
      // AdamW moments on the worker (fp32 on the CPU): 2 x 4 bytes per weight.
      {v1::MODE_NATIVE, 8 * mn, 0},
      // fp32 master + m + v on the optimizer; bf16 G down and W up.
      {v1::MODE_ZERO, 12 * mn, 4 * mn},
      // fp32 base W + summed steps, m, v (16 x 16 each); fp32 S down and D up (16 x 16 each).
      {v1::MODE_LSP, 4 * mn + 14 * 3 * 4 * 256, 14 * 2 * 4 * 256},
      // AdamW moments of the adapters, sum r (m + n) = 4 x 2048 numbers, fp32.
      {v1::MODE_LORA, 8 * 4 * 2048, 0},
      // GaLore rank 8, fp32: per matrix two moments 8 x max(m, n) and a projector
      // 8 x min(m, n); per layer sum (2 max + min) = 2 (128 + 64) + 2 (128 + 32) + 3 (256 + 64).
      {v1::MODE_GALORE, 2 * 4 * 8 * (2 * 192 + 2 * 160 + 3 * 320), 0},
  };
  for (const Want& want : wants) {
    const std::string dir = testing_jobs::TempDir("bytes");
    v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(dir, want.mode, 1);
    if (want.mode == v1::MODE_LORA) spec.mutable_lora()->set_r(4);
    if (want.mode == v1::MODE_GALORE) spec.mutable_galore()->set_rank(8);
    spec.set_skip_initial_eval(true);
    spec.set_skip_checkpoint(true);
    WatchResult w = SubmitAndWatch(stub.get(), spec);
    ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
    std::ifstream in(dir + "/summary.json");
    const nlohmann::json s = nlohmann::json::parse(in);
    SCOPED_TRACE(s["mode"].get<std::string>());
    EXPECT_EQ(s["optimizer_state_bytes"].get<int64_t>(), want.state);
    EXPECT_EQ(s["offload_bytes_per_step"].get<int64_t>(), want.offload);
  }
}

TEST(EmbeddedTest, MissingDataFileIsRejectedAtSubmit) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("missing"),
                                                    v1::MODE_LSP, 2);
  spec.mutable_data()->set_train_path("/nonexistent/train.txt");
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobReply rep;
  grpc::Status st = stub->SubmitJob(&ctx, req, &rep);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find("data.train_path"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("/nonexistent/train.txt"), std::string::npos);
}

// model.random_shape (scaling studies): the HF sizes give the published parameter counts
// (SmolLM2-135M: 134,515,008, docs/formats.md; SmolLM2-360M: 361,821,120, the HF model card's
// 362M), and a bad shape is rejected naming the field.
TEST(JobSpecTest, RandomShapeGivesTheRequestedLlamaConfig) {
  v1::LlamaShape s135;
  s135.set_hidden_size(576);
  s135.set_intermediate_size(1536);
  s135.set_num_hidden_layers(30);
  s135.set_num_attention_heads(9);
  s135.set_num_key_value_heads(3);
  auto c135 = offload::RandomLlamaConfig(s135, 49152);
  ASSERT_TRUE(c135.ok()) << c135.status();
  EXPECT_EQ(c135->head_dim, 64);
  EXPECT_EQ(c135->NumParameters(), 134515008);
  v1::LlamaShape s360;
  s360.set_hidden_size(960);
  s360.set_intermediate_size(2560);
  s360.set_num_hidden_layers(32);
  s360.set_num_attention_heads(15);
  s360.set_num_key_value_heads(5);
  auto c360 = offload::RandomLlamaConfig(s360, 49152);
  ASSERT_TRUE(c360.ok()) << c360.status();
  EXPECT_EQ(c360->NumParameters(), 361821120);
  // Unset = the tiny test config.
  auto tiny = offload::RandomLlamaConfig(v1::LlamaShape(), 300);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->hidden_size, 64);
  s360.set_num_key_value_heads(4);  // does not divide 15 heads
  auto bad = offload::RandomLlamaConfig(s360, 49152);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("model.random_shape"), std::string::npos)
      << bad.status();
}

// Every job spec in examples/ (the README's, the baselines', the data issue's) loads,
// resolves and validates as the scheduler would take it: an example the spec changes left
// behind fails here, not in a user's first run.
TEST(JobSpecTest, EveryExampleSpecLoadsAndValidates) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator("examples")) {
    if (entry.path().extension() != ".yaml") continue;
    const std::string path = entry.path().string();
    absl::StatusOr<v1::JobSpec> spec = spec::LoadJobSpecFile(path);
    ASSERT_TRUE(spec.ok()) << path << ": " << spec.status();
    spec::ResolveDefaults(&*spec);
    EXPECT_TRUE(spec::ValidateJobSpec(*spec).ok())
        << path << ": " << spec::ValidateJobSpec(*spec);
    ++checked;
  }
  EXPECT_GE(checked, 5) << "examples/*.yaml not found: run from the repository root";
}

TEST(JobSpecTest, YamlAndJsonGiveTheSameSpecAndBadFieldsAreNamed) {
  auto y = spec::ParseJobSpecYaml(
      "name: t\nmode: MODE_LSP\nsteps: 7\nlsp:\n  d: 64\n  r: 8\noptim:\n  lr: 2.5e-4\n"
      "data:\n  train_path: a.tsv\n");
  ASSERT_TRUE(y.ok()) << y.status();
  auto j = spec::ParseJobSpecJson(
      R"({"name":"t","mode":"MODE_LSP","steps":7,"lsp":{"d":64,"r":8},"optim":{"lr":0.00025},)"
      R"("data":{"trainPath":"a.tsv"}})");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(y->SerializeAsString(), j->SerializeAsString());
  EXPECT_EQ(y->lsp().d(), 64);
  EXPECT_DOUBLE_EQ(y->optim().lr(), 2.5e-4);
  auto short_mode = spec::ParseJobSpecYaml("mode: native\nsteps: 1\n");
  ASSERT_TRUE(short_mode.ok()) << short_mode.status();
  EXPECT_EQ(short_mode->mode(), v1::MODE_NATIVE);
  auto bad_mode = spec::ParseJobSpecYaml("mode: adam\n");
  EXPECT_EQ(bad_mode.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = spec::ParseJobSpecYaml("stepz: 3\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("stepz"), std::string::npos) << bad.status();
  // A number past the double range is an error naming it and its line, not the default.
  auto huge = spec::ParseJobSpecYaml("steps: 3\noptim:\n  lr: 1e400\n", "h.yaml");
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(huge.status().message().find("the number 1e400 is outside the range of a double"),
            std::string::npos)
      << huge.status();
  EXPECT_NE(huge.status().message().find("line 3"), std::string::npos) << huge.status();
  auto negative = spec::ParseJobSpecYaml("lsp:\n  d_ratio: -2e999\n");
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument) << negative.status();
  v1::JobSpec spec = *y;
  spec::ResolveDefaults(&spec);
  spec.mutable_lsp()->set_r(100);
  auto st = spec::ValidateJobSpec(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  // The GPU fields: a kernel set or device that does not exist is named with the fix.
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  v1::JobSpec gpu = testing_jobs::TinyMobyDickSpec("/tmp/lspo-spec-check", v1::MODE_LSP, 2);
  spec::ResolveDefaults(&gpu);
  gpu.mutable_lsp()->set_kernels(v1::CUDA_KERNELS_CUSTOM);
  gpu.set_device(v1::DEVICE_CUDA);
  ASSERT_TRUE(spec::ValidateJobSpec(gpu).ok()) << spec::ValidateJobSpec(gpu);
  auto kernels = spec::ParseJobSpecYaml("lsp:\n  kernels: cusparse\n", "k.yaml");
  EXPECT_EQ(kernels.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(kernels.status().message().find("lsp.kernels"), std::string::npos)
      << kernels.status();
  EXPECT_NE(kernels.status().message().find("custom"), std::string::npos) << kernels.status();
  auto compression = spec::ParseJobSpecYaml("lsp:\n  compression: blocked\n", "c.yaml");
  EXPECT_EQ(compression.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(compression.status().message().find("lsp.compression"), std::string::npos)
      << compression.status();
  EXPECT_NE(compression.status().message().find("dense"), std::string::npos)
      << compression.status();
  auto device = spec::ParseJobSpecYaml("device: tpu\n", "d.yaml");
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find("device = 'tpu'"), std::string::npos)
      << device.status();
  // A value outside the set that arrives as a number (a peer's binary message) is named too.
  gpu.set_device(static_cast<v1::Device>(7));
  st = spec::ValidateJobSpec(gpu);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("device"), std::string::npos) << st;
}

// model.format unset: a directory is an HF folder, a file a GGUF; a forced hf format on a
// file, or a folder without config.json, is refused naming model.path and the fix.
TEST(JobSpecTest, ModelFormatIsDetectedFromThePath) {
  v1::JobSpec spec;
  spec.mutable_model()->set_path("tests/oracle/data/hf_models/qwen2-bf16");
  spec.mutable_data()->set_train_path("datasets/sms-spam/train.tsv");
  spec.set_steps(1);
  v1::JobSpec folder = spec;
  spec::ResolveDefaults(&folder);
  EXPECT_EQ(folder.model().format(), v1::MODEL_FORMAT_HF);
  EXPECT_EQ(folder.model().tokenizer_path(), folder.model().path());
  EXPECT_TRUE(spec::ValidateJobSpec(folder).ok()) << spec::ValidateJobSpec(folder);
  v1::JobSpec file = spec;
  file.mutable_model()->set_path("tests/oracle/data/hf_models/qwen2-bf16/config.json");
  spec::ResolveDefaults(&file);
  EXPECT_EQ(file.model().format(), v1::MODEL_FORMAT_GGUF);
  file.mutable_model()->set_format(v1::MODEL_FORMAT_HF);
  absl::Status st = spec::ValidateJobSpec(file);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("model.path"), std::string::npos) << st;
  EXPECT_NE(st.message().find("not a directory"), std::string::npos) << st;
  v1::JobSpec no_config = folder;
  no_config.mutable_model()->set_path("tests/oracle/data/hf_models");
  st = spec::ValidateJobSpec(no_config);
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound) << st;
  EXPECT_NE(st.message().find("config.json"), std::string::npos) << st;
}

TEST(JobSpecTest, ClosedSetsReadTheirShortNamesAndTheFullNames) {
  // Today's strings (every example spec uses them) and the enum names give the same spec.
  auto short_names = spec::ParseJobSpecYaml(
      "device: cpu\nschedule: serial\nweight_dtype: bf16\nmodel:\n  format: tiny-random\n"
      "data:\n  format: text\nlsp:\n  master_refresh: never\n  kernels: aten\n"
      "  compression: dense\noptim:\n  schedule: cosine\n", "short.yaml");
  ASSERT_TRUE(short_names.ok()) << short_names.status();
  auto full_names = spec::ParseJobSpecJson(
      R"({"device":"DEVICE_CPU","schedule":"STEP_SCHEDULE_SERIAL",)"
      R"("weight_dtype":"WEIGHT_DTYPE_BF16","model":{"format":"MODEL_FORMAT_TINY_RANDOM"},)"
      R"("data":{"format":"DATA_FORMAT_TEXT"},)"
      R"("lsp":{"master_refresh":"MASTER_REFRESH_NEVER","kernels":"CUDA_KERNELS_ATEN",)"
      R"("compression":"COMPRESSION_DENSE"},)"
      R"("optim":{"schedule":"LR_SCHEDULE_COSINE"}})", "full.json");
  ASSERT_TRUE(full_names.ok()) << full_names.status();
  EXPECT_EQ(short_names->SerializeAsString(), full_names->SerializeAsString());
  EXPECT_EQ(short_names->device(), v1::DEVICE_CPU);
  EXPECT_EQ(short_names->schedule(), v1::STEP_SCHEDULE_SERIAL);
  EXPECT_EQ(short_names->weight_dtype(), v1::WEIGHT_DTYPE_BF16);
  EXPECT_EQ(short_names->model().format(), v1::MODEL_FORMAT_TINY_RANDOM);
  EXPECT_EQ(short_names->data().format(), v1::DATA_FORMAT_TEXT);
  EXPECT_EQ(short_names->lsp().master_refresh(), v1::MASTER_REFRESH_NEVER);
  EXPECT_EQ(short_names->lsp().kernels(), v1::CUDA_KERNELS_ATEN);
  EXPECT_EQ(short_names->lsp().compression(), v1::COMPRESSION_DENSE);
  EXPECT_EQ(short_names->optim().schedule(), v1::LR_SCHEDULE_COSINE);
  // An empty string is the unset value, as an empty string field was.
  auto empty = spec::ParseJobSpecYaml("device: \"\"\nlsp:\n  kernels: \"\"\n", "e.yaml");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->device(), v1::DEVICE_UNSPECIFIED);
  // Written back with the short names, which read back to the same spec.
  const std::string json = spec::JobSpecToJson(*short_names);
  EXPECT_NE(json.find("\"tiny-random\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"serial\""), std::string::npos) << json;
  EXPECT_EQ(json.find("STEP_SCHEDULE"), std::string::npos) << json;
  auto back = spec::ParseJobSpecJson(json, "back.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), short_names->SerializeAsString());
  // The error for a value outside a set lists the set.
  auto bad = spec::ParseJobSpecYaml("schedule: parallel\n", "s.yaml");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("schedule = 'parallel' is not one of overlap, serial"),
            std::string::npos)
      << bad.status();
}

TEST(JobSpecTest, AFingerprintWrittenWithStringFieldsStillMatches) {
  // A checkpoint's trainer_state.json written before the closed sets were enums: strings in
  // the old field order. The same training must still be recognised, a different one not.
  const std::string old_fingerprint =
      R"({"model":{"path":"m.gguf","format":"gguf","init_seed":"5","tokenizer_path":"m.gguf"},)"
      R"("data":{"train_path":"t.tsv","format":"classification","question":"Q?"},)"
      R"("mode":"MODE_LSP","lsp":{"d":8,"r":2,"alpha":0.8,"fit_iters":40,"fit_lr":0.05,)"
      R"("calibration_examples":64,"master_refresh":"refit"},"optim":{"lr":0.0001,)"
      R"("beta1":0.9,"beta2":0.999,"eps":1e-08,"schedule":"constant"},)"
      R"("micro_batch_size":8,"grad_accum":1,"seq_len":128,"seed":"5","weight_dtype":"fp32"})";
  v1::JobSpec spec;
  spec.mutable_model()->set_path("m.gguf");
  spec.mutable_model()->set_format(v1::MODEL_FORMAT_GGUF);
  spec.mutable_model()->set_init_seed(5);
  spec.mutable_model()->set_tokenizer_path("m.gguf");
  spec.mutable_data()->set_train_path("t.tsv");
  spec.mutable_data()->set_format(v1::DATA_FORMAT_CLASSIFICATION);
  spec.mutable_data()->set_question("Q?");
  spec.set_mode(v1::MODE_LSP);
  auto* lsp = spec.mutable_lsp();
  lsp->set_d(8);
  lsp->set_r(2);
  lsp->set_alpha(0.8);
  lsp->set_fit_iters(40);
  lsp->set_fit_lr(0.05);
  lsp->set_calibration_examples(64);
  lsp->set_master_refresh(v1::MASTER_REFRESH_REFIT);
  auto* optim = spec.mutable_optim();
  optim->set_lr(1e-4);
  optim->set_beta1(0.9);
  optim->set_beta2(0.999);
  optim->set_eps(1e-8);
  optim->set_schedule(v1::LR_SCHEDULE_CONSTANT);
  spec.set_micro_batch_size(8);
  spec.set_grad_accum(1);
  spec.set_seq_len(128);
  spec.set_seed(5);
  spec.set_weight_dtype(v1::WEIGHT_DTYPE_FP32);
  spec.set_steps(60);                                // Not part of the training.
  spec.set_schedule(v1::STEP_SCHEDULE_OVERLAP);      // Not part of it either.
  EXPECT_TRUE(spec::SameTraining(old_fingerprint, spec));
  // Nor activation checkpointing, explicit (present since the field is optional) or not.
  spec.set_activation_checkpointing(false);
  EXPECT_TRUE(spec::SameTraining(old_fingerprint, spec));
  spec.set_activation_checkpointing(true);
  EXPECT_TRUE(spec::SameTraining(old_fingerprint, spec));
  spec.clear_activation_checkpointing();
  EXPECT_TRUE(spec::SameTraining(spec::TrainingFingerprint(spec), spec));
  // lsp.narrow and lsp.apply_rounding written out at their defaults are the same training as
  // the fingerprint from before they existed; another value is not.
  lsp->set_narrow(v1::NARROW_RULE_ONE_SIDED);
  lsp->set_apply_rounding(v1::APPLY_ROUNDING_COMPENSATED);
  EXPECT_TRUE(spec::SameTraining(old_fingerprint, spec));
  lsp->set_narrow(v1::NARROW_RULE_FULL);
  EXPECT_FALSE(spec::SameTraining(old_fingerprint, spec));
  lsp->set_narrow(v1::NARROW_RULE_ONE_SIDED);
  lsp->set_apply_rounding(v1::APPLY_ROUNDING_NEAREST);
  EXPECT_FALSE(spec::SameTraining(old_fingerprint, spec));
  lsp->set_apply_rounding(v1::APPLY_ROUNDING_UNSPECIFIED);
  // lsp.compression: sparse is the default written out; dense rounds S differently.
  lsp->set_compression(v1::COMPRESSION_SPARSE);
  EXPECT_TRUE(spec::SameTraining(old_fingerprint, spec));
  lsp->set_compression(v1::COMPRESSION_DENSE);
  EXPECT_FALSE(spec::SameTraining(old_fingerprint, spec));
  lsp->set_compression(v1::COMPRESSION_UNSPECIFIED);
  spec.mutable_optim()->set_schedule(v1::LR_SCHEDULE_COSINE);
  EXPECT_FALSE(spec::SameTraining(old_fingerprint, spec));
  EXPECT_EQ(spec::TrainingDifferences(old_fingerprint, spec),
            "modified: optim.schedule: LR_SCHEDULE_CONSTANT -> LR_SCHEDULE_COSINE");
  EXPECT_FALSE(spec::SameTraining("not json", spec));
  EXPECT_EQ(spec::TrainingDifferences("not json", spec), "the fingerprint cannot be read");
  spec.mutable_optim()->set_schedule(v1::LR_SCHEDULE_CONSTANT);

  // A data-parallel job resumed on other ports, another bind address, with ranks swapped, a
  // device memory cap or one rank written as world size 1 is the same training; another world
  // size is not (the batch changes).
  spec.set_device_memory_limit_mb(4096);
  spec.mutable_distributed()->set_world_size(1);
  EXPECT_TRUE(spec::SameTraining(old_fingerprint, spec));
  auto* dist = spec.mutable_distributed();
  dist->set_world_size(2);
  dist->set_rank(1);
  dist->set_rendezvous("10.0.0.1:29500");
  dist->set_bind_address("10.0.0.2");
  dist->set_timeout_seconds(30);
  const std::string two_ranks = spec::TrainingFingerprint(spec);
  dist->set_rank(0);
  dist->set_rendezvous("127.0.0.1:29511");
  dist->clear_bind_address();
  dist->set_timeout_seconds(600);
  EXPECT_TRUE(spec::SameTraining(two_ranks, spec));
  EXPECT_FALSE(spec::SameTraining(old_fingerprint, spec));
  dist->set_world_size(4);
  EXPECT_FALSE(spec::SameTraining(two_ranks, spec));
  EXPECT_EQ(spec::TrainingDifferences(two_ranks, spec),
            "modified: distributed.world_size: 2 -> 4");
}

}  // namespace
}  // namespace lspo
