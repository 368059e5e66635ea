// The memory plan (offload/memory_plan.h) against real CPU jobs (issue 18): SmolLM2-135M (the
// GGUF of scripts/setup) on Moby-Dick blocks in embedded mode, two steps in each of lsp, zero
// and native. What is measured is this process's peak resident memory over the training steps
// (the worker resets VmHWM when the first step begins, so the loading and the projector fit are
// not in it) above the resident memory before the job was submitted; the plan's prediction is
// its CPU total (worker + optimizer + arena, all in this process). Each case runs in its own
// process (gtest_discover_tests), so one job's freed memory does not hide the next one's, with
// one malloc arena as the binaries run (runtime/process_env.h UseOneMallocArena).
#include <malloc.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_format.h"
#include "client/embedded.h"
#include "gtest/gtest.h"
#include "offload/job_assets.h"
#include "offload/memory_plan.h"
#include "offload/training_mode.h"
#include "runtime/process_env.h"
#include "spec/job_spec.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

// A /proc/self/status field ("VmRSS", "VmHWM"), bytes.
int64_t StatusBytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream fields(line.substr(key.size() + 1));
      int64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

v1::JobSpec SmolTextSpec(const std::string& out_dir, v1::TrainingMode mode) {
  v1::JobSpec spec;
  spec.set_name("memory-plan");
  spec.mutable_model()->set_path(testing_jobs::kModel);
  spec.mutable_data()->set_format(v1::DATA_FORMAT_TEXT);
  spec.mutable_data()->set_train_path(testing_jobs::MobyDickPath());
  spec.mutable_data()->set_eval_path(testing_jobs::MobyDickPath());
  spec.mutable_data()->set_max_blocks(16);
  spec.mutable_data()->set_max_eval_examples(2);
  spec.set_mode(mode);
  spec.mutable_lsp()->set_d(288);
  spec.mutable_lsp()->set_r(8);
  spec.mutable_lsp()->set_fit_iters(2);
  spec.mutable_lsp()->set_calibration_examples(2);
  spec.mutable_optim()->set_lr(1e-4);
  spec.set_steps(2);
  spec.set_micro_batch_size(4);
  spec.set_seq_len(256);
  spec.set_seed(7);
  spec.set_num_threads(2);
  spec.set_skip_initial_eval(true);
  spec.set_skip_checkpoint(true);
  spec.set_device(v1::DEVICE_CPU);
  spec.set_output_dir(out_dir);
  return spec;
}

void ExpectPeakWithinPlan(v1::TrainingMode mode) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  runtime::UseOneMallocArena();  // before the runtime's threads start
  const std::string out_dir = testing_jobs::TempDir("memory-plan");
  v1::JobSpec spec = SmolTextSpec(out_dir, mode);
  v1::JobSpec resolved = spec;
  spec::ResolveDefaults(&resolved);
  absl::StatusOr<model::LlamaConfig> config = offload::LoadJobModelConfig(resolved);
  ASSERT_TRUE(config.ok()) << config.status();
  absl::StatusOr<offload::MemoryPlan> plan =
      offload::PlanJobMemory(resolved, *config, offload::ModeOf(resolved).mode, /*cuda=*/false);
  ASSERT_TRUE(plan.ok()) << plan.status();

  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  // Free heap pages of an earlier case in this process go back to the OS first (Bazel runs
  // every case in one process; CTest runs each in its own).
  malloc_trim(0);
  const int64_t before = StatusBytes("VmRSS");
  testing_jobs::WatchResult w = testing_jobs::SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  const int64_t peak = StatusBytes("VmHWM");
  const double measured = static_cast<double>(peak - before);
  const double planned = static_cast<double>(plan->CpuTotal());
  constexpr double kMiB = 1 << 20;
  std::printf("%s\n", offload::FormatPlans("memory plan", {*plan}, plan->mode).c_str());
  std::printf(
      "measured: RSS before the job %.1f MiB, peak since the first step %.1f MiB, "
      "job %.1f MiB; planned %.1f MiB (ratio %.3f)\n",
      before / kMiB, peak / kMiB, measured / kMiB, planned / kMiB, planned / measured);
  EXPECT_NEAR(planned / measured, 1.0, 0.15)
      << "planned " << planned / kMiB << " MiB, measured " << measured / kMiB << " MiB";
}

TEST(MemoryPlanJobTest, LspPeakIsWithin15PercentOfThePlan) { ExpectPeakWithinPlan(v1::MODE_LSP); }
TEST(MemoryPlanJobTest, ZeroPeakIsWithin15PercentOfThePlan) { ExpectPeakWithinPlan(v1::MODE_ZERO); }
TEST(MemoryPlanJobTest, NativePeakIsWithin15PercentOfThePlan) {
  ExpectPeakWithinPlan(v1::MODE_NATIVE);
}

TEST(MemoryPlanJobTest, AJobThatCannotFitIsRefusedBeforeItLoadsAWeight) {
  // A randomly initialised Llama-2-70B shape (80 layers, hidden 8192, GQA 64:8): ~280 GB in
  // fp32, far above this host's memory. The worker refuses it from the config alone (the random
  // init would otherwise try to allocate it), naming the plan and what to do.
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string out_dir = testing_jobs::TempDir("memory-plan-refused");
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(out_dir, v1::MODE_LSP, 2);
  auto* shape = spec.mutable_model()->mutable_random_shape();
  shape->set_hidden_size(8192);
  shape->set_intermediate_size(28672);
  shape->set_num_hidden_layers(80);
  shape->set_num_attention_heads(64);
  shape->set_num_key_value_heads(8);
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  testing_jobs::WatchResult w = testing_jobs::SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::FAILED);
  const std::string& error = w.last.error();
  EXPECT_NE(error.find("will not fit"), std::string::npos) << error;
  EXPECT_NE(error.find("in mode lsp"), std::string::npos) << error;
  EXPECT_NE(error.find("trained weights (fp32)"), std::string::npos) << error;
  EXPECT_NE(error.find("this host's physical memory"), std::string::npos) << error;
  EXPECT_NE(error.find("lspctl plan"), std::string::npos) << error;
  // The process never held the model: its peak stayed far below the 70B model's 280 GB.
  EXPECT_LT(StatusBytes("VmHWM"), 8LL << 30);
}

}  // namespace
}  // namespace lspo
