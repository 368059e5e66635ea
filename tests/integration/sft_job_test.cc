// Instruction, chat and prompt-completion data end to end: a job on each real cooking file
// (datasets/cooking-stackexchange/, data/sft.h), with data.format left unset so that it is
// detected from the keys, trains (the evaluation loss on held-out records of the same file
// falls) and evaluates; a data.chat_template override is used; a bad record fails the job with
// file:line in the error, and the runtime keeps serving; eval.metric generative scores greedy
// answers, and the data summary reaches metrics.jsonl.
#include "third_party/torch/torch_api.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/types/span.h"
#include "data/answer_metrics.h"
#include "data/datasets.h"
#include "data/sft.h"
#include "gtest/gtest.h"
#include "model/generate.h"
#include "nlohmann/json.hpp"
#include "offload/job_assets.h"
#include "runtime/utf8.h"
#include "spec/job_spec.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"
#include "text/chat_template.h"

namespace lspo {
namespace {

using testing_jobs::SubmitAndWatch;

constexpr char kCooking[] = "datasets/cooking-stackexchange/";

// The metrics.jsonl lines of `kind`, in order.
std::vector<nlohmann::json> Lines(const std::string& dir, const std::string& kind) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.value("kind", "") == kind) out.push_back(std::move(j));
  }
  return out;
}

// The eval losses of metrics.jsonl, in order.
std::vector<double> EvalLosses(const std::string& dir) {
  std::vector<double> out;
  for (const auto& j : Lines(dir, "eval")) out.push_back(j.at("loss").get<double>());
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
    spec::ResolveDefaults(&resolved);
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
    spec::ResolveDefaults(&spec);
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

int64_t Int(const nlohmann::json& j, const char* key) {  // protobuf JSON writes int64 as text
  const auto& v = j.at(key);
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
}

// eval.metric generative: the zero-shot evaluation's answers are the greedy generations of
// the model as loaded (recomputed here with model::Generate from the same prompts), scored by
// data/answer_metrics.h; every evaluation reports them; the summary has zero-shot and final
// F1; the data summary lines of metrics.jsonl count what LoadSftExamples counts.
TEST(SftJobTest, GenerativeEvaluationScoresGreedyAnswers) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string out = testing_jobs::TempDir("sft-generative");
  v1::JobSpec spec = SftSpec(out, "train.alpaca.jsonl", 4);
  spec.mutable_data()->set_eval_path(std::string(kCooking) + "test.alpaca.jsonl");
  spec.mutable_eval()->set_metric(v1::EVAL_METRIC_GENERATIVE);
  spec.mutable_eval()->set_max_new_tokens(6);
  spec.mutable_eval()->set_max_generate_examples(3);
  const auto w = SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();

  // What the worker loaded, recomputed.
  v1::JobSpec resolved = spec;
  spec::ResolveDefaults(&resolved);
  auto tok = offload::LoadJobTokenizer(resolved);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto tmpl = model::ChatTemplate::ForTokenizer(*tok, "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const data::SftFormat alpaca = data::SftFormat::kAlpaca;
  data::DataSummary train_counts, eval_counts;
  ASSERT_TRUE(data::LoadSftExamples(resolved.data().train_path(), &alpaca, *tok, &*tmpl,
                                    resolved.seq_len(), 32, &train_counts).ok());
  auto eval = data::LoadSftExamples(resolved.data().eval_path(), &alpaca, *tok, &*tmpl,
                                    resolved.seq_len(), 8, &eval_counts);
  ASSERT_TRUE(eval.ok()) << eval.status();

  const auto data_lines = Lines(out, "data");
  ASSERT_EQ(data_lines.size(), 2u);
  EXPECT_EQ(data_lines[0].at("split"), "train");
  EXPECT_EQ(data_lines[0].at("format"), "alpaca");
  EXPECT_EQ(Int(data_lines[0], "examples"), 32);
  EXPECT_EQ(Int(data_lines[0], "tokens"), train_counts.tokens);
  EXPECT_EQ(Int(data_lines[0], "loss_tokens"), train_counts.loss_tokens);
  EXPECT_EQ(Int(data_lines[1], "tokens"), eval_counts.tokens);
  EXPECT_EQ(data_lines[1].at("rendered_example"), eval_counts.rendered_example);
  ASSERT_EQ(w.last.data_size(), 2);
  EXPECT_EQ(w.last.data(1).split(), "eval");

  // The zero-shot generations, recomputed from the model as loaded.
  auto model = offload::LoadJobModel(resolved);
  ASSERT_TRUE(model.ok()) << model.status();
  const auto evals = Lines(out, "eval");
  ASSERT_EQ(evals.size(), 2u);  // zero-shot and after the last step (eval_every = steps)
  const auto& zero = evals[0];
  ASSERT_EQ(zero.at("generated_examples").get<int>(), 3);
  ASSERT_EQ(zero.at("samples").size(), 3u);
  double f1 = 0, em = 0;
  for (int i = 0; i < 3; ++i) {
    const data::TokenizedExample& ex = (*eval)[i];
    model::GenerationOptions opts;
    opts.max_new_tokens = 6;
    opts.stop_ids = model::StopIds(model->config(), {tok->eos_id()});
    size_t end = ex.answer_start;
    while (end < ex.input_ids.size() && ex.labels[end] != data::kIgnoreIndex) ++end;
    if (tok->IsSpecial(ex.input_ids[end - 1])) opts.stop_ids.push_back(ex.input_ids[end - 1]);
    auto gen = model::Generate(*model, absl::MakeConstSpan(ex.input_ids).subspan(0, ex.answer_start),
                               opts);
    ASSERT_TRUE(gen.ok()) << gen.status();
    std::vector<int32_t> kept;
    for (int32_t id : gen->tokens) {
      if (!tok->IsSpecial(id)) kept.push_back(id);
    }
    const auto& sample = zero.at("samples")[i];
    // As tokenizers' decode shows it: a character cut at the last token becomes U+FFFD.
    EXPECT_EQ(sample.at("prediction").get<std::string>(), runtime::Utf8Lossy(tok->Decode(kept)))
        << i;
    std::vector<int32_t> answer;
    for (size_t t = ex.answer_start; t < end; ++t) {
      if (!tok->IsSpecial(ex.input_ids[t])) answer.push_back(ex.input_ids[t]);
    }
    EXPECT_EQ(sample.at("reference").get<std::string>(), runtime::Utf8Lossy(tok->Decode(answer)))
        << i;
    const data::AnswerScore score =
        data::ScoreAnswer(tok->Decode(kept), tok->Decode(answer));
    EXPECT_DOUBLE_EQ(sample.value("f1", 0.0), score.f1);
    f1 += score.f1;
    em += score.exact_match;
  }
  EXPECT_DOUBLE_EQ(zero.value("f1", 0.0), f1 / 3);
  EXPECT_DOUBLE_EQ(zero.value("exact_match", 0.0), em / 3);
  EXPECT_EQ(evals[1].at("generated_examples").get<int>(), 3);
  std::ifstream in(out + "/summary.json");
  const auto summary = nlohmann::json::parse(in, nullptr, false);
  ASSERT_TRUE(summary.is_object());
  EXPECT_DOUBLE_EQ(summary.at("zero_shot_f1").get<double>(), f1 / 3);
  EXPECT_DOUBLE_EQ(summary.at("final_f1").get<double>(), evals[1].value("f1", 0.0));
  EXPECT_EQ(summary.at("train_tokens").get<int64_t>(), train_counts.tokens);
  // The run report has the evaluation chart with the generative scores.
  std::ifstream report_in(out + "/report.html");
  const std::string report((std::istreambuf_iterator<char>(report_in)),
                           std::istreambuf_iterator<char>());
  EXPECT_NE(report.find("<svg"), std::string::npos);
  EXPECT_NE(report.find("F1 (tag set)"), std::string::npos);
}

// Text in non-Latin scripts through a generative evaluation, end to end (issue 43): byte-level
// BPE splits CJK, Cyrillic, Greek and Arabic characters over several tokens, so an example cut
// at seq_len ends mid-character, as greedy tokens may. The data summary's rendered example
// (cut: before the fix the worker's LoadJob reply could not be serialised and the job failed
// with "No message returned"), every sample in metrics.jsonl (a JSON writer refuses ill-formed
// UTF-8), the watch stream (a protobuf string must be UTF-8) and the run report are
// well-formed, a cut character as U+FFFD (tokenizers' decode shows it so), the rest intact.
TEST(SftJobTest, GenerativeEvaluationOfNonLatinTextKeepsEveryMessageWellFormed) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string out = testing_jobs::TempDir("sft-non-latin");
  const std::string data = out + "/non_latin.alpaca.jsonl";
  {
    // Answers long enough to be cut at seq_len 64, after prompts of different lengths (so
    // the cuts fall at different byte offsets of the multi-byte characters).
    const std::vector<std::pair<std::string, std::string>> rows = {
        {"料理", "鶏肉は中心温度が七十五度になるまで加熱してください。焼き色を付けてから弱火で蒸し焼きにすると、中まで火が通り、しっとり仕上がります。"},
        {"Как сварить рис?", "Промойте рис холодной водой, залейте водой в пропорции один к полутора, доведите до кипения и варите под крышкой на слабом огне пятнадцать минут."},
        {"Πώς ψήνω ψωμί;", "Ζυμώστε το αλεύρι με νερό, αλάτι και μαγιά, αφήστε τη ζύμη να φουσκώσει δύο ώρες και ψήστε στους διακόσιους βαθμούς για σαράντα λεπτά."},
        {"كيف أطبخ العدس؟", "اغسل العدس جيدا ثم ضعه في قدر مع الماء والبصل والكمون واتركه يغلي على نار هادئة لمدة عشرين دقيقة حتى ينضج تماما."},
        {"麺の茹で方を教えてください", "たっぷりのお湯を沸かし、塩を少し入れてから麺を入れます。袋に書かれた時間より一分短く茹で、ざるに上げて冷水でしめます。"},
        {"如何做蛋炒饭？", "先把米饭打散，锅里放油炒鸡蛋，盛出后再炒葱花和米饭，最后把鸡蛋倒回锅里，加盐和酱油翻炒均匀即可。"},
    };
    std::ofstream f(data);
    for (int k = 0; k < 2; ++k) {
      for (const auto& [q, a] : rows) {
        f << nlohmann::json{{"instruction", q}, {"input", ""}, {"output", a}}.dump() << "\n";
      }
    }
  }
  v1::JobSpec spec = SftSpec(out, "train.alpaca.jsonl", 2);
  spec.mutable_data()->set_train_path(data);
  spec.mutable_data()->set_eval_path(data);
  spec.set_seq_len(64);
  spec.mutable_eval()->set_metric(v1::EVAL_METRIC_GENERATIVE);
  spec.mutable_eval()->set_max_new_tokens(12);
  spec.mutable_eval()->set_max_generate_examples(6);
  const auto w = SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  const std::string kFffd = "\xEF\xBF\xBD";
  int cut = 0, samples = 0;  // examples cut inside a character; samples seen
  auto check = [&](const std::string& text, const std::string& where) {
    size_t bad = 0;
    EXPECT_TRUE(runtime::IsValidUtf8(text, &bad)) << where << ": ill-formed at byte " << bad;
  };
  const auto evals = Lines(out, "eval");
  ASSERT_EQ(evals.size(), 2u);
  for (const auto& e : evals) {
    ASSERT_EQ(e.at("samples").size(), 3u);
    for (const auto& sample : e.at("samples")) {
      const std::string ref = sample.at("reference").get<std::string>();
      const std::string pred = sample.at("prediction").get<std::string>();
      check(ref, "metrics.jsonl reference");
      check(pred, "metrics.jsonl prediction");
      ++samples;
      // The reference is a prefix of a row's answer, up to a cut character at its end.
      const std::string kept = ref.size() >= kFffd.size() &&
                                       ref.compare(ref.size() - kFffd.size(), kFffd.size(), kFffd) == 0
                                   ? ref.substr(0, ref.size() - kFffd.size())
                                   : ref;
      EXPECT_GT(kept.size(), 10u) << ref;
      std::ifstream in(data);
      bool found = false;
      for (std::string line; std::getline(in, line);) {
        const std::string answer = nlohmann::json::parse(line).at("output").get<std::string>();
        found |= answer.compare(0, kept.size(), kept) == 0;
      }
      EXPECT_TRUE(found) << "reference '" << ref << "' is not a prefix of any answer";
    }
  }
  // The examples are cut at seq_len, the first one inside a character.
  for (const auto& d : Lines(out, "data")) {
    const std::string r = d.at("rendered_example").get<std::string>();
    check(r, "metrics.jsonl rendered_example");
    if (r.find(kFffd + "]]") != std::string::npos) ++cut;
  }
  EXPECT_GT(cut, 0) << "no example was cut mid-character: the test data no longer tests the cut";
  ASSERT_EQ(w.last.data_size(), 2);
  for (const auto& d : w.last.data()) check(d.rendered_example(), "watch stream data summary");
  // The watch stream carried the samples (protobuf strings: well-formed).
  ASSERT_GT(w.last.evals_size(), 0);
  for (const auto& e : w.last.evals()) {
    for (const auto& sample : e.samples()) {
      check(sample.reference(), "watch stream reference");
      check(sample.prediction(), "watch stream prediction");
    }
  }
  std::ifstream report_in(out + "/report.html");
  const std::string report((std::istreambuf_iterator<char>(report_in)), {});
  EXPECT_NE(report.find("<svg"), std::string::npos);
  check(report, "report.html");
  EXPECT_EQ(samples, 6);
}

// data.packing end to end: the worker trains on PackExamples of the loaded examples (the
// data line's packed_rows), step 1's loss is the loss-token-weighted mean of the losses its
// examples have alone under the model as loaded (recomputed here one example at a time), so
// the worker hands the packed layout to the model; the same rows attended plainly (no
// layout) give a clearly different loss. The padding share of the steps' input falls
// against the same job unpacked.
TEST(SftJobTest, PackedRowsTrainEveryExampleAsAlone) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  double padding[2] = {0, 0};
  for (const bool packing : {false, true}) {
    SCOPED_TRACE(packing);
    const std::string out = testing_jobs::TempDir("sft-packing");
    v1::JobSpec spec = SftSpec(out, "train.alpaca.jsonl", 2);
    spec.set_seq_len(256);  // the cooking examples are 40 to 96+ tokens: 2 to 5 per row
    spec.mutable_data()->set_packing(packing);
    const auto w = SubmitAndWatch(stub.get(), spec);
    ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
    std::ifstream in(out + "/summary.json");
    const auto summary = nlohmann::json::parse(in, nullptr, false);
    ASSERT_TRUE(summary.is_object());
    padding[packing] = summary.at("padding_fraction").get<double>();
    EXPECT_EQ(summary.at("train_examples").get<int64_t>(), 32);
    if (!packing) continue;

    v1::JobSpec resolved = spec;
    spec::ResolveDefaults(&resolved);
    auto tok = offload::LoadJobTokenizer(resolved);
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto tmpl = model::ChatTemplate::ForTokenizer(*tok, "");
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    const data::SftFormat alpaca = data::SftFormat::kAlpaca;
    data::DataSummary counts;
    auto train = data::LoadSftExamples(resolved.data().train_path(), &alpaca, *tok, &*tmpl,
                                       resolved.seq_len(), 32, &counts);
    ASSERT_TRUE(train.ok()) << train.status();
    const std::vector<data::TokenizedExample> rows =
        data::PackExamples(*train, resolved.seq_len());
    ASSERT_LT(rows.size(), train->size()) << "nothing was packed";
    const auto data_lines = Lines(out, "data");
    ASSERT_FALSE(data_lines.empty());
    EXPECT_EQ(Int(data_lines[0], "packed_rows"), static_cast<int64_t>(rows.size()));
    EXPECT_EQ(Int(data_lines[0], "examples"), 32);
    EXPECT_EQ(summary.at("train_packed_rows").get<int64_t>(), static_cast<int64_t>(rows.size()));

    // Step 1's rows: the epoch-0 order over the rows (worker_core.cc StepBatches).
    const std::vector<int64_t> order =
        data::ShuffledOrder(static_cast<int64_t>(rows.size()), resolved.seed(), 0);
    const int64_t n_rows = resolved.micro_batch_size() * resolved.grad_accum();
    auto model = offload::LoadJobModel(resolved);
    ASSERT_TRUE(model.ok()) << model.status();
    at::NoGradGuard no_grad;
    const auto lopts = at::TensorOptions().dtype(at::kLong);
    double weighted = 0, k_total = 0;
    std::vector<const data::TokenizedExample*> step_rows;
    for (int64_t r = 0; r < n_rows; ++r) {
      const data::TokenizedExample& row = rows[order[r]];
      step_rows.push_back(&row);
      for (size_t s = 0; s < row.segment_starts.size(); ++s) {
        const int64_t begin = row.segment_starts[s];
        const int64_t end = s + 1 < row.segment_starts.size()
                                ? row.segment_starts[s + 1]
                                : static_cast<int64_t>(row.input_ids.size());
        std::vector<int64_t> ids(row.input_ids.begin() + begin, row.input_ids.begin() + end);
        std::vector<int64_t> labels(row.labels.begin() + begin, row.labels.begin() + end);
        double k = 0;
        for (size_t t = 1; t < labels.size(); ++t) k += labels[t] != data::kIgnoreIndex;
        if (k == 0) continue;
        const int64_t len = end - begin;
        const double loss =
            model->CausalLmLoss(torch::tensor(ids, lopts).view({1, len}),
                                torch::tensor(labels, lopts).view({1, len}))
                .item<double>();
        weighted += loss * k;
        k_total += k;
      }
    }
    const double alone = weighted / k_total;
    const auto steps = Lines(out, "step");
    ASSERT_GE(steps.size(), 1u);
    const double step1 = steps[0].at("loss").get<double>();
    // fp32 sums: 4e-8 relative apart here. The tiny random model attends almost uniformly,
    // so crossing a boundary (the control below) moves the loss by only 1.6e-5 relative.
    const double tol = 1e-6 * alone;
    EXPECT_NEAR(step1, alone, tol);
    EXPECT_GT(Int(steps[0], "padding_tokens"), 0);
    // Control: the step's rows as one sequence each (no RowLayout).
    const data::Batch b = data::MakeBatch(step_rows, tok->pad_id());
    ASSERT_TRUE(b.packed());
    const double plain =
        model->CausalLmLoss(torch::tensor(b.input_ids, lopts).view({b.batch_size, b.seq_len}),
                            torch::tensor(b.labels, lopts).view({b.batch_size, b.seq_len}))
            .item<double>();
    EXPECT_GT(std::abs(plain - alone), 10 * tol) << "the control saw no boundary";
  }
  EXPECT_LT(padding[1], padding[0]) << "packing saves padding";
}

// data.packing is refused where it has no meaning: text data (already seq_len blocks) and
// class-balanced order (a packed row mixes classes).
TEST(SftJobTest, PackingOfTextOrBalancedDataIsRefused) {
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec("/tmp/unused", v1::MODE_LSP, 2);
  spec.mutable_data()->set_packing(true);
  spec::ResolveDefaults(&spec);
  absl::Status st = spec::ValidateJobSpec(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("data.packing"), std::string::npos) << st;
  spec.mutable_data()->set_format(v1::DATA_FORMAT_CLASSIFICATION);
  EXPECT_TRUE(spec::ValidateJobSpec(spec).ok());
  spec.mutable_data()->set_balance_classes(true);
  st = spec::ValidateJobSpec(spec);
  EXPECT_NE(std::string(st.message()).find("balance_classes"), std::string::npos) << st;
}

// A cancel during an evaluation stops it between batches or generated answers (the worker
// polls its cancelled RPC) instead of letting it run to the end: the job ends CANCELLED with
// no eval line logged, and its report says so. Uncancelled, this zero-shot evaluation would
// generate 4622 answers of up to 64 tokens.
TEST(SftJobTest, CancelStopsARunningEvaluation) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string out = testing_jobs::TempDir("sft-cancel-eval");
  v1::JobSpec spec = SftSpec(out, "train.alpaca.jsonl", 4);
  spec.mutable_data()->set_eval_path(std::string(kCooking) + "test.alpaca.jsonl");
  spec.mutable_data()->set_max_eval_examples(0);
  spec.mutable_eval()->set_metric(v1::EVAL_METRIC_GENERATIVE);
  spec.mutable_eval()->set_max_new_tokens(64);
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobReply rep;
  ASSERT_TRUE(stub->SubmitJob(&ctx, req, &rep).ok());
  for (;;) {  // until the zero-shot evaluation runs
    grpc::ClientContext gctx;
    v1::GetJobRequest g;
    g.set_job_id(rep.job_id());
    v1::JobStatus s;
    ASSERT_TRUE(stub->GetJob(&gctx, g, &s).ok());
    ASSERT_NE(s.state(), v1::FAILED) << s.error();
    if (absl::StrContains(s.phase(), "evaluating")) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // well inside it
  const v1::JobStatus last = testing_jobs::CancelAndWatch(stub.get(), rep.job_id());
  EXPECT_EQ(last.state(), v1::CANCELLED) << last.error();
  EXPECT_TRUE(Lines(out, "eval").empty()) << "the evaluation ran to its end";
  EXPECT_TRUE(Lines(out, "step").empty());
  std::ifstream report_in(out + "/report.html");
  const std::string report((std::istreambuf_iterator<char>(report_in)),
                           std::istreambuf_iterator<char>());
  EXPECT_NE(report.find("cancelled"), std::string::npos);
}

// A generative evaluation of text data, or without evaluation data, is refused with the
// field named.
TEST(SftJobTest, GenerativeEvaluationOfTextDataIsRefused) {
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec("/tmp/unused", v1::MODE_LSP, 2);
  spec.mutable_eval()->set_metric(v1::EVAL_METRIC_GENERATIVE);
  spec::ResolveDefaults(&spec);
  absl::Status st = spec::ValidateJobSpec(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("eval.metric"), std::string::npos) << st;
  spec.mutable_data()->set_format(v1::DATA_FORMAT_ALPACA);
  spec.mutable_data()->clear_eval_path();
  st = spec::ValidateJobSpec(spec);
  EXPECT_NE(std::string(st.message()).find("data.eval_path"), std::string::npos) << st;
  spec.mutable_data()->set_eval_path(std::string(kCooking) + "test.alpaca.jsonl");
  spec.mutable_eval()->set_max_new_tokens(-1);
  st = spec::ValidateJobSpec(spec);
  EXPECT_NE(std::string(st.message()).find("eval.max_new_tokens"), std::string::npos) << st;
}

}  // namespace
}  // namespace lspo
