// Replays the fuzz targets' committed inputs through the harnesses (fuzz/*_fuzzer.cc, linked
// without libFuzzer): the seed corpora under fuzz/corpus/<target>/ and every crash found so far
// under fuzz/regressions/<target>/ (each a bug that was fixed; see fuzz/README.md). Built in
// the normal build and in the sanitizer builds (scripts/sanitize), where a regression that
// comes back is an ASan/UBSan report instead of, at best, a crash. Runs from the repository
// root (CTest's working directory).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "baselines/peft_config.h"
#include "data/datasets.h"
#include "data/records.h"
#include "fuzz/fuzz_harness.h"
#include "gtest/gtest.h"
#include "model/hf_checkpoint.h"
#include "nlohmann/json.hpp"
#include "scheduler/checkpoint.h"
#include "spec/job_spec.h"

namespace lspo::fuzz {
namespace {

namespace fs = std::filesystem;

// Feeds every file of fuzz/corpus/<target> and fuzz/regressions/<target> to `fn`; returns how
// many were fed.
int ReplayDir(const std::string& target, int (*fn)(const uint8_t*, size_t)) {
  int n = 0;
  for (const char* root : {"fuzz/corpus/", "fuzz/regressions/"}) {
    const fs::path dir = fs::path(root) / target;
    if (!fs::is_directory(dir)) continue;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    // "threadsafe": the child re-executes this binary instead of forking a process that may
    // hold TBB worker threads.
    ::testing::FLAGS_gtest_death_test_style = "threadsafe";
  for (const fs::path& p : files) {
      std::ifstream in(p, std::ios::binary);
      const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                       std::istreambuf_iterator<char>());
      SCOPED_TRACE(p.string());
      // The harnesses check their invariants with abort() (libFuzzer's contract: the return
      // value is always 0), so each input runs in a child process: the test fails naming the
      // input when the harness aborts or a sanitizer reports, and the other inputs still run.
      EXPECT_EXIT(
          {
            fn(bytes.data(), bytes.size());
            std::fflush(nullptr);
            std::_Exit(0);
          },
          ::testing::ExitedWithCode(0), "")
          << p;
      ++n;
    }
  }
  return n;
}

TEST(FuzzReplay, Gguf) { EXPECT_GE(ReplayDir("gguf", FuzzGguf), 3); }
TEST(FuzzReplay, Safetensors) { EXPECT_GE(ReplayDir("safetensors", FuzzSafetensors), 2); }
TEST(FuzzReplay, TokenizerGguf) { EXPECT_GE(ReplayDir("tokenizer_gguf", FuzzTokenizerGguf), 1); }
TEST(FuzzReplay, Tokenizer) {
  InitTokenizerFuzzer();
  EXPECT_GE(ReplayDir("tokenizer", FuzzTokenizer), 5);
}
TEST(FuzzReplay, TokenizerHf) { EXPECT_GE(ReplayDir("tokenizer_hf", FuzzTokenizerHf), 6); }
TEST(FuzzReplay, Jinja) { EXPECT_GE(ReplayDir("jinja", FuzzJinja), 8); }
TEST(FuzzReplay, JobSpec) { EXPECT_GE(ReplayDir("job_spec", FuzzJobSpec), 2); }
TEST(FuzzReplay, HfConfig) { EXPECT_GE(ReplayDir("hf_config", FuzzHfConfig), 4); }
TEST(FuzzReplay, GenerationConfig) {
  EXPECT_GE(ReplayDir("generation_config", FuzzGenerationConfig), 4);
}
TEST(FuzzReplay, SafetensorsIndex) {
  EXPECT_GE(ReplayDir("safetensors_index", FuzzSafetensorsIndex), 4);
}
TEST(FuzzReplay, PeftConfig) { EXPECT_GE(ReplayDir("peft_config", FuzzPeftConfig), 3); }
TEST(FuzzReplay, DataRecords) { EXPECT_GE(ReplayDir("data_records", FuzzDataRecords), 6); }
TEST(FuzzReplay, JobStore) { EXPECT_GE(ReplayDir("job_store", FuzzJobStore), 2); }
TEST(FuzzReplay, CheckpointManifest) {
  EXPECT_GE(ReplayDir("checkpoint_manifest", FuzzCheckpointManifest), 4);
}
TEST(FuzzReplay, TrainerState) { EXPECT_GE(ReplayDir("trainer_state", FuzzTrainerState), 5); }

// Findings of the fuzzers (fuzz/README.md, "Findings"), fixed; each test states the behaviour.
// 1. A YAML scalar that is not valid UTF-8 made json.dump() throw nlohmann type_error 316 out
// of the parser; it is now a kInvalidArgument naming the encoding.
TEST(JobSpecFuzzFindings, NonUtf8YamlScalarIsAnInvalidArgument) {
  absl::StatusOr<lspo::v1::JobSpec> spec;
  EXPECT_NO_THROW(spec = spec::ParseJobSpecYaml("name: a\xdd b\n"));
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
}

// 2. A value nested deeper than the stack allows in a field that an error message quotes made
// nlohmann's recursive dump() overflow the stack (a crash, not an error) in three readers; the
// messages now quote such a value by its type. 200,000 levels overflow the unfixed readers in
// any build (the committed regressions are smaller: they overflow under ASan).
std::string Nested(size_t depth) { return std::string(depth, '[') + std::string(depth, ']'); }

TEST(DeepJsonFuzzFindings, PeftConfigQuotesADeepValueByItsType) {
  const std::string text =
      "{\"peft_type\": \"LORA\", \"r\": 1, \"lora_alpha\": 1, \"bias\": " + Nested(200000) + "}";
  absl::StatusOr<baselines::LoraSettings> s = baselines::ParsePeftAdapterConfig(text, "a.json");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(s.status().message().find("bias an array nested over 16 levels deep"),
            absl::string_view::npos)
      << s.status();
  // Shallow values are still quoted as JSON.
  s = baselines::ParsePeftAdapterConfig(
      R"({"peft_type": "LORA", "r": 1, "lora_alpha": 1, "bias": ["all"]})", "a.json");
  EXPECT_NE(s.status().message().find(R"(bias ["all"])"), absl::string_view::npos) << s.status();
}

TEST(DeepJsonFuzzFindings, SafetensorsIndexQuotesADeepShardByItsType) {
  const std::string text = "{\"weight_map\": {\"t\": " + Nested(200000) + "}}";
  absl::StatusOr<model::SafetensorsIndex> index = model::ParseSafetensorsIndex(text, "i.json");
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(index.status().message().find("is an array nested over 16 levels deep"),
            absl::string_view::npos)
      << index.status();
}

TEST(DeepJsonFuzzFindings, LabeledRecordQuotesADeepRecordByItsType) {
  absl::StatusOr<std::vector<data::JsonRecord>> records =
      data::ParseJsonRecords("[{\"label\": " + Nested(200000) + "}]", "d.json");
  ASSERT_TRUE(records.ok()) << records.status();
  absl::StatusOr<std::vector<data::LabeledText>> rows = data::LabeledFromJsonRecords(*records);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rows.status().message().find("saw an object nested over 16 levels deep"),
            absl::string_view::npos)
      << rows.status();
}

// 3. Checkpoints (scheduler/checkpoint.h). A trainer_state.json whose fields resume reads had
// another type ("training_fingerprint": 1796619174, "skipped_steps": "0", "run_id": 7) passed
// VerifyCheckpoint, and the job runner's nlohmann value() then threw type_error 302 out of
// the job thread (std::terminate: the scheduler process ended); a counter beyond int64 (read
// as a double) converted to int out of range (UBSan), a step beyond INT_MAX was truncated
// (4294967298 resumed as step 2), and a "summary" nested tens of thousands of levels deep
// overflowed the stack when resume copied it. ParseTrainerState now refuses all of these with
// kDataLoss, so resume skips the checkpoint (or fails naming it).
const char kSha[] = "587cb980af76fdc7e52369fd0b9d926dff266976b6f8ac631e358fecc49ff8cf";

TEST(CheckpointFuzzFindings, TrainerStateFieldsOfAnotherTypeOrRangeAreDataLoss) {
  for (const char* text : {
           R"({"step": 2, "training_fingerprint": 1796619174})",
           R"({"step": 2, "skipped_steps": "0"})",
           R"({"step": 2, "run_id": 7})",
           R"({"step": 2, "nonfinite_in_a_row": 1e86})",
           R"({"step": 2, "skipped_steps": -1})",
           R"({"step": 4294967298})",
           R"({"step": 18446744073709551615})",
           R"({"step": -1})",
           R"({"step": 2, "parent": {"run_id": "r", "step": 4294967297}})",
           R"({"step": 2, "parent": {"run_id": 5, "step": 1}})",
           R"({"step": 2, "parent": "step-00000001"})",
           R"({"step": 2, "summary": [1]})",
           R"({"step": 2, "evals": {"step": 2}})",
       }) {
    SCOPED_TRACE(text);
    absl::StatusOr<nlohmann::json> state;
    EXPECT_NO_THROW(state = scheduler::ParseTrainerState(text, "ckpt/trainer_state.json"));
    EXPECT_EQ(state.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(state.status().message().find("'ckpt/trainer_state.json' is not a valid trainer "
                                            "state ("),
              absl::string_view::npos)
        << state.status();
  }
  // What the job runner writes still reads: null parent, INT_MAX, a parent without a step.
  for (const char* text : {
           R"({"step": 0, "parent": null, "skipped_steps": 0, "summary": {}, "evals": []})",
           R"({"step": 2147483647, "run_id": "a", "training_fingerprint": "{}"})",
           R"({"step": 3, "parent": {"run_id": "a", "dir": "/x"}, "nonfinite_in_a_row": 2})",
       }) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(scheduler::ParseTrainerState(text, "t.json").ok());
  }
}

TEST(CheckpointFuzzFindings, DeepTrainerStateIsRefusedBeforeItIsBuilt) {
  // Levels: the state object, "summary", then the arrays.
  auto with_depth = [](size_t levels) {
    return "{\"step\": 2, \"summary\": {\"x\": " + Nested(levels - 2) + "}}";
  };
  EXPECT_TRUE(scheduler::ParseTrainerState(with_depth(scheduler::kMaxTrainerStateDepth), "t")
                  .ok());
  absl::StatusOr<nlohmann::json> deep =
      scheduler::ParseTrainerState(with_depth(scheduler::kMaxTrainerStateDepth + 1), "t");
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kDataLoss);
  deep = scheduler::ParseTrainerState(with_depth(200000), "t");
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(deep.status().message().find("nested over 64 levels deep"), absl::string_view::npos)
      << deep.status();
  // Brackets inside strings do not count.
  EXPECT_TRUE(scheduler::ParseTrainerState(
                  "{\"step\": 2, \"run_id\": \"" + Nested(100) + "\\\"[\"}", "t")
                  .ok());
}

// 4. A manifest name with a NUL byte ("config.json\0trainer_state.json") was accepted, and
// VerifyCheckpoint hashed the file before the NUL (what open() sees) in place of the name
// listed; it is now a malformed line (kDataLoss).
TEST(CheckpointFuzzFindings, ManifestNameWithANulByteIsMalformed) {
  const std::string line =
      std::string(kSha) + "  config.json" + std::string(1, '\0') + "trainer_state.json\n";
  absl::StatusOr<std::vector<scheduler::ChecksumEntry>> m =
      scheduler::ParseChecksumManifest(line, "c.sha256");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(m.status().message().find("malformed line"), absl::string_view::npos) << m.status();
}

// The writer and the readers on disk: CommitCheckpoint's manifest is ChecksumManifestText of
// the files' SHA-256, and a committed trainer state with a mistyped field fails
// VerifyCheckpoint and ReadCheckpointLineage with kDataLoss instead of reaching resume.
TEST(CheckpointFuzzFindings, CommittedCheckpointsReadBackThroughTheParsers) {
  const std::string out = ::testing::TempDir() + "/ckpt-fuzz-findings";
  fs::remove_all(out);
  absl::StatusOr<std::string> tmp = scheduler::BeginCheckpoint(out, 3);
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  fs::create_directories(*tmp + "/adapter");
  std::ofstream(*tmp + "/adapter/adapter_config.json") << "{}";
  absl::StatusOr<std::string> dir =
      scheduler::CommitCheckpoint(*tmp, {{"step", 3}, {"run_id", "r1"}, {"parent", nullptr}});
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::ifstream in(*dir + "/checksums.sha256", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  absl::StatusOr<std::vector<scheduler::ChecksumEntry>> m =
      scheduler::ParseChecksumManifest(text, "m");
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[0].name, "adapter/adapter_config.json");
  EXPECT_EQ((*m)[1].name, "trainer_state.json");
  EXPECT_EQ((*m)[1].sha256, *scheduler::Sha256File(*dir + "/trainer_state.json"));
  EXPECT_EQ(scheduler::ChecksumManifestText(*m), text);
  EXPECT_TRUE(scheduler::VerifyCheckpoint(*dir).ok());
  absl::StatusOr<scheduler::CheckpointLineage> l = scheduler::ReadCheckpointLineage(*dir);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->step, 3);
  EXPECT_EQ(l->run_id, "r1");
  EXPECT_EQ(l->parent_step, -1);

  tmp = scheduler::BeginCheckpoint(out, 4);
  ASSERT_TRUE(tmp.ok()) << tmp.status();
  dir = scheduler::CommitCheckpoint(*tmp, {{"step", 4}, {"skipped_steps", "0"}});
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(scheduler::VerifyCheckpoint(*dir).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(scheduler::ReadCheckpointLineage(*dir).status().code(),
            absl::StatusCode::kDataLoss);
  fs::remove_all(out);
}

}  // namespace
}  // namespace lspo::fuzz
