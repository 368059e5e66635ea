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
#include "scheduler/job_spec.h"

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

// Findings of the fuzzers (fuzz/README.md, "Findings"), fixed; each test states the behaviour.
// 1. A YAML scalar that is not valid UTF-8 made json.dump() throw nlohmann type_error 316 out
// of the parser; it is now a kInvalidArgument naming the encoding.
TEST(JobSpecFuzzFindings, NonUtf8YamlScalarIsAnInvalidArgument) {
  absl::StatusOr<lspo::v1::JobSpec> spec;
  EXPECT_NO_THROW(spec = scheduler::ParseJobSpecYaml("name: a\xdd b\n"));
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

}  // namespace
}  // namespace lspo::fuzz
