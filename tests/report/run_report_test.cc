// The run report (report/run_report.h): the charts drawn from a metrics.jsonl, the header
// tables, escaping, the axis ticks, and writing report.html.
#include "report/run_report.h"

#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/file_io.h"

namespace lspo::scheduler {
namespace {

namespace fs = std::filesystem;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

std::string TempDir() {
  std::string templ = (fs::path(::testing::TempDir()) / "lspo-report-XXXXXX").string();
  EXPECT_NE(::mkdtemp(templ.data()), nullptr);
  return templ;
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + needle.size())) {
    ++n;
  }
  return n;
}

// Three steps (step 3 logged twice, as a resumed run does: the second wins), two evaluations
// with accuracy, a projector fit, a data line whose path needs escaping, a bad line, a
// non-object line and lines of kinds the report ignores. int64 fields as strings.
constexpr char kMetrics[] =
    R"({"kind":"data","split":"train","path":"data/<a&b>'q\".jsonl","format":"chat","examples":"12","tokens":"340","loss_tokens":"200","truncated":"1","skipped":"0","longest":"99","step":0}
{"kind":"eval","step":0,"loss":3.5,"accuracy":0.25,"perplexity":0,"examples":8,"seconds":1.5}
{"kind":"projector_fit","step":0,"mean_initial_relative_bias":6.5,"mean_final_relative_bias":0.375,"refitted":4,"seconds":2}
{"kind":"step","step":1,"loss":4.0,"lr":0.0001,"tokens":"20","step_seconds":2.0,"forward_seconds":0.75,"backward_seconds":1.0,"update_seconds":0.125,"apply_seconds":0,"wait_seconds":0,"tokens_per_second":30}
{"kind":"step","step":2,"loss":3.0,"lr":0.0002,"tokens":"20","step_seconds":2.0,"forward_seconds":0.75,"backward_seconds":1.0,"update_seconds":0.125,"apply_seconds":0,"wait_seconds":0,"tokens_per_second":40}
this is not json {
[1, 2, 3]
{"kind":"step","step":3,"loss":7.77,"lr":0.0003,"tokens":"20","step_seconds":2.0,"forward_seconds":0.75,"backward_seconds":1.0,"update_seconds":0.125,"apply_seconds":0,"wait_seconds":0,"tokens_per_second":50}
{"kind":"resume","step":2}
{"kind":"step","step":3,"loss":1.25,"lr":0.0003,"tokens":"20","step_seconds":2.0,"forward_seconds":0.75,"backward_seconds":1.0,"update_seconds":0.125,"apply_seconds":0,"wait_seconds":0,"tokens_per_second":50}
{"kind":"checkpoint","step":3,"path":"checkpoints/step-00000003"}
{"kind":"master_drift","step":3,"max_abs_diff":1e-06}
{"kind":"eval","step":3,"loss":1.5,"accuracy":0.75,"perplexity":0,"exact_match":0,"f1":0,"examples":8,"seconds":1.5}
)";

TEST(NiceTicksTest, KnownRanges) {
  const std::vector<double> unit = NiceTicks(0, 1, 6);
  ASSERT_EQ(unit.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_THAT(unit[i], DoubleNear(0.2 * i, 1e-12)) << i;
  EXPECT_EQ(unit, (std::vector<double>{0, 0.2, 0.4, 0.6, 0.8, 1.0}));  // Nearest doubles.
  EXPECT_EQ(NiceTicks(1, 0, 6), unit);                                 // Swapped.
  EXPECT_THAT(NiceTicks(0, 8.5, 6), ElementsAre(0, 2, 4, 6, 8, 10));
  EXPECT_THAT(NiceTicks(1, 60, 11), ElementsAre(0, 10, 20, 30, 40, 50, 60));
  EXPECT_THAT(NiceTicks(-0.3, 0.7, 6), ElementsAre(-0.5, 0, 0.5, 1));
  EXPECT_THAT(NiceTicks(12, 13, 3), ElementsAre(12, 12.5, 13));
  EXPECT_THAT(NiceTicks(0.00012, 0.0006, 6),
              ElementsAre(0.0001, 0.0002, 0.0003, 0.0004, 0.0005, 0.0006));
  EXPECT_THAT(NiceTicks(0, 1, 1), ElementsAre(0, 0.5, 1));  // max_ticks raised to 3.
}

TEST(NiceTicksTest, ConstantSeriesGetsSeveralTicksAroundTheValue) {
  const std::vector<double> t = NiceTicks(3, 3, 5);
  ASSERT_GE(t.size(), 2u);
  EXPECT_LE(t.size(), 5u);
  EXPECT_LT(t.front(), 3);
  EXPECT_GT(t.back(), 3);
  EXPECT_THAT(NiceTicks(0, 0, 5), ElementsAre(0, 0.5, 1));
  EXPECT_THAT(NiceTicks(-2, -2, 6), ElementsAre(-2.2, -2.1, -2, -1.9, -1.8));
}

TEST(NiceTicksTest, NonFiniteGivesNone) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_TRUE(NiceTicks(std::nan(""), 1, 5).empty());
  EXPECT_TRUE(NiceTicks(0, inf, 5).empty());
  EXPECT_TRUE(NiceTicks(-inf, 0, 5).empty());
}

TEST(NiceTicksTest, CoverTheRangeWithinMaxTicks) {
  const double ranges[][2] = {{0.013, 0.97}, {-7, 1234}, {1e-9, 3e-9},
                              {5, 5.001},    {-1e6, -3}, {0.1, 0.1000001}};
  for (const auto& r : ranges) {
    for (int max_ticks = 3; max_ticks <= 12; ++max_ticks) {
      const std::vector<double> t = NiceTicks(r[0], r[1], max_ticks);
      ASSERT_GE(t.size(), 2u) << r[0] << " " << r[1] << " " << max_ticks;
      EXPECT_LE(t.size(), static_cast<size_t>(max_ticks));
      EXPECT_LE(t.front(), r[0] + 1e-12 * std::abs(r[0]));
      EXPECT_GE(t.back(), r[1] - 1e-12 * std::abs(r[1]));
      for (size_t i = 1; i < t.size(); ++i) EXPECT_LT(t[i - 1], t[i]);
    }
  }
}

TEST(RunReportTest, OneChartPerMeasuredQuantity) {
  const std::string html = RunReportHtml(kMetrics, "my<run>");
  EXPECT_TRUE(absl::StartsWith(html, "<!DOCTYPE html>"));
  EXPECT_THAT(html, HasSubstr("<title>Run report: my&lt;run&gt;</title>"));
  EXPECT_THAT(html, Not(HasSubstr("my<run>")));
  // Loss, evaluation metrics, learning rate, step time, projector bias; no perplexity.
  EXPECT_EQ(Count(html, "<svg"), 5);
  EXPECT_EQ(Count(html, "</svg>"), 5);
  for (const char* title : {">Loss</text>", ">Evaluation metrics</text>", ">Learning rate</text>",
                            ">Step time by phase</text>", ">Projector estimation bias</text>"}) {
    EXPECT_THAT(html, HasSubstr(title));
  }
  EXPECT_THAT(html, HasSubstr("Perplexity: not measured."));
  EXPECT_THAT(html, Not(HasSubstr(">Perplexity</text>")));
  // No JavaScript, no external resources.
  EXPECT_THAT(html, Not(HasSubstr("<script")));
  EXPECT_THAT(html, Not(HasSubstr("href=")));
  EXPECT_THAT(html, Not(HasSubstr("src=")));
}

TEST(RunReportTest, LegendsAndAxisTitles) {
  const std::string html = RunReportHtml(kMetrics, "run");
  for (const char* legend :
       {">train loss</text>", ">eval loss</text>", ">accuracy</text>", ">learning rate</text>",
        ">forward</text>", ">backward</text>", ">update</text>",
        ">whole step (step_seconds)</text>", ">before fit</text>", ">after fit</text>"}) {
    EXPECT_THAT(html, HasSubstr(legend));
  }
  // Phases that are zero in every step line, metrics that were not measured: no entry.
  for (const char* absent : {">apply</text>", ">wait</text>", ">offload</text>",
                             ">exact match</text>", ">F1 (tag set)</text>", ">perplexity</text>"}) {
    EXPECT_THAT(html, Not(HasSubstr(absent)));
  }
  EXPECT_EQ(Count(html, ">optimizer step</text>"), 5);  // Every chart's x axis.
  EXPECT_THAT(html, HasSubstr(">loss (nats per token)</text>"));
  EXPECT_THAT(html, HasSubstr(">time per step (s)</text>"));
  EXPECT_THAT(html, HasSubstr(">score (fraction, 0 to 1)</text>"));
  EXPECT_THAT(html, HasSubstr(">mean relative bias (unitless)</text>"));
  // lr 1e-4..3e-4: labelled 0 ... 3, the axis' scale 10^-4 in its title.
  EXPECT_THAT(html, HasSubstr(">learning rate ×10⁻⁴</text>"));
  // The accuracy axis (0.25..0.75 with 0 included): ticks 0, 0.2, ..., 0.8.
  EXPECT_THAT(html, HasSubstr(">0.8</text>"));
}

TEST(RunReportTest, HeaderTableTakesTheLastLineOfAResumedStep) {
  const std::string html = RunReportHtml(kMetrics, "run");
  EXPECT_THAT(html, HasSubstr("<th>steps</th><td>3 (step 1 to 3)</td>"));
  EXPECT_THAT(html, HasSubstr("<th>final train loss</th><td>1.25 (step 3)</td>"));
  EXPECT_THAT(html, Not(HasSubstr("7.77")));
  EXPECT_THAT(html, HasSubstr("<th>tokens/s (mean)</th><td>40.0</td>"));
  EXPECT_THAT(html, HasSubstr("<th>loss tokens (total)</th><td>60</td>"));
  EXPECT_THAT(html, HasSubstr("<th>evaluations</th><td>2</td>"));
  EXPECT_THAT(html, HasSubstr("<th>last evaluation (step 3)</th><td>loss 1.5, accuracy 0.75, "
                              "examples 8</td>"));
  EXPECT_THAT(html, HasSubstr("<th>projector fits</th><td>1 (last, step 0: bias 6.5 before, "
                              "0.375 after)</td>"));
}

TEST(RunReportTest, DataLinesAreEscaped) {
  const std::string html = RunReportHtml(kMetrics, "run");
  EXPECT_THAT(html, HasSubstr("<td>data/&lt;a&amp;b&gt;&#39;q&quot;.jsonl</td><td>chat</td>"
                              "<td class=\"n\">12</td><td class=\"n\">340</td>"
                              "<td class=\"n\">200</td>"));
  EXPECT_THAT(html, Not(HasSubstr("<a&b>")));
}

TEST(RunReportTest, NoDataGivesNoCharts) {
  for (const char* input : {"", "garbage\n{\n", R"({"kind":"checkpoint","step":1})"}) {
    const std::string html = RunReportHtml(input, "empty");
    EXPECT_EQ(Count(html, "<svg"), 0) << input;
    for (const char* line :
         {"Loss: not measured.", "Evaluation metrics: not measured.", "Perplexity: not measured.",
          "Learning rate: not measured.", "Step time by phase: not measured.",
          "Projector estimation bias: not measured."}) {
      EXPECT_THAT(html, HasSubstr(line)) << input;
    }
    EXPECT_THAT(html, HasSubstr("<th>steps</th><td>none logged</td>"));
  }
}

TEST(RunReportTest, SinglePointConstantAndNonFiniteValues) {
  // One step (a constant lr), a NaN loss in protobuf's JSON spelling, an infinite eval loss,
  // a perplexity and generative metrics.
  const std::string html = RunReportHtml(
      R"({"kind":"step","step":5,"loss":"NaN","lr":0.001,"step_seconds":1,"forward_seconds":1}
{"kind":"step","step":"6","loss":2,"lr":0.001,"step_seconds":1,"forward_seconds":1}
{"kind":"eval","step":6,"loss":"Infinity","perplexity":7.5,"exact_match":0.5,"f1":0.625,"generated_examples":4}
)",
      "run");
  // Loss (train 2 at step 6), evaluation metrics, perplexity, learning rate, step time.
  EXPECT_EQ(Count(html, "<svg"), 5);
  EXPECT_THAT(html, HasSubstr(">exact match</text>"));
  EXPECT_THAT(html, HasSubstr(">F1 (tag set)</text>"));
  EXPECT_THAT(html, HasSubstr(">Perplexity</text>"));
  EXPECT_THAT(html, HasSubstr("Projector estimation bias: not measured."));
  EXPECT_THAT(html, HasSubstr("<th>final train loss</th><td>2 (step 6)</td>"));
  // No NaN or infinite coordinates reach the SVG.
  EXPECT_THAT(html, Not(HasSubstr("nan")));
  EXPECT_THAT(html, Not(HasSubstr("inf")));
}

TEST(RunReportTest, WritesReportHtmlIntoTheRunFolder) {
  const std::string dir = TempDir();
  ASSERT_TRUE(runtime::WriteFileSynced(dir + "/metrics.jsonl", kMetrics).ok());
  ASSERT_TRUE(WriteRunReport(dir + "/").ok());
  auto html = runtime::ReadFileToString(dir + "/report.html");
  ASSERT_TRUE(html.ok()) << html.status();
  EXPECT_EQ(*html, RunReportHtml(kMetrics, fs::path(dir).filename().string()));
  EXPECT_THAT(*html, HasSubstr(absl::StrCat("<h1>Run report: ", fs::path(dir).filename().string(),
                                            "</h1>")));
}

// How the job ended is shown, escaped; a generative score of 0 and a classification accuracy
// of 0 are shown as measured, not hidden.
TEST(RunReportTest, ShowsTheOutcomeAndMeasuredZeros) {
  const std::string html = RunReportHtml(kMetrics, "run", "failed: bad.jsonl:5: missing <output>");
  EXPECT_THAT(html, HasSubstr("<p class=\"outcome\">Job: failed: bad.jsonl:5: missing "
                              "&lt;output&gt;</p>"));
  EXPECT_THAT(RunReportHtml(kMetrics, "run"), Not(HasSubstr("class=\"outcome\"")));
  const std::string zeros = RunReportHtml(
      R"({"kind":"data","step":0,"split":"eval","format":"classification","examples":"8"}
{"kind":"eval","step":0,"loss":3.5,"accuracy":0,"exact_match":0,"f1":0,"precision":0,"recall":0,"generated_examples":8,"examples":8}
)",
      "run");
  EXPECT_THAT(zeros, HasSubstr("loss 3.5, accuracy 0, exact match 0, F1 0, precision 0, recall 0"));
}

// The padding share is summed over the steps (a step without padding has no padding_tokens
// field: proto JSON omits zeros): (25 + 0 + 5) / 300.
TEST(RunReportTest, PaddingShareIsSummedOverTheSteps) {
  const std::string html = RunReportHtml(
      R"({"kind":"step","step":1,"loss":2,"input_tokens":"100","padding_tokens":"25"}
{"kind":"step","step":2,"loss":2,"input_tokens":"100"}
{"kind":"step","step":3,"loss":2,"input_tokens":"100","padding_tokens":"5"}
)",
      "run");
  EXPECT_THAT(html, HasSubstr("<th>padding (share of input tokens)</th><td>10.0%</td>"));
  EXPECT_THAT(RunReportHtml(kMetrics, "run"), Not(HasSubstr("padding (share")));
}

// A data-parallel rank's step lines carry the bytes it all-reduced (int64: a JSON string) and
// the seconds, of which the step waited for the exposed ones.
TEST(RunReportTest, AllReducedBytesOfADataParallelRunAreShown) {
  const std::string html = RunReportHtml(
      R"({"kind":"step","step":1,"loss":2,"all_reduce_bytes":"2000024","all_reduce_seconds":0.5,"all_reduce_exposed_seconds":0.5}
{"kind":"step","step":2,"loss":2,"all_reduce_bytes":"2000024","all_reduce_seconds":0.25,"all_reduce_exposed_seconds":0.05}
)",
      "run");
  EXPECT_THAT(html, HasSubstr("<th>all-reduced per step (data parallel, mean)</th><td>2 MB in "
                              "0.375 s (0.275 s of it exposed)</td>"));
  EXPECT_THAT(RunReportHtml(kMetrics, "run"), Not(HasSubstr("all-reduced")));
}

TEST(RunReportTest, MissingMetricsIsNotFoundNamingTheFile) {
  const std::string dir = TempDir();
  const absl::Status s = WriteRunReport(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir + "/metrics.jsonl"));
  EXPECT_FALSE(fs::exists(dir + "/report.html"));
}

}  // namespace
}  // namespace lspo::scheduler
