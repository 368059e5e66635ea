// Unit tests of the scheduler's job runner and core with fake peers (tests/scheduler/
// fake_peers.h): the cadences of evaluations, projector checks, master refreshes and
// checkpoints; the overlapped schedule; non-finite steps; resume selection; cancel mid-step; a
// peer that fails or hangs; a checkpoint that cannot be written. No service, model or arena.
#include "scheduler/job_runner.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "report/tensorboard.h"
#include "report/tensorboard_scalars.h"
#include "scheduler/checkpoint.h"
#include "spec/job_spec.h"
#include "scheduler/scheduler_core.h"
#include "absl/strings/str_format.h"
#include "tests/scheduler/fake_peers.h"

namespace lspo::scheduler {
namespace {

namespace v1 = lspo::v1;
namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::CallLog;
using testing::FakeHost;
using testing::FakeOptimizer;
using testing::FakeWorker;

constexpr int kLayers = 2;  // 14 linears

std::string TempDir() {
  std::string templ = (fs::temp_directory_path() / "lspo-runner-XXXXXX").string();
  EXPECT_NE(::mkdtemp(templ.data()), nullptr);
  return templ;
}

v1::JobSpec Spec(const std::string& out, v1::TrainingMode mode, int steps) {
  v1::JobSpec s;
  s.set_name("fake");
  s.set_mode(mode);
  s.set_steps(steps);
  s.set_seed(3);
  s.set_micro_batch_size(2);
  s.set_seq_len(16);
  s.set_schedule(v1::STEP_SCHEDULE_SERIAL);
  s.mutable_model()->set_format(v1::MODEL_FORMAT_TINY_RANDOM);
  s.mutable_model()->set_tokenizer_path("datasets/moby-dick/moby-dick.txt");
  s.mutable_data()->set_format(v1::DATA_FORMAT_CLASSIFICATION);
  s.mutable_data()->set_train_path("datasets/sms-spam/train.tsv");
  s.mutable_lsp()->set_d(4);
  s.mutable_lsp()->set_r(2);
  s.mutable_optim()->set_lr(0.01);
  s.set_keep_checkpoints(10);
  spec::ResolveDefaults(&s);
  s.set_output_dir(out);
  return s;
}

struct Fixture {
  CallLog log;
  FakeWorker worker{&log, kLayers, /*eval_examples=*/4};
  FakeOptimizer optimizer{&log, kLayers};
  FakeHost host;
  absl::Status Run(const v1::JobSpec& spec, double deadline_s = 30) {
    RunnerOptions o;
    o.rpc_deadline_seconds = deadline_s;
    JobRunner runner("job-1", spec, &worker, &optimizer, &host, o);
    return runner.Run();
  }
};

std::vector<nlohmann::json> ReadJsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::map<std::string, int> KindCounts(const std::string& out_dir) {
  std::map<std::string, int> n;
  for (const auto& j : ReadJsonl(out_dir + "/metrics.jsonl")) ++n[j["kind"].get<std::string>()];
  return n;
}

std::vector<int> CheckpointSteps(const std::string& out_dir) {
  std::vector<int> steps;
  for (const CheckpointInfo& c : ListCheckpoints(out_dir)) steps.push_back(c.step);
  return steps;
}

nlohmann::json Summary(const std::string& out_dir) {
  std::ifstream in(out_dir + "/summary.json");
  return nlohmann::json::parse(in);
}

TEST(JobRunnerTest, EvaluationAndCheckpointCadence) {
  Fixture f;
  const std::string out = TempDir();
  v1::JobSpec spec = Spec(out, v1::MODE_LSP, 7);
  spec.set_eval_every(3);
  spec.set_checkpoint_every(3);
  ASSERT_TRUE(f.Run(spec).ok());
  // Evaluations: before training, every 3 steps before the last, after the last.
  EXPECT_THAT(f.log.Steps("worker.Evaluate"), ElementsAre(0, 3, 6, 7));
  // Checkpoints: every 3 steps and after the last; both peers save their state.
  EXPECT_THAT(f.log.Steps("worker.SaveState"), ElementsAre(3, 6, 7));
  EXPECT_THAT(f.log.Steps("optimizer.SaveState"), ElementsAre(3, 6, 7));
  EXPECT_THAT(CheckpointSteps(out), ElementsAre(3, 6, 7));
  // Serial steps: train, update, apply, for every step.
  EXPECT_THAT(f.log.Steps("worker.TrainStep"), ElementsAre(1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(f.log.Steps("optimizer.Update"), ElementsAre(1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(f.log.Steps("worker.ApplyUpdates"), ElementsAre(1, 2, 3, 4, 5, 6, 7));
  // One projector check (check_freq 0), all 14 matrices handed to the optimizer.
  EXPECT_THAT(f.log.Steps("worker.FitProjectors"), ElementsAre(0));
  EXPECT_THAT(f.log.Steps("optimizer.SetProjectors"), ElementsAre(7 * kLayers));
  EXPECT_EQ(f.optimizer.arena_layers, kLayers);
  // Stale copies unloaded first, then unloaded at the end.
  EXPECT_EQ(f.log.Count("worker.UnloadJob"), 2);
  EXPECT_EQ(f.log.Count("optimizer.UnloadJob"), 2);
  const auto kinds = KindCounts(out);
  EXPECT_EQ(kinds.at("step"), 7);
  EXPECT_EQ(kinds.at("eval"), 4);
  EXPECT_EQ(kinds.at("checkpoint"), 3);
  EXPECT_EQ(kinds.at("projector_fit"), 1);
  EXPECT_EQ(kinds.at("master_drift"), 1);
  EXPECT_EQ(ReadJsonl(out + "/timeline.jsonl").size(), 7u);
  const nlohmann::json s = Summary(out);
  EXPECT_EQ(s["mode"], "lsp");
  EXPECT_DOUBLE_EQ(s["zero_shot_accuracy"].get<double>(), 0.05);  // the step-0 evaluation
  EXPECT_DOUBLE_EQ(s["final_accuracy"].get<double>(), 0.75);      // the step-7 evaluation
  EXPECT_DOUBLE_EQ(s["final_eval_loss"].get<double>(), 0.25);
  EXPECT_DOUBLE_EQ(s["projector_fitted_relative_bias"].get<double>(), 0.25);
  EXPECT_EQ(s["skipped_steps"], 0);
  EXPECT_EQ(s["device"], "cpu");        // the worker's device (LoadJobReply)
  EXPECT_EQ(s["weight_dtype"], "fp32");  // unset: the worker's default for its device
  const v1::JobStatus st = f.host.status();
  EXPECT_EQ(st.last_checkpoint_step(), 7);
  EXPECT_EQ(st.evals_size(), 4);
  EXPECT_THAT(f.host.steps(), ElementsAre(1, 2, 3, 4, 5, 6, 7));
  // The final save: artifacts on the worker, the fp32 model on the optimizer, into out/.
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  fs::remove_all(out);
}

// summary.json names the device the worker trains on and the weights' dtype it runs: the
// spec's, or where the spec leaves it unset the worker's default (bf16 on CUDA).
TEST(JobRunnerTest, TheSummarySaysTheWorkersDeviceAndWeightDtype) {
  for (const v1::WeightDtype dtype : {v1::WEIGHT_DTYPE_UNSPECIFIED, v1::WEIGHT_DTYPE_FP32}) {
    Fixture f;
    f.worker.device = "cuda:0";
    const std::string out = TempDir();
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 1);
    spec.set_weight_dtype(dtype);
    ASSERT_TRUE(f.Run(spec).ok());
    EXPECT_EQ(Summary(out)["device"], "cuda:0");
    EXPECT_EQ(f.host.status().device(), "cuda:0");  // the run header's "training on"
    EXPECT_EQ(Summary(out)["weight_dtype"], dtype == v1::WEIGHT_DTYPE_FP32 ? "fp32" : "bf16");
    fs::remove_all(out);
  }
}

TEST(JobRunnerTest, ProjectorCheckCadenceAndMasterRefresh) {
  Fixture f;
  const std::string out = TempDir();
  v1::JobSpec spec = Spec(out, v1::MODE_LSP, 7);
  spec.mutable_lsp()->set_check_freq(3);
  ASSERT_EQ(spec.lsp().master_refresh(), v1::MASTER_REFRESH_REFIT);  // the default
  ASSERT_TRUE(f.Run(spec).ok());
  // Checks before step 1 and after steps 3 and 6 (not after the last).
  EXPECT_THAT(f.log.Steps("worker.FitProjectors"), ElementsAre(0, 3, 6));
  EXPECT_EQ(f.log.Count("optimizer.SetProjectors"), 3);
  // A refresh (every layer, export then import) after each check but the first, and the
  // final drift measurement.
  EXPECT_THAT(f.log.Steps("optimizer.ExportLayerWeights"), ElementsAre(0, 1, 0, 1, 0, 1));
  EXPECT_THAT(f.log.Steps("worker.ImportLayerWeights"), ElementsAre(0, 1, 0, 1));
  EXPECT_THAT(f.log.Steps("worker.MeasureLayerWeights"), ElementsAre(0, 1));
  EXPECT_EQ(KindCounts(out).at("master_refresh"), 2);
  EXPECT_DOUBLE_EQ(Summary(out)["final_worker_master_max_abs_diff"].get<double>(), 0.002);

  Fixture g;
  spec.mutable_lsp()->set_master_refresh(v1::MASTER_REFRESH_NEVER);
  ASSERT_TRUE(g.Run(spec).ok());
  EXPECT_THAT(g.log.Steps("worker.FitProjectors"), ElementsAre(0, 3, 6));
  EXPECT_EQ(g.log.Count("worker.ImportLayerWeights"), 0);
  EXPECT_THAT(g.log.Steps("worker.MeasureLayerWeights"), ElementsAre(0, 1));
  fs::remove_all(out);
}

// lsp.refresh_every K: after step t the layers l with (t + floor(l K / L)) mod K = 0, so any K
// consecutive steps refresh every layer exactly once, about L / K layers a step.
TEST(JobRunnerTest, RollingRefreshLayersTakeTurnsOncePerPeriod) {
  for (int layers : {1, 2, 5, 24, 32}) {
    for (int every : {1, 2, 3, 7, 24, 100}) {
      for (int start = 1; start <= 2 * every; ++start) {
        std::vector<int> seen(layers, 0);
        for (int t = start; t < start + every; ++t) {
          const std::vector<int> got = RollingRefreshLayers(t, every, layers);
          ASSERT_TRUE(std::is_sorted(got.begin(), got.end()));
          ASSERT_LE(got.size(), static_cast<size_t>((layers + every - 1) / every))
              << "L " << layers << " K " << every << " step " << t;
          for (int l : got) ++seen[l];
        }
        ASSERT_EQ(seen, std::vector<int>(layers, 1)) << "L " << layers << " K " << every;
      }
    }
  }
  EXPECT_TRUE(RollingRefreshLayers(5, 0, 4).empty());
  EXPECT_TRUE(RollingRefreshLayers(5, 3, 0).empty());
  EXPECT_THAT(RollingRefreshLayers(4, 1, 3), ElementsAre(0, 1, 2));
}

TEST(JobRunnerTest, RollingRefreshCopiesItsLayersAfterEachStepWithoutMeasuring) {
  Fixture f;
  const std::string out = TempDir();
  v1::JobSpec spec = Spec(out, v1::MODE_LSP, 7);
  spec.mutable_lsp()->set_refresh_every(2);  // two layers: 1 after odd steps, 0 after even
  ASSERT_TRUE(f.Run(spec).ok());
  EXPECT_THAT(f.log.Steps("worker.RefreshLayerWeights"), ElementsAre(1, 0, 1, 0, 1, 0, 1));
  EXPECT_EQ(f.log.Count("worker.ImportLayerWeights"), 0);  // no check-time refresh
  // Each refresh exported by the optimizer first; then the final drift measurement.
  EXPECT_THAT(f.log.Steps("optimizer.ExportLayerWeights"),
              ElementsAre(1, 0, 1, 0, 1, 0, 1, 0, 1));
  EXPECT_THAT(f.log.Steps("worker.MeasureLayerWeights"), ElementsAre(0, 1));
  EXPECT_EQ(Summary(out)["rolling_refresh_layers"].get<int64_t>(), 7);
  EXPECT_EQ(Summary(out)["refresh_every"].get<int>(), 2);
  fs::remove_all(out);
}

TEST(JobRunnerTest, OverlapScheduleOverlapsOnceTheCostModelHasMeasuredAStep) {
  Fixture f;
  const std::string out = TempDir();
  v1::JobSpec spec = Spec(out, v1::MODE_ZERO, 3);
  spec.set_schedule(v1::STEP_SCHEDULE_OVERLAP);
  ASSERT_TRUE(f.Run(spec).ok());
  // Step 1 is serial (it measures the per-layer times), steps 2 and 3 overlap: the updates
  // run during the worker's step, and there is no separate apply.
  EXPECT_THAT(f.worker.plans, ElementsAre(false, true, true));
  EXPECT_THAT(f.log.Steps("optimizer.Update"), ElementsAre(1, 2, 3));
  EXPECT_THAT(f.log.Steps("worker.ApplyUpdates"), ElementsAre(1));
  EXPECT_EQ(f.log.Count("worker.FitProjectors"), 0);  // zero mode has no projectors
  const auto tl = ReadJsonl(out + "/timeline.jsonl");
  ASSERT_EQ(tl.size(), 3u);
  EXPECT_FALSE(tl[0]["plan"]["overlap"].get<bool>());
  EXPECT_TRUE(tl[2]["plan"]["overlap"].get<bool>());
  fs::remove_all(out);
}

TEST(JobRunnerTest, NativeModeUsesNoOptimizer) {
  Fixture f;
  const std::string out = TempDir();
  ASSERT_TRUE(f.Run(Spec(out, v1::MODE_NATIVE, 2)).ok());
  EXPECT_THAT(f.log.Steps("worker.TrainStep"), ElementsAre(1, 2));
  for (const std::string& c : f.log.All()) EXPECT_THAT(c, ::testing::StartsWith("worker."));
  EXPECT_FALSE(fs::exists(out + "/timeline.jsonl"));
  EXPECT_EQ(Summary(out)["schedule"], "none");
  fs::remove_all(out);
}

TEST(JobRunnerTest, NonFiniteStepsAreSkippedThenFailTheJob) {
  Fixture f;
  const std::string out = TempDir();
  f.worker.nonfinite_steps = {2};
  ASSERT_TRUE(f.Run(Spec(out, v1::MODE_LSP, 4)).ok());
  EXPECT_THAT(f.host.steps(), ElementsAre(1, 3, 4));
  EXPECT_THAT(f.log.Steps("optimizer.Update"), ElementsAre(1, 3, 4));  // no update at 2
  EXPECT_EQ(f.host.status().skipped_steps(), 1);
  EXPECT_THAT(f.host.status().last_error(), HasSubstr("step 2 had a non-finite"));
  EXPECT_EQ(Summary(out)["skipped_steps"], 1);

  Fixture g;
  g.worker.nonfinite_steps = {2, 3};
  v1::JobSpec spec = Spec(out, v1::MODE_LSP, 4);
  spec.set_max_nonfinite_steps(2);
  absl::Status st = g.Run(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(st.message(), HasSubstr("2 non-finite steps in a row at step 3"));
  EXPECT_EQ(g.log.Count("worker.UnloadJob"), 2);
  fs::remove_all(out);
}

TEST(JobRunnerTest, ResumeSelectsTheNewestCheckpointThatVerifies) {
  const std::string out = TempDir();
  {
    Fixture f;
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 4);
    spec.set_checkpoint_every(2);
    ASSERT_TRUE(f.Run(spec).ok());
    ASSERT_THAT(CheckpointSteps(out), ElementsAre(2, 4));
  }
  // Corrupt the newest checkpoint: "latest" skips it and resumes from step 2.
  const std::string newest = ListCheckpoints(out).back().dir;
  std::ofstream(newest + "/worker_state.safetensors", std::ios::app) << "flipped";
  Fixture f;
  v1::JobSpec spec = Spec(out, v1::MODE_LSP, 6);
  spec.set_checkpoint_every(2);
  spec.set_resume_from("latest");
  ASSERT_TRUE(f.Run(spec).ok());
  EXPECT_THAT(f.log.Steps("worker.LoadState"), ElementsAre(2));
  EXPECT_THAT(f.log.Steps("optimizer.LoadState"), ElementsAre(2));
  EXPECT_THAT(f.worker.loaded_state_dir, HasSubstr("step-00000002"));
  EXPECT_THAT(f.log.Steps("worker.TrainStep"), ElementsAre(3, 4, 5, 6));
  EXPECT_THAT(f.log.Steps("worker.Evaluate"), ElementsAre(6));  // no initial evaluation
  EXPECT_EQ(f.log.Count("worker.FitProjectors"), 0);          // projectors come from the state
  EXPECT_EQ(f.host.status().resumed_from_step(), 2);
  EXPECT_EQ(Summary(out)["resumed_from_step"], 2);
  EXPECT_EQ(KindCounts(out).at("resume"), 1);

  // The resumed run rewrote step 4's checkpoint whole; corrupt it again. An explicit
  // directory must verify; another training spec or too few steps are refused, before
  // anything is loaded.
  EXPECT_THAT(CheckpointSteps(out), ElementsAre(2, 4, 6));
  std::ofstream(newest + "/worker_state.safetensors", std::ios::app) << "flipped";
  Fixture g;
  v1::JobSpec bad = Spec(out, v1::MODE_LSP, 6);
  bad.set_resume_from(newest);
  EXPECT_EQ(g.Run(bad).code(), absl::StatusCode::kDataLoss);
  bad.set_resume_from("latest");
  bad.mutable_optim()->set_lr(0.02);
  EXPECT_EQ(g.Run(bad).code(), absl::StatusCode::kFailedPrecondition);
  v1::JobSpec short_job = Spec(out, v1::MODE_LSP, 1);
  short_job.set_resume_from("latest");
  EXPECT_EQ(g.Run(short_job).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(g.log.Count("worker.LoadJob"), 0);
  fs::remove_all(out);
}

// Issue 45: a job given in epochs trains ceil(epochs x steps an epoch) steps, counted from the
// rows the worker loaded (the fake's 64, micro-batch 2: 32 steps an epoch), says so in the run
// log, the summary and the status, and its warm-up ratio follows the counted steps; a resume
// with more epochs goes on, one with fewer than the checkpoint's step is refused.
TEST(JobRunnerTest, AJobInEpochsCountsItsStepsFromTheRowsTheWorkerLoaded) {
  const std::string out = TempDir();
  v1::JobSpec spec = Spec(out, v1::MODE_LSP, 0);
  spec.set_epochs(0.25);
  spec.mutable_optim()->set_warmup_ratio(0.5);
  spec.set_checkpoint_every(4);
  ASSERT_TRUE(spec::ValidateJobSpec(spec).ok()) << spec::ValidateJobSpec(spec);
  {
    Fixture f;
    ASSERT_TRUE(f.Run(spec).ok());
    EXPECT_THAT(f.log.Steps("worker.TrainStep"), ElementsAre(1, 2, 3, 4, 5, 6, 7, 8));
    EXPECT_EQ(f.host.status().total_steps(), 8);
    EXPECT_EQ(Summary(out)["steps"], 8);
    EXPECT_EQ(Summary(out)["epochs"], 0.25);
    EXPECT_EQ(KindCounts(out).at("epochs"), 1);
    std::ifstream in(ListCheckpoints(out).front().dir + "/trainer_state.json");
    const nlohmann::json state = nlohmann::json::parse(in);
    EXPECT_EQ(state["step"], 4);
    EXPECT_EQ(state["lr_schedule"]["warmup_steps"], 4);  // ceil(0.5 x 8)
    EXPECT_EQ(state["lr_schedule"]["total_steps"], 8);
    EXPECT_DOUBLE_EQ(state["lr_schedule"]["lr_of_step"].get<double>(), 0.01);
  }
  v1::JobSpec more = spec;
  more.set_epochs(0.5);
  more.set_resume_from("latest");
  Fixture f;
  ASSERT_TRUE(f.Run(more).ok());
  EXPECT_EQ(f.log.Steps("worker.TrainStep").size(), 8u);
  EXPECT_EQ(f.log.Steps("worker.TrainStep").front(), 9);
  EXPECT_EQ(f.host.status().total_steps(), 16);
  v1::JobSpec fewer = more;
  fewer.set_epochs(0.125);
  Fixture g;
  const absl::Status st = g.Run(fewer);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("is at step 16 but 0.125 epochs of this job's data are 4 "
                                      "steps: raise epochs"));
  fs::remove_all(out);
}

// Issue 42: a spec that leaves micro_batch_size unset (the default off the CPU) runs the
// worker's choice: the data cursor, the summary and the checkpoint's training fingerprint
// count it; a resume with it still unset sends the checkpoint's to the worker (which then
// chooses nothing), whatever it would choose now; an explicit other value is another training.
TEST(JobRunnerTest, TheWorkersMicroBatchIsAdoptedAndAResumeKeepsIt) {
  const std::string out = TempDir();
  v1::JobSpec spec = Spec(out, v1::MODE_LSP, 4);
  spec.clear_micro_batch_size();
  spec.set_checkpoint_every(2);
  {
    Fixture f;
    f.worker.chosen_micro_batch = 16;
    ASSERT_TRUE(f.Run(spec).ok());
    EXPECT_FALSE(f.worker.loaded_spec.has_micro_batch_size());
    EXPECT_EQ(Summary(out)["micro_batch_size"], 16);
    std::ifstream in(ListCheckpoints(out).back().dir + "/trainer_state.json");
    const nlohmann::json state = nlohmann::json::parse(in);
    EXPECT_EQ(state["data_cursor"]["examples_per_step"], 16);  // x 1 accumulation x 1 rank
    const nlohmann::json trained =
        nlohmann::json::parse(state["training_fingerprint"].get<std::string>());
    EXPECT_EQ(trained.value("micro_batch_size", 0), 16) << trained.dump();
  }
  Fixture f;
  f.worker.chosen_micro_batch = 32;  // another card: it would choose otherwise
  v1::JobSpec resume = spec;
  resume.set_steps(6);
  resume.set_resume_from("latest");
  ASSERT_TRUE(f.Run(resume).ok());
  EXPECT_TRUE(f.worker.loaded_spec.has_micro_batch_size());
  EXPECT_EQ(f.worker.loaded_spec.micro_batch_size(), 16);
  EXPECT_EQ(f.host.status().resumed_from_step(), 4);
  EXPECT_EQ(Summary(out)["micro_batch_size"], 16);
  Fixture g;
  v1::JobSpec other = resume;
  other.set_micro_batch_size(8);
  EXPECT_EQ(g.Run(other).code(), absl::StatusCode::kFailedPrecondition);
  // A worker that says nothing (an older version): 8, as the default was.
  const std::string old = TempDir();
  v1::JobSpec unset = Spec(old, v1::MODE_LSP, 2);
  unset.clear_micro_batch_size();
  Fixture h;
  ASSERT_TRUE(h.Run(unset).ok());
  EXPECT_EQ(Summary(old)["micro_batch_size"], 8);
  fs::remove_all(out);
  fs::remove_all(old);
}

// Issue 42: an unset lsp.apply_rounding is stochastic, written into the job before the worker
// loads it; an unset refresh_every is 100 where the worker's weights are 16-bit (a CUDA
// worker's default) and 0 on fp32 ones; both land in the checkpoint's training fingerprint, and
// a resume with them unset runs what the checkpoint ran.
TEST(JobRunnerTest, TheDefaultRoundingAndRefreshAreWrittenOutAndKeptByAResume) {
  const std::string out = TempDir();
  v1::JobSpec spec = Spec(out, v1::MODE_LSP, 4);
  spec.set_checkpoint_every(2);
  const auto fingerprint = [&]() {
    std::ifstream in(ListCheckpoints(out).back().dir + "/trainer_state.json");
    return nlohmann::json::parse(
        nlohmann::json::parse(in)["training_fingerprint"].get<std::string>());
  };
  {
    Fixture f;
    f.worker.device = "cuda:0";  // bf16 weights by default
    ASSERT_TRUE(f.Run(spec).ok());
    EXPECT_EQ(f.worker.loaded_spec.lsp().apply_rounding(), v1::APPLY_ROUNDING_STOCHASTIC);
    EXPECT_EQ(Summary(out)["apply_rounding"], "stochastic");
    EXPECT_EQ(Summary(out)["refresh_every"], 100);
    const nlohmann::json trained = fingerprint();
    EXPECT_EQ(trained["lsp"].value("apply_rounding", ""), "stochastic") << trained.dump();
    EXPECT_EQ(trained["lsp"].value("refresh_every", 0), 100) << trained.dump();
  }
  {
    Fixture f;  // resumed on the CPU: what the checkpoint ran, not the CPU's default (0)
    v1::JobSpec resume = spec;
    resume.set_steps(6);
    resume.set_resume_from("latest");
    ASSERT_TRUE(f.Run(resume).ok());
    EXPECT_EQ(f.worker.loaded_spec.lsp().refresh_every(), 100);
    EXPECT_EQ(Summary(out)["refresh_every"], 100);
  }
  const std::string cpu = TempDir();
  Fixture g;
  ASSERT_TRUE(g.Run(Spec(cpu, v1::MODE_LSP, 2)).ok());  // fp32 weights: nothing to refresh
  EXPECT_EQ(Summary(cpu)["refresh_every"], 0);
  EXPECT_EQ(g.log.Count("worker.RefreshLayerWeights"), 0);
  fs::remove_all(out);
  fs::remove_all(cpu);
}

std::string RunIdOf(const std::string& out, int step) {
  absl::StatusOr<CheckpointLineage> l =
      ReadCheckpointLineage(absl::StrFormat("%s/checkpoints/step-%08d", out, step));
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? l->run_id : std::string();
}

// Issue 43, lineage: a run resumed from an earlier checkpoint while later ones exist. Before
// run ids, "latest" took the highest step-N (the abandoned branch) and pruning by step number
// deleted the resumed run's own checkpoints.
TEST(JobRunnerTest, LatestAndPruningFollowTheRunsLineageNotTheHighestStep) {
  const std::string out = TempDir();
  {  // Run 1: steps 1..6, a checkpoint every step.
    Fixture f;
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 6);
    spec.set_checkpoint_every(1);
    ASSERT_TRUE(f.Run(spec).ok());
    ASSERT_THAT(CheckpointSteps(out), ElementsAre(1, 2, 3, 4, 5, 6));
  }
  const std::string run1 = RunIdOf(out, 6);
  {  // Run 2: back to step 2 by hand, then step 3 (replacing run 1's step 3).
    Fixture f;
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 3);
    spec.set_checkpoint_every(1);
    spec.set_resume_from(out + "/checkpoints/step-00000002");
    ASSERT_TRUE(f.Run(spec).ok());
    EXPECT_THAT(f.log.Steps("worker.TrainStep"), ElementsAre(3));
  }
  const std::string run2 = RunIdOf(out, 3);
  EXPECT_NE(run2, run1);
  EXPECT_EQ(RunIdOf(out, 4), run1);
  absl::StatusOr<CheckpointLineage> l3 = ReadCheckpointLineage(out + "/checkpoints/step-00000003");
  ASSERT_TRUE(l3.ok());
  EXPECT_EQ(l3->parent_run_id, run1);
  EXPECT_EQ(l3->parent_step, 2);
  {  // Run 3: "latest" is run 2's step 3 (committed last), not run 1's step 6.
    Fixture f;
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 4);
    spec.set_checkpoint_every(1);
    spec.set_keep_checkpoints(2);
    spec.set_resume_from("latest");
    ASSERT_TRUE(f.Run(spec).ok());
    EXPECT_THAT(f.worker.loaded_state_dir, HasSubstr("step-00000003"));
    EXPECT_THAT(f.log.Steps("worker.TrainStep"), ElementsAre(4));
  }
  // Its lineage is 4 (run 3), 3 (run 2), 2, 1 (run 1): keep 2 pruned 2 and 1. Run 1's 5 and 6,
  // another branch, are left; by step number the prune would have deleted 3 and 4.
  EXPECT_THAT(CheckpointSteps(out), ElementsAre(3, 4, 5, 6));
  EXPECT_EQ(RunIdOf(out, 6), run1);
  std::vector<int> lineage;
  for (const CheckpointInfo& c : LatestCheckpoints(out)) lineage.push_back(c.step);
  EXPECT_THAT(lineage, ElementsAre(4, 3));
  // A corrupted head falls back along the lineage (to 3), never to run 1's 6 or 5.
  std::ofstream(out + "/checkpoints/step-00000004/worker_state.safetensors", std::ios::app)
      << "flipped";
  {
    Fixture f;
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 4);
    spec.set_keep_checkpoints(2);
    spec.set_resume_from("latest");
    ASSERT_TRUE(f.Run(spec).ok());
    EXPECT_THAT(f.worker.loaded_state_dir, HasSubstr("step-00000003"));
  }
  fs::remove_all(out);
}

TEST(JobRunnerTest, AFreshStartAmongAnotherRunsCheckpointsIsRefusedOrMovesThemAside) {
  const std::string out = TempDir();
  {
    Fixture f;
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 2);
    spec.set_checkpoint_every(1);
    ASSERT_TRUE(f.Run(spec).ok());
  }
  Fixture f;
  v1::JobSpec spec = Spec(out, v1::MODE_LSP, 3);
  spec.set_checkpoint_every(1);
  absl::Status st = f.Run(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("2 checkpoint(s) of an earlier run"));
  EXPECT_THAT(st.message(), HasSubstr("overwrite_output_dir: true"));
  EXPECT_EQ(f.log.Count("worker.LoadJob"), 0);  // refused before anything was loaded
  EXPECT_THAT(CheckpointSteps(out), ElementsAre(1, 2));

  spec.set_overwrite_output_dir(true);
  Fixture g;
  ASSERT_TRUE(g.Run(spec).ok());
  EXPECT_THAT(g.log.Steps("worker.TrainStep"), ElementsAre(1, 2, 3));
  EXPECT_THAT(CheckpointSteps(out), ElementsAre(1, 2, 3));
  int moved = 0;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints")) {
    if (e.path().filename().string().rfind("superseded-", 0) != 0) continue;
    for (const auto& c : fs::directory_iterator(e.path())) {
      EXPECT_TRUE(fs::exists(c.path() / "trainer_state.json")) << c.path();
      ++moved;
    }
  }
  EXPECT_EQ(moved, 2);
  EXPECT_EQ(KindCounts(out).at("checkpoints_superseded"), 1);
  fs::remove_all(out);
}

TEST(JobRunnerTest, EveryMetricsLineHasItsScalarsInTheEventsFiles) {
  // A job with evaluations, projector checks, master refreshes and checkpoints, resumed
  // once: the folder's events files, in name order, hold exactly the TensorBoard scalars of
  // the metrics.jsonl lines, in line order (a resumed job adds a file).
  const std::string out = TempDir();
  for (int steps : {4, 6}) {
    Fixture f;
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, steps);
    spec.set_eval_every(2);
    spec.set_checkpoint_every(2);
    spec.mutable_lsp()->set_check_freq(2);
    if (steps == 6) spec.set_resume_from("latest");
    ASSERT_TRUE(f.Run(spec).ok());
  }
  using Point = std::tuple<std::string, int64_t, float>;
  std::vector<Point> want, got;
  std::set<std::string> tags;
  for (const auto& line : ReadJsonl(out + "/metrics.jsonl")) {
    const LineScalars s = TensorBoardScalars(line);
    for (const auto& v : s.scalars) want.emplace_back(v.tag, s.step, v.value);
  }
  const std::vector<std::string> files = ListEventsFiles(out);
  ASSERT_EQ(files.size(), 2u);
  for (const std::string& file : files) {
    auto events = ReadScalarEvents(file);
    ASSERT_TRUE(events.ok()) << events.status();
    for (const auto& e : *events) {
      got.emplace_back(e.tag, e.step, e.value);
      tags.insert(e.tag);
    }
  }
  EXPECT_EQ(got, want);
  for (const char* tag : {"train/loss", "train/learning_rate", "time/step_s", "eval/loss",
                          "projector/bias_after_fit", "master/worker_max_abs_diff"}) {
    EXPECT_EQ(tags.count(tag), 1u) << tag;
  }
  fs::remove_all(out);
}

TEST(JobRunnerTest, CancelMidStepStopsBeforeTheNextStepAndUnloadsBothPeers) {
  Fixture f;
  const std::string out = TempDir();
  f.worker.on_train_step = [&](int step) {
    if (step == 2) f.host.cancel = true;
  };
  absl::Status st = f.Run(Spec(out, v1::MODE_LSP, 5));
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(f.log.Steps("worker.TrainStep"), ElementsAre(1, 2));  // step 2 completes
  EXPECT_EQ(f.log.Count("worker.UnloadJob"), 2);
  EXPECT_EQ(f.log.Count("optimizer.UnloadJob"), 2);
  EXPECT_FALSE(fs::exists(out + "/summary.json"));
  fs::remove_all(out);
}

// Issue 43: a cancel during a step abandons it at once (AbortStep to both peers, which the
// worker sees at its next layer boundary) instead of waiting for the step to end; here the
// worker's step 3 would otherwise run to the 30 s deadline.
TEST(JobRunnerTest, ACancelDuringAStepAbandonsItAtOnce) {
  Fixture f;
  const std::string out = TempDir();
  f.worker.behaviour["TrainStep"].hang.insert(3);
  f.worker.on_train_step = [&](int step) {
    if (step == 3) f.host.cancel = true;
  };
  v1::JobSpec spec = Spec(out, v1::MODE_LSP, 5);
  spec.set_checkpoint_every(2);
  const auto t0 = std::chrono::steady_clock::now();
  absl::Status st = f.Run(spec, /*deadline_s=*/30);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(st.code(), absl::StatusCode::kCancelled) << st;
  EXPECT_THAT(st.message(), HasSubstr("during step 3"));
  EXPECT_THAT(st.message(), HasSubstr("resume_from: latest"));
  EXPECT_LT(took, 10.0);
  EXPECT_THAT(f.log.Steps("worker.AbortStep"), ElementsAre(3));
  EXPECT_THAT(f.log.Steps("optimizer.AbortStep"), ElementsAre(3));
  EXPECT_THAT(CheckpointSteps(out), ElementsAre(2));  // the last checkpoint stays
  EXPECT_EQ(f.log.Count("worker.UnloadJob"), 2);
  fs::remove_all(out);
}

TEST(JobRunnerTest, AFailingPeerFailsTheJobAndReleasesTheOther) {
  const std::string out = TempDir();
  {
    Fixture f;  // serial: the job fails with the optimizer's status, both peers unload
    f.optimizer.behaviour["Update"].fail[2] = absl::UnavailableError("optimizer: socket closed");
    absl::Status st = f.Run(Spec(out, v1::MODE_LSP, 4));
    EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(st.message(), HasSubstr("optimizer"));
    EXPECT_THAT(f.log.Steps("worker.ApplyUpdates"), ElementsAre(1));
    EXPECT_EQ(f.log.Count("worker.UnloadJob"), 2);
    EXPECT_EQ(f.log.Count("optimizer.UnloadJob"), 2);
  }
  {
    Fixture f;  // overlapped: the worker, possibly waiting on the step's flags, is released
    f.optimizer.behaviour["Update"].fail[2] = absl::DataLossError("optimizer: poisoned moments");
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 4);
    spec.set_schedule(v1::STEP_SCHEDULE_OVERLAP);
    absl::Status st = f.Run(spec);
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);  // the code is kept
    EXPECT_THAT(f.log.Steps("worker.AbortStep"), ElementsAre(2));
  }
  {
    // Overlapped, the worker fails fast while the optimizer waits for that step's gradients:
    // AbortStep releases the optimizer at once (without it the optimizer would wait out its
    // 20 s gradient timeout), and the worker's error is the job's.
    Fixture f;
    f.worker.behaviour["TrainStep"].fail[2] = absl::InvalidArgumentError("worker: bad batch");
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 4);
    spec.set_schedule(v1::STEP_SCHEDULE_OVERLAP);
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = f.Run(spec, /*deadline_s=*/20);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                            .count();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_THAT(f.log.Steps("optimizer.AbortStep"), ElementsAre(2));
    EXPECT_LT(secs, 10);
  }
  {
    Fixture f;  // a worker failing at load: the optimizer is never loaded
    f.worker.behaviour["LoadJob"].fail[-1] = absl::InvalidArgumentError("worker: bad lsp.d");
    EXPECT_EQ(f.Run(Spec(out, v1::MODE_LSP, 2)).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(f.log.Count("optimizer.LoadJob"), 0);
  }
  fs::remove_all(out);
}

TEST(JobRunnerTest, AHangingPeerFailsTheJobAtTheDeadline) {
  const std::string out = TempDir();
  {
    // Overlapped: the worker hangs. The optimizer waits for its gradients as long as the
    // deadline too, so whichever side times out first releases the other; the job fails with
    // kDeadlineExceeded at about the deadline, never hanging.
    Fixture f;
    f.worker.behaviour["TrainStep"].hang = {2};
    v1::JobSpec spec = Spec(out, v1::MODE_ZERO, 3);
    spec.set_schedule(v1::STEP_SCHEDULE_OVERLAP);
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = f.Run(spec, /*deadline_s=*/0.3);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                            .count();
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
    EXPECT_GE(secs, 0.3);
    EXPECT_LT(secs, 10);
    EXPECT_GE(f.log.Count("optimizer.AbortStep") + f.log.Count("worker.AbortStep"), 1);
    EXPECT_THAT(f.log.Steps("worker.TrainStep"), ElementsAre(1, 2));
    EXPECT_EQ(f.log.Count("worker.UnloadJob"), 2);
  }
  {
    Fixture f;  // serial: a hanging optimizer
    f.optimizer.behaviour["Update"].hang = {1};
    absl::Status st = f.Run(Spec(out, v1::MODE_LSP, 2), /*deadline_s=*/0.3);
    EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(st.message(), HasSubstr("optimizer"));
    EXPECT_EQ(f.log.Count("worker.ApplyUpdates"), 0);
  }
  fs::remove_all(out);
}

TEST(JobRunnerTest, AnUnwritableCheckpointIsReportedAndTrainingGoesOn) {
  const std::string out = TempDir();
  {
    Fixture f;
    f.worker.behaviour["SaveState"].fail[2] = absl::ResourceExhaustedError("disk full");
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 4);
    spec.set_checkpoint_every(2);
    ASSERT_TRUE(f.Run(spec).ok());
    EXPECT_THAT(CheckpointSteps(out), ElementsAre(4));
    EXPECT_EQ(f.host.status().last_checkpoint_step(), 4);
    EXPECT_THAT(f.host.status().last_error(), HasSubstr("checkpoint of step 2 failed: disk full"));
    EXPECT_EQ(KindCounts(out).at("checkpoint_failed"), 1);
    // No half-written checkpoint directory is left (beside them: the `latest` pointer).
    for (const auto& e : fs::directory_iterator(out + "/checkpoints")) {
      if (e.path().filename() == "latest") continue;
      EXPECT_THAT(e.path().filename().string(), ::testing::StartsWith("step-"));
    }
  }
  {
    Fixture f;  // a peer that died while saving fails the job
    f.optimizer.behaviour["SaveState"].fail[2] = absl::UnavailableError("optimizer: gone");
    v1::JobSpec spec = Spec(out, v1::MODE_LSP, 4);
    spec.set_overwrite_output_dir(true);  // the first run's checkpoints move aside
    spec.set_checkpoint_every(2);
    EXPECT_EQ(f.Run(spec).code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(f.log.Steps("worker.TrainStep"), ElementsAre(1, 2));
  }
  fs::remove_all(out);
}

// The core over fake peers: submit, run, wait; a job queued behind it is cancelled at once
// and never reaches the peers.
TEST(SchedulerCoreTest, RunsASubmittedJobAndCancelsAQueuedOneOverFakePeers) {
  auto log = std::make_shared<CallLog>();
  auto worker = std::make_unique<FakeWorker>(log.get(), kLayers, 4);
  FakeWorker* w = worker.get();
  std::atomic<bool> release{false};
  w->on_train_step = [&](int) {
    while (!release) absl::SleepFor(absl::Milliseconds(2));
  };
  auto created =
      SchedulerCore::Create(std::move(worker), std::make_unique<FakeOptimizer>(log.get(), kLayers));
  ASSERT_TRUE(created.ok()) << created.status();
  SchedulerCore& core = **created;
  const std::string out1 = TempDir(), out2 = TempDir();
  v1::JobSpec a = Spec(out1, v1::MODE_LSP, 2), b = Spec(out2, v1::MODE_LSP, 2);
  a.mutable_data()->set_format(v1::DATA_FORMAT_TEXT);
  a.mutable_data()->set_train_path("datasets/moby-dick/moby-dick.txt");
  b.mutable_data()->CopyFrom(a.data());
  auto id1 = core.Submit(a);
  ASSERT_TRUE(id1.ok()) << id1.status();
  auto id2 = core.Submit(b);
  ASSERT_TRUE(id2.ok()) << id2.status();
  // The second job is still queued while the first trains: cancelling it is immediate.
  auto cancelled = core.Cancel(*id2);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(*cancelled, v1::CANCELLED);
  release = true;
  auto done = core.Wait(*id1);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state(), v1::SUCCEEDED) << done->error();
  EXPECT_EQ(done->step(), 2);
  EXPECT_EQ(core.Get(*id2)->state(), v1::CANCELLED);
  EXPECT_EQ(log->Count("worker.LoadJob"), 1);  // the cancelled job never ran
  EXPECT_EQ(core.Get("job-nope").status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(out1);
  fs::remove_all(out2);
}

TEST(SchedulerCoreTest, CreateRefusesAStateDirItCannotUseAndRecoversAUsableOne) {
  auto log = std::make_shared<CallLog>();
  // A regular file where the state directory should be: no scheduler, the reason named.
  const std::string dir = TempDir();
  const std::string file = dir + "/not-a-dir";
  { std::ofstream(file) << "x"; }
  SchedulerOptions bad;
  bad.state_dir = file;
  auto refused = SchedulerCore::Create(std::make_unique<FakeWorker>(log.get(), kLayers, 4),
                                       std::make_unique<FakeOptimizer>(log.get(), kLayers), bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(refused.status().message().find(file), std::string::npos) << refused.status();
  // A usable one: a queued job persisted there is recovered by the next scheduler.
  SchedulerOptions good;
  good.state_dir = dir + "/state";
  std::string id;
  {
    auto worker = std::make_unique<FakeWorker>(log.get(), kLayers, 4);
    std::atomic<bool> release{false};
    worker->on_train_step = [&](int) {
      while (!release) absl::SleepFor(absl::Milliseconds(2));
    };
    auto first = SchedulerCore::Create(std::move(worker),
                                       std::make_unique<FakeOptimizer>(log.get(), kLayers), good);
    ASSERT_TRUE(first.ok()) << first.status();
    v1::JobSpec a = Spec(dir + "/out", v1::MODE_LSP, 1);
    a.mutable_data()->set_format(v1::DATA_FORMAT_TEXT);
    a.mutable_data()->set_train_path("datasets/moby-dick/moby-dick.txt");
    auto busy = (*first)->Submit(a);
    ASSERT_TRUE(busy.ok()) << busy.status();
    auto queued = (*first)->Submit(a);
    ASSERT_TRUE(queued.ok()) << queued.status();
    id = *queued;
    release = true;
    ASSERT_TRUE((*first)->Cancel(*busy).ok());
    // Shut down with `id` possibly still queued or done; either way it is in the store.
  }
  auto second = SchedulerCore::Create(std::make_unique<FakeWorker>(log.get(), kLayers, 4),
                                      std::make_unique<FakeOptimizer>(log.get(), kLayers), good);
  ASSERT_TRUE(second.ok()) << second.status();
  auto recovered = (*second)->Get(id);
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->job_id(), id);
  EXPECT_EQ(recovered->spec().data().format(), v1::DATA_FORMAT_TEXT);
  second->reset();  // Cancels and joins the recovered job before its files go.
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(SchedulerCoreTest, RestartsAreCappedAndACancelOfARunningJobSurvivesARestart) {
  // Jobs a dead scheduler left RUNNING: one resumed max_restarts times already is FAILED, not
  // resumed again; one whose cancel was asked for is CANCELLED; the others resume. And a
  // cancel of a running job is in the store before the job has stopped.
  auto log = std::make_shared<CallLog>();
  const std::string dir = TempDir();
  SchedulerOptions opts;
  opts.state_dir = dir + "/state";
  opts.max_restarts = 2;
  {
    auto store = JobStore::Open(opts.state_dir);
    ASSERT_TRUE(store.ok()) << store.status();
    const auto running = [&](const std::string& id, int restarts, bool cancel) {
      v1::JobStatus st;
      st.set_job_id(id);
      st.set_state(v1::RUNNING);
      st.set_restarts(restarts);
      st.set_cancel_requested(cancel);
      st.set_last_checkpoint_step(4);
      *st.mutable_spec() = Spec(dir + "/out-" + id, v1::MODE_LSP, 1);
      ASSERT_TRUE(store->Save(st).ok());
    };
    running("job-1-1", 2, false);  // at the cap
    running("job-1-2", 0, true);   // cancelled while it ran
    running("job-1-3", 1, false);  // resumed once: resumed again
  }
  auto worker = std::make_unique<FakeWorker>(log.get(), kLayers, 4);
  std::atomic<bool> release{false};
  worker->on_train_step = [&](int) {
    while (!release) absl::SleepFor(absl::Milliseconds(2));
  };
  auto core = SchedulerCore::Create(std::move(worker),
                                    std::make_unique<FakeOptimizer>(log.get(), kLayers), opts);
  ASSERT_TRUE(core.ok()) << core.status();
  auto capped = (*core)->Get("job-1-1");
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->state(), v1::FAILED);
  EXPECT_NE(capped->error().find("after 2 automatic resumes"), std::string::npos)
      << capped->error();
  EXPECT_NE(capped->error().find("resume_from: latest"), std::string::npos) << capped->error();
  EXPECT_NE(capped->error().find("step 4"), std::string::npos) << capped->error();
  auto cancelled = (*core)->Get("job-1-2");
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  // job-1-3 resumes (restarts 2) and blocks in its first step: cancel it while it runs.
  v1::JobStatus resumed;
  for (int i = 0; i < 500; ++i) {
    resumed = *(*core)->Get("job-1-3");
    if (resumed.state() == v1::RUNNING) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(resumed.restarts(), 2);
  ASSERT_EQ(resumed.state(), v1::RUNNING);
  ASSERT_TRUE((*core)->Cancel("job-1-3").ok());
  {
    auto store = JobStore::Open(opts.state_dir);
    ASSERT_TRUE(store.ok());
    bool found = false;
    for (const auto& j : store->LoadAll(nullptr)) {
      if (j.job_id() != "job-1-3") continue;
      found = true;
      EXPECT_TRUE(j.cancel_requested());
    }
    EXPECT_TRUE(found);
  }
  release = true;
  core->reset();
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(SchedulerCoreTest, PathsOutsideTheRootsAreRefusedBeforeTheyAreLookedFor) {
  // A spec naming a file outside --allowed_roots is refused as outside, whether the file exists
  // or not: checking existence first would tell a client which files exist there.
  auto log = std::make_shared<CallLog>();
  const std::string dir = TempDir();
  SchedulerOptions opts;
  opts.allowed_roots = {dir, fs::current_path().string()};  // Spec()'s files are the repo's
  auto core = SchedulerCore::Create(std::make_unique<FakeWorker>(log.get(), kLayers, 4),
                                    std::make_unique<FakeOptimizer>(log.get(), kLayers), opts);
  ASSERT_TRUE(core.ok()) << core.status();
  for (const std::string& path : {std::string("/nonexistent-lspo-dir/train.tsv"),
                                  std::string("/etc/hostname")}) {
    v1::JobSpec spec = Spec(dir + "/out", v1::MODE_LSP, 1);
    spec.mutable_data()->set_train_path(path);
    auto id = (*core)->Submit(spec);
    ASSERT_FALSE(id.ok()) << path;
    EXPECT_EQ(id.status().code(), absl::StatusCode::kPermissionDenied) << id.status();
    EXPECT_NE(id.status().message().find("data.train_path"), std::string::npos) << id.status();
  }
  core->reset();
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(SchedulerCoreTest, ASecondSchedulerOnTheSameStateDirIsRefusedUntilTheFirstIsGone) {
  // Two schedulers on one state_dir would both recover and run its jobs: the second is refused
  // by the directory's lock before it reads a job, naming the holder; readers of the store
  // (JobStore::Open) are not; once the first is gone, a new one starts.
  auto log = std::make_shared<CallLog>();
  const std::string dir = TempDir();
  SchedulerOptions opts;
  opts.state_dir = dir + "/state";
  auto first = SchedulerCore::Create(std::make_unique<FakeWorker>(log.get(), kLayers, 4),
                                     std::make_unique<FakeOptimizer>(log.get(), kLayers), opts);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = SchedulerCore::Create(std::make_unique<FakeWorker>(log.get(), kLayers, 4),
                                      std::make_unique<FakeOptimizer>(log.get(), kLayers), opts);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(second.status().message());
  EXPECT_NE(msg.find(opts.state_dir + "/LOCK"), std::string::npos) << msg;
  EXPECT_NE(msg.find(absl::StrCat("pid ", ::getpid())), std::string::npos) << msg;
  EXPECT_NE(msg.find("--state_dir"), std::string::npos) << msg;
  EXPECT_TRUE(JobStore::Open(opts.state_dir).ok());
  first->reset();
  auto third = SchedulerCore::Create(std::make_unique<FakeWorker>(log.get(), kLayers, 4),
                                     std::make_unique<FakeOptimizer>(log.get(), kLayers), opts);
  EXPECT_TRUE(third.ok()) << third.status();
  third->reset();
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace lspo::scheduler
