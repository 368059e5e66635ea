// TensorBoard events files (report/tensorboard.h), the scalars of metrics.jsonl lines
// (report/tensorboard_scalars.h) and the run log that joins them (report/run_log.h).
// The oracle (tests/oracle/make_tensorboard_oracle.py, tensorboard 2.21.0): the event records
// equal, byte for byte, those TensorBoard's own writer wrote for the same scalars, and the
// values are those TensorBoard's EventAccumulator read back from a file this writer wrote.
#include "report/tensorboard.h"

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/tensorboard_event.pb.h"
#include "report/run_log.h"
#include "report/tensorboard_scalars.h"
#include "runtime/file_io.h"
#include "runtime/tfrecord.h"

namespace lspo::scheduler {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;
using ::testing::StartsWith;

constexpr char kOracleJson[] = "tests/oracle/data/tensorboard_oracle.json";
constexpr char kOracleEvents[] = "tests/oracle/data/tensorboard_events.tfevents";

std::string TempDir() {
  std::string templ = (fs::temp_directory_path() / "lspo-tb-XXXXXX").string();
  EXPECT_NE(::mkdtemp(templ.data()), nullptr);
  return templ;
}

std::vector<std::string> Records(const std::string& path) {
  auto bytes = runtime::ReadFileToString(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return {};
  auto records = runtime::ParseTfRecords(*bytes, path);
  EXPECT_TRUE(records.ok()) << records.status();
  return records.ok() ? *records : std::vector<std::string>();
}

std::vector<ScalarEvent> Events(const std::string& path) {
  auto events = ReadScalarEvents(path);
  EXPECT_TRUE(events.ok()) << events.status();
  return events.ok() ? *events : std::vector<ScalarEvent>();
}

std::map<std::string, float> TagValues(const LineScalars& s) {
  std::map<std::string, float> m;
  for (const auto& v : s.scalars) m[v.tag] = v.value;
  return m;
}

TEST(TensorBoardTest, EventsFileNamesFollowTensorBoardsPattern) {
  EXPECT_EQ(EventsFileName(1764600000, "host-a.example", 4242, 0),
            "events.out.tfevents.1764600000.host-a.example.4242.0");
  EXPECT_EQ(EventsFileName(12, "h", 1, 7), "events.out.tfevents.0000000012.h.1.7");
}

TEST(TensorBoardTest, FileVersionFirstThenTheScalarsOnFlush) {
  const std::string dir = TempDir();
  auto w = EventFileWriter::Create(dir, 1764600000.75);
  ASSERT_TRUE(w.ok()) << w.status();
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof(host) - 1), 0);
  EXPECT_EQ(fs::path(w->path()).parent_path().string(), dir);
  EXPECT_THAT(fs::path(w->path()).filename().string(),
              StartsWith(std::string("events.out.tfevents.1764600000.") + host + "." +
                         std::to_string(::getpid()) + "."));
  EXPECT_THAT(ListEventsFiles(dir), ElementsAre(w->path()));
  // The file_version event is on disk at once; scalars wait for Flush.
  std::vector<std::string> records = Records(w->path());
  ASSERT_THAT(records, SizeIs(1));
  tb::Event version;
  ASSERT_TRUE(version.ParseFromString(records[0]));
  EXPECT_EQ(version.file_version(), "brain.Event:2");
  EXPECT_EQ(version.wall_time(), 1764600000.75);
  EXPECT_EQ(version.step(), 0);
  w->AddScalar("train/loss", 1, 2.5f, 1764600001.0);
  w->AddScalar("train/loss", 2, 0.0f, 1764600002.0);
  EXPECT_THAT(Records(w->path()), SizeIs(1));
  ASSERT_TRUE(w->Flush().ok());
  std::vector<ScalarEvent> events = Events(w->path());
  ASSERT_THAT(events, SizeIs(2));
  EXPECT_EQ(events[0].tag, "train/loss");
  EXPECT_EQ(events[0].step, 1);
  EXPECT_EQ(events[0].value, 2.5f);
  EXPECT_EQ(events[0].wall_time, 1764600001.0);
  EXPECT_EQ(events[1].step, 2);
  EXPECT_EQ(events[1].value, 0.0f);
  ASSERT_TRUE(w->Close().ok());
  EXPECT_TRUE(w->Close().ok());
  fs::remove_all(dir);
}

TEST(TensorBoardTest, ANewFileSortsAfterTheFilesAlreadyInTheFolder) {
  // TensorBoard reads a folder's files in name order: a file created in the same second as
  // an earlier one (or with a clock behind it) still sorts after it.
  const std::string dir = TempDir();
  std::vector<std::string> paths;
  for (double wall : {2000000000.5, 2000000000.9, 1000000000.0}) {
    auto w = EventFileWriter::Create(dir, wall);
    ASSERT_TRUE(w.ok()) << w.status();
    paths.push_back(w->path());
  }
  EXPECT_EQ(ListEventsFiles(dir), paths);
  EXPECT_THAT(fs::path(paths[1]).filename().string(),
              StartsWith("events.out.tfevents.2000000001."));
  EXPECT_THAT(fs::path(paths[2]).filename().string(),
              StartsWith("events.out.tfevents.2000000002."));
  ASSERT_TRUE(RemoveEventsFiles(dir).ok());
  EXPECT_TRUE(ListEventsFiles(dir).empty());
  EXPECT_TRUE(RemoveEventsFiles(dir + "/missing").ok());
  fs::remove_all(dir);
}

TEST(TensorBoardTest, ErrorsNameTheFile) {
  const std::string dir = TempDir();
  auto missing = EventFileWriter::Create(dir + "/no-such-dir", 1.0);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir + "/no-such-dir/events.out.tfevents."));
  EXPECT_EQ(EventFileWriter::Create(dir, std::nan("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EventFileWriter::Create(dir, -1).status().code(), absl::StatusCode::kInvalidArgument);

  auto w = EventFileWriter::Create(dir, 10.0);
  ASSERT_TRUE(w.ok());
  const std::string path = w->path();
  ASSERT_TRUE(w->Close().ok());
  w->AddScalar("late", 1, 1.0f, 11.0);
  absl::Status st = w->Flush();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr(path));

  // A damaged file, and a record that is no Event.
  { std::ofstream(path, std::ios::app) << "junk"; }
  auto damaged = ReadScalarEvents(path);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(damaged.status().message(), HasSubstr(path));
  std::string not_event;
  runtime::AppendTfRecord("\xff\xff\xff", &not_event);
  ASSERT_TRUE(runtime::WriteFileSynced(path, not_event).ok());
  auto bad = ReadScalarEvents(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("record 0 is not an Event"));
  EXPECT_EQ(ReadScalarEvents(dir + "/none").status().code(), absl::StatusCode::kNotFound);
  fs::remove_all(dir);
}

TEST(TensorBoardOracleTest, MatchesTensorBoardsWriterAndReader) {
  auto text = runtime::ReadFileToString(kOracleJson);
  ASSERT_TRUE(text.ok()) << text.status();
  const nlohmann::json oracle = nlohmann::json::parse(*text);
  // Oracle mode (tests/oracle/make_tensorboard_oracle.py): write the file into the folder
  // the script names, before the script has stored what TensorBoard reads back from it.
  const char* oracle_out = std::getenv("LSPO_TB_ORACLE_OUT");
  const std::string dir = oracle_out != nullptr ? std::string(oracle_out) : TempDir();
  std::string path;
  {
    auto w = EventFileWriter::Create(dir, 1764600000.0);
    ASSERT_TRUE(w.ok()) << w.status();
    path = w->path();
    for (const auto& s : oracle.at("scalars")) {
      w->AddScalar(s.at("tag").get<std::string>(), s.at("step").get<int64_t>(),
                   static_cast<float>(s.at("value").get<double>()),
                   s.at("wall_time").get<double>());
    }
    ASSERT_TRUE(w->Close().ok());
  }
  if (oracle_out != nullptr) GTEST_SKIP() << "wrote " << path << " for the oracle script";

  // The records after the file_version event, byte for byte.
  const std::vector<std::string> ours = Records(path);
  const std::vector<std::string> theirs = Records(kOracleEvents);
  ASSERT_EQ(ours.size(), oracle.at("scalars").size() + 1);
  ASSERT_EQ(ours.size(), theirs.size());
  for (size_t i = 1; i < ours.size(); ++i) EXPECT_EQ(ours[i], theirs[i]) << "record " << i;
  tb::Event version;
  ASSERT_TRUE(version.ParseFromString(theirs[0]));
  EXPECT_EQ(version.file_version(), "brain.Event:2");

  // The values EventAccumulator read back from this writer's file (float32, exact).
  const std::vector<ScalarEvent> events = Events(path);
  size_t checked = 0;
  for (const auto& [tag, points] : oracle.at("read_back").items()) {
    std::vector<ScalarEvent> of_tag;
    for (const ScalarEvent& e : events) {
      if (e.tag == tag) of_tag.push_back(e);
    }
    ASSERT_EQ(of_tag.size(), points.size()) << tag;
    for (size_t i = 0; i < of_tag.size(); ++i) {
      EXPECT_EQ(of_tag[i].step, points[i][0].get<int64_t>()) << tag;
      EXPECT_EQ(static_cast<double>(of_tag[i].value), points[i][1].get<double>()) << tag;
      EXPECT_EQ(of_tag[i].wall_time, points[i][2].get<double>()) << tag;
    }
    checked += of_tag.size();
  }
  EXPECT_EQ(checked, events.size());
  EXPECT_EQ(checked, oracle.at("scalars").size());
  fs::remove_all(dir);
}

TEST(TensorBoardScalarsTest, AStepLineGivesTrainTimeOffloadAndMemoryScalars) {
  // A step line of runs/quickstart2/metrics.jsonl (int64 fields are JSON strings).
  const auto line = nlohmann::json::parse(R"({"apply_seconds":0.484237856,
      "backward_seconds":16.024780604,"d2h_bytes":"1024","d2h_seconds":0.5,
      "forward_seconds":10.111211374,"gpu_memory_used_bytes":"0","gpu_peak_allocated_bytes":"0",
      "grad_norm":92.49616661781681,"h2d_bytes":"2048","h2d_seconds":0.25,"kind":"step",
      "loss":8.5459623336792,"lr":0.00011999999999999999,"offload_seconds":0.026753585998449125,
      "optimizer_peak_rss_bytes":"4151947264","split_layer":3,"step":1,
      "step_seconds":26.752440630999445,"tokens":"20","tokens_per_second":30.80092808598511,
      "update_seconds":0.0297947870049029,"wait_seconds":0,"worker_peak_rss_bytes":"3924799488",
      "device_phase_seconds":{"apply":0.125,"compress":0.5},"nonfinite":false})");
  const LineScalars s = TensorBoardScalars(line);
  EXPECT_EQ(s.step, 1);
  const std::map<std::string, float> want = {
      {"time/apply_s", 0.484237856f},
      {"time/backward_s", 16.024780604f},
      {"offload/bytes_to_cpu", 1024.0f},
      {"time/d2h_s", 0.5f},
      {"time/forward_s", 10.111211374f},
      {"memory/gpu_memory_used_bytes", 0.0f},
      {"memory/gpu_peak_allocated_bytes", 0.0f},
      {"train/grad_norm", 92.49616661781681f},
      {"offload/bytes_to_gpu", 2048.0f},
      {"time/h2d_s", 0.25f},
      {"train/loss", 8.5459623336792f},
      {"train/learning_rate", 0.00011999999999999999f},
      {"time/offload_s", 0.026753585998449125f},
      {"memory/optimizer_peak_rss_bytes", 4151947264.0f},
      {"schedule/split_layer", 3.0f},
      {"time/step_s", 26.752440630999445f},
      {"train/loss_tokens", 20.0f},
      {"train/tokens_per_second", 30.80092808598511f},
      {"time/update_s", 0.0297947870049029f},
      {"time/wait_s", 0.0f},
      {"memory/worker_peak_rss_bytes", 3924799488.0f},
      {"time/device_phase_s/apply", 0.125f},  // a map field: one scalar per key
      {"time/device_phase_s/compress", 0.5f},
  };
  EXPECT_EQ(TagValues(s), want);  // The boolean gives nothing.
  EXPECT_THAT(s.scalars, SizeIs(want.size()));
}

TEST(TensorBoardScalarsTest, EvalProjectorAndMasterLines) {
  const LineScalars eval = TensorBoardScalars(nlohmann::json::parse(
      R"({"accuracy":0.93,"examples":398,"kind":"eval","loss":0.065,"perplexity":0,
          "perplexity_tokens":"0","seconds":61.5,"step":60})"));
  EXPECT_EQ(eval.step, 60);
  EXPECT_EQ(TagValues(eval), (std::map<std::string, float>{{"eval/accuracy", 0.93f},
                                                           {"eval/examples", 398.0f},
                                                           {"eval/loss", 0.065f},
                                                           {"eval/time_s", 61.5f}}));
  const LineScalars text_eval = TensorBoardScalars(nlohmann::json::parse(
      R"({"accuracy":0,"examples":8,"kind":"eval","loss":6.5,"perplexity":665.1,
          "perplexity_tokens":"4096","seconds":1.5,"step":0})"));
  EXPECT_EQ(TagValues(text_eval).at("eval/perplexity"), 665.1f);
  EXPECT_EQ(TagValues(text_eval).at("eval/perplexity_tokens"), 4096.0f);

  const LineScalars fit = TensorBoardScalars(nlohmann::json::parse(
      R"({"kind":"projector_fit","mean_final_relative_bias":0.3746314200237707,
          "mean_initial_relative_bias":6.683606652189488,"refitted":210,
          "seconds":49.542731342,"step":0})"));
  EXPECT_EQ(TagValues(fit),
            (std::map<std::string, float>{{"projector/bias_after_fit", 0.3746314200237707f},
                                          {"projector/bias_before_fit", 6.683606652189488f},
                                          {"projector/refitted_matrices", 210.0f},
                                          {"projector/fit_time_s", 49.542731342f}}));
  const LineScalars refresh = TensorBoardScalars(nlohmann::json::parse(
      R"({"kind":"master_refresh","step":10,"max_abs_diff_before":1e-3,
          "max_abs_drift_beyond_rounding_before":2e-4})"));
  const LineScalars drift = TensorBoardScalars(nlohmann::json::parse(
      R"({"kind":"master_drift","step":60,"max_abs_diff":5e-3,
          "max_abs_drift_beyond_rounding":0})"));
  EXPECT_EQ(TagValues(refresh),
            (std::map<std::string, float>{{"master/worker_max_abs_diff", 1e-3f},
                                          {"master/drift_beyond_rounding", 2e-4f}}));
  EXPECT_EQ(TagValues(drift),
            (std::map<std::string, float>{{"master/worker_max_abs_diff", 5e-3f},
                                          {"master/drift_beyond_rounding", 0.0f}}));
  // A data line (DataSummary; int64 counts as strings) gives data/<count>; its text fields
  // (split, path, format, rendered_example) give none.
  const LineScalars data = TensorBoardScalars(nlohmann::json::parse(
      R"({"examples":"200","format":"alpaca","kind":"data","longest":"89",
          "loss_tokens":"1424","path":"test.alpaca.jsonl","records":"4622",
          "rendered_example":"x","seq_len":96,"skipped":"0","split":"eval","step":0,
          "tokens":"13659","truncated":"0"})"));
  EXPECT_EQ(TagValues(data), (std::map<std::string, float>{{"data/examples", 200.0f},
                                                           {"data/longest", 89.0f},
                                                           {"data/loss_tokens", 1424.0f},
                                                           {"data/records", 4622.0f},
                                                           {"data/seq_len", 96.0f},
                                                           {"data/skipped", 0.0f},
                                                           {"data/tokens", 13659.0f},
                                                           {"data/truncated", 0.0f}}));
  // A generative evaluation's scores; its samples (an array) give none.
  const LineScalars gen = TensorBoardScalars(nlohmann::json::parse(
      R"({"kind":"eval","step":50,"loss":1.5,"f1":0.25,"exact_match":0.125,
          "generated_examples":200,"samples":[{"reference":"a","prediction":"b","f1":0}]})"));
  EXPECT_EQ(TagValues(gen).at("eval/f1"), 0.25f);
  EXPECT_EQ(TagValues(gen).at("eval/exact_match"), 0.125f);
  EXPECT_EQ(TagValues(gen).count("eval/samples"), 0u);
}

TEST(TensorBoardScalarsTest, LinesWithoutNumbersOrAStepGiveNone) {
  for (const char* text :
       {R"({"kind":"checkpoint","step":6,"dir":"runs/x/checkpoints/step-00000006"})",
        R"({"kind":"checkpoint_failed","step":6,"error":"disk full"})",
        R"({"kind":"resume","step":2,"checkpoint":"runs/x/checkpoints/step-00000002"})",
        R"({"kind":"step","loss":1.0})",             // No step.
        R"({"kind":"step","step":"3","loss":1.0})",  // Not an integer step.
        R"({"step":3,"loss":1.0})",                  // No kind.
        R"([1, 2])"}) {
    EXPECT_TRUE(TensorBoardScalars(nlohmann::json::parse(text)).scalars.empty()) << text;
  }
  // Strings are numbers only in step and eval lines (protobuf's int64); a later kind's
  // numbers go under <kind>/.
  const LineScalars later = TensorBoardScalars(nlohmann::json::parse(
      R"({"kind":"data_epoch","step":9,"epoch":2,"examples":"12","note":"x"})"));
  EXPECT_EQ(TagValues(later), (std::map<std::string, float>{{"data_epoch/epoch", 2.0f}}));
}

TEST(RunLogTest, EveryMetricsLineWritesItsScalarsAndAResumeAddsAFile) {
  const std::string dir = TempDir();
  const std::vector<nlohmann::json> lines = {
      {{"kind", "eval"}, {"step", 0}, {"loss", 10.5}, {"accuracy", 0.25}},
      {{"kind", "step"}, {"step", 1}, {"loss", 9.25}, {"lr", 0.001}},
      {{"kind", "checkpoint"}, {"step", 1}, {"dir", "x"}},
      {{"kind", "step"}, {"step", 2}, {"loss", 8.0}, {"lr", 0.002}},
  };
  std::string first;
  {
    auto log = RunLog::Open(dir, /*append=*/false, /*with_timeline=*/false);
    ASSERT_TRUE(log.ok()) << log.status();
    first = log->events_path();
    for (const auto& l : lines) ASSERT_TRUE(log->Metrics(l).ok());
    // Every scalar is in the file as soon as Metrics returns.
    std::vector<ScalarEvent> events = Events(first);
    ASSERT_THAT(events, SizeIs(6));
    EXPECT_EQ(events[0].tag, "eval/accuracy");
    EXPECT_EQ(events[0].step, 0);
    EXPECT_EQ(events[2].tag, "train/loss");
    EXPECT_EQ(events[2].step, 1);
    EXPECT_EQ(events[2].value, 9.25f);
    EXPECT_EQ(events[5].tag, "train/learning_rate");
    EXPECT_EQ(events[5].step, 2);
    EXPECT_EQ(events[5].value, 0.002f);
    EXPECT_GT(events[5].wall_time, 1.7e9);
  }
  {
    // A resumed job appends to metrics.jsonl and adds an events file.
    auto log = RunLog::Open(dir, /*append=*/true, /*with_timeline=*/false);
    ASSERT_TRUE(log.ok()) << log.status();
    ASSERT_TRUE(log->Metrics(lines[3]).ok());
    EXPECT_THAT(ListEventsFiles(dir), ElementsAre(first, log->events_path()));
    EXPECT_THAT(Events(log->events_path()), SizeIs(2));
  }
  {
    // A fresh job in the same folder starts the events over, as it does metrics.jsonl.
    auto log = RunLog::Open(dir, /*append=*/false, /*with_timeline=*/false);
    ASSERT_TRUE(log.ok()) << log.status();
    EXPECT_THAT(ListEventsFiles(dir), ElementsAre(log->events_path()));
    EXPECT_TRUE(Events(log->events_path()).empty());
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lspo::scheduler
