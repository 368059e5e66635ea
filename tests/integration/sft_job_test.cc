// Instruction, chat and prompt-completion data end to end: a job on each real cooking file
// (datasets/cooking-stackexchange/, data/sft.h), with data.format left unset so that it is
// detected from the keys, trains (the evaluation loss on held-out records of the same file
// falls) and evaluates; a data.chat_template override is used; a bad record fails the job with
// file:line in the error, and the runtime keeps serving.
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "scheduler/job_spec.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

using testing_jobs::SubmitAndWatch;

constexpr char kCooking[] = "datasets/cooking-stackexchange/";

// The eval losses of metrics.jsonl, in order.
std::vector<double> EvalLosses(const std::string& dir) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == "eval") out.push_back(j.at("loss").get<double>());
  }
  return out;
}

v1::JobSpec SftSpec(const std::string& out, const std::string& file, int steps) {
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(out, v1::MODE_LSP, steps);
  spec.set_name("tiny-sft");
  auto* data = spec.mutable_data();
  data->clear_format();  // detected from the file's keys
  data->set_train_path(std::string(kCooking) + file);
  data->set_eval_path(std::string(kCooking) + file);
  data->set_max_train_examples(32);
  data->set_max_eval_examples(8);
  data->clear_max_blocks();
  spec.set_seq_len(96);
  spec.set_eval_every(steps);
  return spec;
}

TEST(SftJobTest, EachFormatTrainsEndToEndWithItsFormatDetected) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  struct Case {
    const char* file;
    v1::DataFormat detected;
  };
  for (const Case& c : {Case{"train.alpaca.jsonl", v1::DATA_FORMAT_ALPACA},
                        Case{"sample.chat.jsonl", v1::DATA_FORMAT_CHAT},
                        Case{"sample.prompt_completion.jsonl", v1::DATA_FORMAT_PROMPT_COMPLETION}}) {
    SCOPED_TRACE(c.file);
    const std::string out = testing_jobs::TempDir("sft");
    v1::JobSpec spec = SftSpec(out, c.file, 6);
    v1::JobSpec resolved = spec;
    scheduler::ResolveDefaults(&resolved);
    EXPECT_EQ(resolved.data().format(), c.detected);
    const auto w = SubmitAndWatch(stub.get(), spec);
    ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
    const std::vector<double> losses = EvalLosses(out);
    ASSERT_GE(losses.size(), 2u);
    for (double l : losses) EXPECT_TRUE(std::isfinite(l));
    EXPECT_LT(losses.back(), losses.front()) << "the eval loss on the answers falls";
  }
}

// The format is detected from the first record however long it is, and from the key names
// when the record does not parse (so that the format's reader names the bad byte).
TEST(SftJobTest, DetectionReadsTheWholeFirstRecord) {
  const std::string dir = testing_jobs::TempDir("sft-detect");
  const std::string long_chat = dir + "/long.jsonl", bad_utf8 = dir + "/bad.jsonl";
  std::ofstream(long_chat) << R"({"messages": [{"role": "user", "content": ")"
                           << std::string(70000, 'q')
                           << R"("}, {"role": "assistant", "content": "a"}]})" << "\n";
  std::ofstream(bad_utf8) << "{\"instruction\": \"i\xff\", \"output\": \"o\"}\n";
  for (const auto& [path, want] : {std::pair<std::string, v1::DataFormat>{long_chat, v1::DATA_FORMAT_CHAT},
                                   {bad_utf8, v1::DATA_FORMAT_ALPACA}}) {
    v1::JobSpec spec;
    spec.mutable_data()->set_train_path(path);
    scheduler::ResolveDefaults(&spec);
    EXPECT_EQ(spec.data().format(), want) << path;
  }
}

TEST(SftJobTest, ChatTemplateOverrideAndBadRecordsFailTheJobClearly) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  // A template of another family (Llama 3's headers, written as text by the SmolLM2
  // tokenizer): the job runs with it.
  {
    const std::string out = testing_jobs::TempDir("sft-tmpl");
    v1::JobSpec spec = SftSpec(out, "sample.chat.jsonl", 2);
    spec.mutable_data()->set_chat_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
    const auto w = SubmitAndWatch(stub.get(), spec);
    EXPECT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  }
  // A record with an unknown role: the job fails naming file:line; the runtime serves on.
  const std::string bad = testing_jobs::TempDir("sft-bad") + "/bad.chat.jsonl";
  {
    std::ifstream in(std::string(kCooking) + "sample.chat.jsonl");
    std::ofstream o(bad);
    std::string line;
    for (int i = 0; i < 3 && std::getline(in, line); ++i) o << line << "\n";
    o << R"({"messages": [{"role": "robot", "content": "q"}, {"role": "assistant", "content": "a"}]})" << "\n";
  }
  v1::JobSpec spec = SftSpec(testing_jobs::TempDir("sft-badout"), "sample.chat.jsonl", 2);
  spec.mutable_data()->set_train_path(bad);
  const auto w = SubmitAndWatch(stub.get(), spec);
  EXPECT_EQ(w.last.state(), v1::FAILED);
  EXPECT_NE(w.last.error().find(bad + ":4"), std::string::npos) << w.last.error();
  EXPECT_NE(w.last.error().find("role \"robot\""), std::string::npos) << w.last.error();
  const auto again = SubmitAndWatch(stub.get(), SftSpec(testing_jobs::TempDir("sft-again"),
                                                         "sample.prompt_completion.jsonl", 1));
  EXPECT_EQ(again.last.state(), v1::SUCCEEDED) << again.last.error();
}

}  // namespace
}  // namespace lspo
