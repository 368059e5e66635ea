// A real job's TensorBoard events (embedded mode, the tiny Llama on Moby-Dick, lsp): the
// events file in output_dir has, for every step line of metrics.jsonl, train/loss equal to
// the line's loss (as float32) at the line's step, and as many train/loss points as step
// lines; every evaluation and the projector fit are there too.
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "report/tensorboard.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

using ::testing::SizeIs;

TEST(TensorBoardJobTest, TheEventsFileHoldsEveryStepsLossAndEveryEvaluation) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string out_dir = testing_jobs::TempDir("tensorboard");
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(out_dir, v1::MODE_LSP, 4);
  spec.set_eval_every(2);
  spec.set_skip_checkpoint(true);
  testing_jobs::WatchResult w = testing_jobs::SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();

  std::map<int64_t, float> step_loss, eval_loss;  // From metrics.jsonl.
  int projector_fits = 0;
  std::ifstream metrics(out_dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j["kind"] == "step") step_loss[j["step"]] = static_cast<float>(j["loss"].get<double>());
    if (j["kind"] == "eval") eval_loss[j["step"]] = static_cast<float>(j["loss"].get<double>());
    projector_fits += j["kind"] == "projector_fit";
  }
  ASSERT_THAT(step_loss, SizeIs(4));
  ASSERT_THAT(eval_loss, SizeIs(3));  // Steps 0, 2 and 4.
  ASSERT_EQ(projector_fits, 1);

  const std::vector<std::string> files = scheduler::ListEventsFiles(out_dir);
  ASSERT_THAT(files, SizeIs(1));
  auto events = scheduler::ReadScalarEvents(files[0]);
  ASSERT_TRUE(events.ok()) << events.status();
  std::map<std::string, std::map<int64_t, float>> by_tag;
  std::map<std::string, int> count;
  for (const scheduler::ScalarEvent& e : *events) {
    by_tag[e.tag][e.step] = e.value;
    ++count[e.tag];
  }
  EXPECT_EQ(by_tag["train/loss"], step_loss);
  EXPECT_EQ(count["train/loss"], 4);
  EXPECT_EQ(by_tag["eval/loss"], eval_loss);
  EXPECT_EQ(count["projector/bias_after_fit"], 1);
  for (const char* tag :
       {"train/learning_rate", "train/grad_norm", "train/tokens_per_second", "time/step_s",
        "time/forward_s", "time/backward_s", "time/update_s", "offload/bytes_to_cpu"}) {
    EXPECT_EQ(count[tag], 4) << tag;
  }
  std::filesystem::remove_all(out_dir);
}

}  // namespace
}  // namespace lspo
