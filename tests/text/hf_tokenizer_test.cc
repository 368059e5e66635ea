// Tests for BpeTokenizer::FromHfFolder / FromHfJson (text/tokenizer.h) against the ids of the
// Hugging Face `tokenizers` library, stored by tests/oracle/make_hf_tokenizer_oracle.py in
// tests/oracle/data/hf_tokenizer_oracle.json for the folders under
// tests/oracle/data/hf_tokenizers/. Plus one test per refusal. Run from the repository root.
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "nlohmann/json.hpp"
#include "tests/test_files.h"
#include "text/tokenizer.h"

namespace lspo::model {
namespace {

using ::lspo::tests::ReadAll;

using ::testing::HasSubstr;
using Json = nlohmann::json;

constexpr char kOraclePath[] = "tests/oracle/data/hf_tokenizer_oracle.json";
constexpr char kGgufPath[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kMobyDick[] = "datasets/moby-dick/moby-dick.txt";

const Json& Oracle() {
  static const Json* j = new Json(Json::parse(ReadAll(kOraclePath), nullptr, false));
  return *j;
}

std::vector<std::string> Lines() { return Oracle()["lines"].get<std::vector<std::string>>(); }

std::string Show(const std::vector<int32_t>& ids) { return absl::StrJoin(ids, ","); }

std::string Escaped(const std::string& s) {
  return Json(s).dump(-1, ' ', true, nlohmann::detail::error_handler_t::replace);
}

const BpeTokenizer* Family(const std::string& name) {
  static auto* cache = new std::map<std::string, std::unique_ptr<BpeTokenizer>>();
  auto it = cache->find(name);
  if (it != cache->end()) return it->second.get();
  const Json& f = Oracle()["families"][name];
  auto tok = BpeTokenizer::FromHfFolder(f["dir"].get<std::string>());
  EXPECT_TRUE(tok.ok()) << name << ": " << tok.status();
  std::unique_ptr<BpeTokenizer> p;
  if (tok.ok()) p = std::make_unique<BpeTokenizer>(*std::move(tok));
  return cache->emplace(name, std::move(p)).first->second.get();
}

// Asserts every oracle line's ids, and Decode against `tokenizers`' decode; returns the number
// of lines checked.
int CheckAgainstOracle(const std::string& name, const BpeTokenizer& tok) {
  const Json& f = Oracle()["families"][name];
  const std::vector<std::string> lines = Lines();
  const Json& ids = f["ids"];
  const Json& decoded = f["decoded_if_different"];
  EXPECT_EQ(ids.size(), lines.size());
  int mismatches = 0, decode_mismatches = 0, round_trips = 0;
  for (size_t i = 0; i < lines.size() && i < ids.size(); ++i) {
    std::vector<int32_t> want = ids[i].get<std::vector<int32_t>>();
    std::vector<int32_t> got = tok.Encode(lines[i]);
    if (got != want) {
      if (mismatches++ == 0) {
        ADD_FAILURE() << name << ": first mismatch at line " << i << " " << Escaped(lines[i])
                      << "\n  tokenizers: [" << Show(want) << "]\n  C++:        [" << Show(got)
                      << "]";
      }
      continue;
    }
    const std::string key = std::to_string(i);
    const bool hf_round_trips = !decoded.contains(key);
    const std::string want_text = hf_round_trips ? lines[i] : decoded[key].get<std::string>();
    const std::string got_text = tok.Decode(got);
    if (got_text != want_text && decode_mismatches++ == 0) {
      ADD_FAILURE() << name << ": first decode mismatch at line " << i << " ids [" << Show(got)
                    << "]\n  tokenizers: " << Escaped(want_text)
                    << "\n  C++:        " << Escaped(got_text);
    }
    if (hf_round_trips) {
      ++round_trips;
      EXPECT_EQ(got_text, lines[i]) << name << " line " << i;  // Decode(Encode(line)) == line
    }
  }
  EXPECT_EQ(mismatches, 0) << name << ": lines whose ids differ from tokenizers'";
  EXPECT_EQ(decode_mismatches, 0) << name << ": lines whose Decode differs from tokenizers'";
  EXPECT_GT(round_trips, 0) << name;
  return static_cast<int>(lines.size());
}

TEST(HfTokenizerOracleTest, OracleIsPresentAndLarge) {
  ASSERT_FALSE(Oracle().is_discarded()) << kOraclePath;
  EXPECT_GE(Lines().size(), 2000u);
  for (const char* name : {"llama3", "qwen2", "spm_legacy", "spm_metaspace", "spm_unk", "misc"}) {
    EXPECT_TRUE(Oracle()["families"].contains(name)) << name;
  }
}

class HfFamilyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFamilyTest, EncodeAndDecodeMatchTokenizers) {
  const std::string name = GetParam();
  if (!Oracle()["families"].contains(name)) {
    GTEST_SKIP() << name << " is not in the oracle (its source was absent when it was made)";
  }
  const std::string dir = Oracle()["families"][name]["dir"].get<std::string>();
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << dir << " is absent";
  const BpeTokenizer* tok = Family(name);
  ASSERT_NE(tok, nullptr);
  EXPECT_TRUE(tok->from_hf_json());
  EXPECT_EQ(tok->vocab_size(), Oracle()["families"][name]["vocab_size"].get<int>());
  EXPECT_EQ(tok->adds_bos(), Oracle()["families"][name]["with_bos"].get<bool>());
  EXPECT_GE(CheckAgainstOracle(name, *tok), 2000);
}

INSTANTIATE_TEST_SUITE_P(Families, HfFamilyTest,
                         ::testing::Values("llama3", "qwen2", "spm_legacy", "spm_metaspace",
                                           "spm_unk", "misc", "smollm2"));

TEST(HfTokenizerTest, SpecialIdsAndTemplates) {
  {
    const BpeTokenizer* t = Family("llama3");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->bos_id(), t->TokenToId("<|begin_of_text|>"));
    EXPECT_EQ(t->eos_id(), t->TokenToId("<|eot_id|>"));
    EXPECT_EQ(t->pad_id(), -1);
    EXPECT_EQ(t->unk_id(), -1);
    EXPECT_TRUE(t->adds_bos());
    EXPECT_FALSE(t->adds_eos());
    EXPECT_TRUE(t->IsSpecial(t->bos_id()));
    EXPECT_FALSE(t->IsSpecial(t->TokenToId("the")));
    EXPECT_THAT(t->chat_template(), HasSubstr("<|start_header_id|>"));
    EXPECT_EQ(t->IdToToken(t->bos_id()), "<|begin_of_text|>");
  }
  {
    const BpeTokenizer* t = Family("qwen2");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->bos_id(), -1);  // "bos_token": null
    EXPECT_EQ(t->eos_id(), t->TokenToId("<|im_end|>"));
    EXPECT_EQ(t->pad_id(), t->TokenToId("<|endoftext|>"));
    EXPECT_FALSE(t->adds_bos());
    // Added but not special: matched verbatim, not special.
    const int32_t tool = t->TokenToId("<tool_call>");
    ASSERT_GE(tool, 0);
    EXPECT_FALSE(t->IsSpecial(tool));
    EXPECT_EQ(t->Encode("<tool_call>"), std::vector<int32_t>{tool});
    // chat_template.jinja.
    EXPECT_EQ(t->chat_template(),
              ReadAll("tests/oracle/data/hf_tokenizers/qwen2/chat_template.jinja"));
  }
  {
    const BpeTokenizer* t = Family("spm_legacy");
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->bos_id(), 1);
    EXPECT_EQ(t->eos_id(), 2);
    EXPECT_EQ(t->unk_id(), 0);
    EXPECT_TRUE(t->adds_bos());
    EXPECT_EQ(t->IdToToken(3), "<0x00>");
    // The list form of chat_template: the "default" entry.
    EXPECT_THAT(t->chat_template(), HasSubstr("[INST]"));
    EXPECT_THAT(t->chat_template(), ::testing::Not(HasSubstr("<|im_start|>")));
  }
  {
    const BpeTokenizer* t = Family("misc");
    ASSERT_NE(t, nullptr);
    EXPECT_FALSE(t->adds_bos());
    EXPECT_TRUE(t->adds_eos());
    EXPECT_EQ(t->eos_id(), t->TokenToId("[SEP]"));
  }
}

TEST(HfTokenizerTest, IllFormedUtf8NeverCrashesAndByteLevelRoundTrips) {
  const std::string bad =
      "caf\xe9 \xa3"
      "100 \xe4\xb8 ok \xf0\x9f\x98 \xff\xfe end";
  for (const char* name : {"llama3", "qwen2", "spm_legacy", "spm_metaspace", "spm_unk", "misc"}) {
    const BpeTokenizer* t = Family(name);
    ASSERT_NE(t, nullptr);
    std::vector<int32_t> ids = t->Encode(bad);
    for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < t->vocab_size()) << name;
    (void)t->Decode(ids);
    (void)t->Decode({-1, t->vocab_size(), 1 << 30});
  }
  // Byte-level (all 256 byte symbols) and byte-fallback vocabularies give the bytes back.
  EXPECT_EQ(Family("llama3")->Decode(Family("llama3")->Encode(bad)), bad);
  EXPECT_EQ(Family("spm_legacy")->Decode(Family("spm_legacy")->Encode(bad)), bad);
}

TEST(HfTokenizerTest, WriteHfFilesWritesTheSourceFilesBack) {
  for (const char* name : {"llama3", "qwen2", "spm_legacy", "spm_metaspace", "spm_unk", "misc"}) {
    const BpeTokenizer* t = Family(name);
    ASSERT_NE(t, nullptr);
    const std::string src = Oracle()["families"][name]["dir"].get<std::string>();
    const std::string dir = ::testing::TempDir() + "/lspo_hf_roundtrip_" + name;
    std::filesystem::remove_all(dir);
    ASSERT_TRUE(t->WriteHfFiles(dir).ok()) << name;
    EXPECT_EQ(ReadAll(dir + "/tokenizer.json"), ReadAll(src + "/tokenizer.json")) << name;
    EXPECT_EQ(ReadAll(dir + "/tokenizer_config.json"), ReadAll(src + "/tokenizer_config.json"))
        << name;
    EXPECT_EQ(std::filesystem::exists(dir + "/chat_template.jinja"),
              std::filesystem::exists(src + "/chat_template.jinja"))
        << name;
    if (std::filesystem::exists(src + "/chat_template.jinja")) {
      EXPECT_EQ(ReadAll(dir + "/chat_template.jinja"), ReadAll(src + "/chat_template.jinja"));
    }
    EXPECT_FALSE(std::filesystem::exists(dir + "/special_tokens_map.json")) << name;
    auto again = BpeTokenizer::FromHfFolder(dir);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->chat_template(), t->chat_template());
    for (const std::string& line : Lines()) {
      ASSERT_EQ(again->Encode(line), t->Encode(line)) << name << " " << Escaped(line);
    }
  }
  // Without a tokenizer_config.json: one is generated, as for GGUF tokenizers.
  const std::string src = "tests/oracle/data/hf_tokenizers/llama3";
  auto bare = BpeTokenizer::FromHfJson(ReadAll(src + "/tokenizer.json"), "", src);
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(bare->bos_id(), bare->TokenToId("<|begin_of_text|>"));  // from the template
  EXPECT_EQ(bare->eos_id(), -1);
  const std::string dir = ::testing::TempDir() + "/lspo_hf_roundtrip_bare";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(bare->WriteHfFiles(dir).ok());
  auto cfg = Json::parse(ReadAll(dir + "/tokenizer_config.json"), nullptr, false);
  ASSERT_FALSE(cfg.is_discarded());
  EXPECT_EQ(cfg["bos_token"], "<|begin_of_text|>");
  EXPECT_EQ(cfg["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_TRUE(std::filesystem::exists(dir + "/special_tokens_map.json"));
}

TEST(HfTokenizerTest, SmolLm2FolderMatchesTheGgufTokenizer) {
  if (!std::filesystem::exists(kGgufPath)) GTEST_SKIP() << kGgufPath << " is absent";
  auto gguf = GgufFile::Open(kGgufPath);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto from_gguf = BpeTokenizer::FromGguf(*gguf);
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status();
  // The C++ export of the GGUF tokenizer, read back as a tokenizer.json.
  const std::string dir = ::testing::TempDir() + "/lspo_hf_smollm2_export";
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(from_gguf->WriteHfFiles(dir).ok());
  auto exported = BpeTokenizer::FromHfFolder(dir);
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->vocab_size(), from_gguf->vocab_size());
  EXPECT_EQ(exported->bos_id(), from_gguf->bos_id());
  EXPECT_EQ(exported->eos_id(), from_gguf->eos_id());
  EXPECT_EQ(exported->pad_id(), from_gguf->pad_id());
  EXPECT_EQ(exported->unk_id(), from_gguf->unk_id());
  EXPECT_EQ(exported->chat_template(), from_gguf->chat_template());
  const BpeTokenizer* saved = std::filesystem::exists("tests/oracle/data/hf_tokenizers/smollm2")
                                  ? Family("smollm2")
                                  : nullptr;
  for (const std::string& line : Lines()) {
    std::vector<int32_t> want = from_gguf->Encode(line);
    ASSERT_EQ(exported->Encode(line), want) << Escaped(line);
    if (saved != nullptr) {
      ASSERT_EQ(saved->Encode(line), want) << Escaped(line);
    }
    EXPECT_EQ(exported->Decode(want), from_gguf->Decode(want)) << Escaped(line);
  }
}

TEST(HfTokenizerTest, EncodesOneMegabyteQuickly) {
  std::string text = ReadAll(kMobyDick);
  ASSERT_GT(text.size(), 1000000u);
  text.resize(1000000);
  while (!text.empty() && (static_cast<uint8_t>(text.back()) & 0xC0) == 0x80) text.pop_back();
  for (const char* name : {"llama3", "qwen2", "spm_legacy", "spm_metaspace"}) {
    const BpeTokenizer* t = Family(name);
    ASSERT_NE(t, nullptr);
    auto start = std::chrono::steady_clock::now();
    std::vector<int32_t> ids = t->Encode(text);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(secs, 10.0) << name << ": encoding 1 MB took " << secs << " s";
    EXPECT_GT(ids.size(), 150000u) << name;
    if (std::string(name) != "qwen2") {  // (NFC changes the text)
      EXPECT_EQ(t->Decode(ids), text) << name;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Refusals. A small valid byte-level tokenizer.json, then one change per case.
Json TinyTokenizerJson() {
  return Json::parse(R"({
    "version": "1.0", "truncation": null, "padding": null,
    "added_tokens": [{"id": 5, "content": "<s>", "single_word": false, "lstrip": false,
                      "rstrip": false, "normalized": false, "special": true}],
    "normalizer": null,
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                      "use_regex": true},
    "post_processor": null,
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null,
              "continuing_subword_prefix": null, "end_of_word_suffix": null,
              "fuse_unk": false, "byte_fallback": false,
              "vocab": {"a": 0, "b": 1, "ab": 2, "Ġ": 3, "Ġab": 4},
              "merges": ["a b", ["Ġ", "ab"]]}
  })");
}

absl::Status Load(const Json& tj, const std::string& config = "") {
  return BpeTokenizer::FromHfJson(tj.dump(), config, "src").status();
}

void ExpectError(const absl::Status& st, absl::StatusCode code,
                 std::vector<std::string> substrings) {
  EXPECT_EQ(st.code(), code) << st;
  for (const std::string& s : substrings) EXPECT_THAT(std::string(st.message()), HasSubstr(s));
}

TEST(HfTokenizerRefusalTest, TinyTokenizerLoadsAndEncodes) {
  auto t = BpeTokenizer::FromHfJson(TinyTokenizerJson().dump(), "", "src");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->vocab_size(), 6);
  EXPECT_EQ(t->Encode("ab ab<s>"), (std::vector<int32_t>{2, 4, 5}));
  EXPECT_EQ(t->Decode({2, 4, 5}), "ab ab<s>");
  EXPECT_EQ(t->Encode("abc"), (std::vector<int32_t>{2}));  // 'c' has no symbol: dropped
  EXPECT_EQ(t->TokenToId("<s>"), 5);
  EXPECT_TRUE(t->IsSpecial(5));
  EXPECT_FALSE(t->adds_bos());
}

TEST(HfTokenizerRefusalTest, UnimplementedNamesFieldValueAndSupported) {
  const auto kU = absl::StatusCode::kUnimplemented;
  for (const char* type : {"WordPiece", "Unigram", "WordLevel"}) {
    Json j = TinyTokenizerJson();
    j["model"]["type"] = type;
    ExpectError(Load(j), kU, {"src/tokenizer.json", "model.type", type, "supported: BPE"});
  }
  {
    Json j = TinyTokenizerJson();
    j["pre_tokenizer"] = {{"type", "Whitespace"}};
    ExpectError(Load(j), kU, {"pre_tokenizer.type", "Whitespace", "supported:", "Metaspace"});
  }
  {
    Json j = TinyTokenizerJson();
    j["normalizer"] = {
        {"type", "Sequence"},
        {"normalizers", Json::array({Json{{"type", "NFC"}}, Json{{"type", "Lowercase"}}})}};
    ExpectError(Load(j), kU, {"normalizer.normalizers[1].type", "Lowercase", "NFKC"});
  }
  {
    Json j = TinyTokenizerJson();
    j["decoder"] = {{"type", "WordPiece"}, {"prefix", "##"}};
    ExpectError(Load(j), kU, {"decoder.type", "WordPiece", "ByteFallback"});
  }
  {
    Json j = TinyTokenizerJson();
    j["post_processor"] = {{"type", "RobertaProcessing"}};
    ExpectError(Load(j), kU, {"post_processor.type", "RobertaProcessing", "TemplateProcessing"});
  }
  {
    Json j = TinyTokenizerJson();
    j["pre_tokenizer"] = Json::parse(R"({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"String": " "}, "behavior": "Glued", "invert": false},
        {"type": "ByteLevel"}]})");
    ExpectError(Load(j), kU, {"pre_tokenizer.pretokenizers[0].behavior", "Glued", "Isolated"});
  }
  {
    Json j = TinyTokenizerJson();
    j["model"]["dropout"] = 0.1;
    ExpectError(Load(j), kU, {"model.dropout", "0.1"});
  }
  {
    Json j = TinyTokenizerJson();
    j["model"]["continuing_subword_prefix"] = "##";
    ExpectError(Load(j), kU, {"model.continuing_subword_prefix", "##"});
  }
  {
    Json j = TinyTokenizerJson();
    j["model"]["end_of_word_suffix"] = "</w>";
    ExpectError(Load(j), kU, {"model.end_of_word_suffix", "</w>"});
  }
  {
    Json j = TinyTokenizerJson();
    j["pre_tokenizer"] = Json::parse(R"({"type": "Sequence", "pretokenizers": [
        {"type": "ByteLevel"}, {"type": "Digits", "individual_digits": true}]})");
    ExpectError(Load(j), kU, {"pre_tokenizer.pretokenizers[1].type", "Digits", "last"});
  }
  {
    Json j = TinyTokenizerJson();
    Json n = {{"type", "NFC"}};
    for (int i = 0; i < 10; ++i) n = {{"type", "Sequence"}, {"normalizers", Json::array({n})}};
    j["normalizer"] = n;
    ExpectError(Load(j), kU, {"normalizer", "Sequence", "nesting"});
  }
  {
    Json j = TinyTokenizerJson();
    j["pre_tokenizer"] = Json::parse(R"({"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "(?<name"}, "behavior": "Isolated"},
        {"type": "ByteLevel"}]})");
    ExpectError(Load(j), kU, {"pre_tokenizer.pretokenizers[0].pattern.Regex", "ICU"});
  }
  {
    Json j = TinyTokenizerJson();
    j["post_processor"] = Json::parse(R"({"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"SpecialToken": {"id": "<s>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [5], "tokens": ["<s>"]}}})");
    ExpectError(Load(j), kU, {"post_processor.single", "2 tokens before $A"});
    // One leading token: bos. It must agree with tokenizer_config.json.
    j["post_processor"]["single"].erase(0);
    auto t = BpeTokenizer::FromHfJson(j.dump(), "", "src");
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->adds_bos());
    EXPECT_EQ(t->bos_id(), 5);
    EXPECT_TRUE(Load(j, R"({"bos_token": "<s>"})").ok());
    ExpectError(Load(j, R"({"bos_token": "ab"})"), kU,
                {"post_processor.single", "src/tokenizer_config.json", "bos_token"});
    ExpectError(Load(j, R"({"bos_token": null})"), kU, {"bos_token names none"});
  }
  ExpectError(Load(TinyTokenizerJson(), R"({"split_special_tokens": true})"), kU,
              {"src/tokenizer_config.json", "split_special_tokens", "true"});
  EXPECT_TRUE(Load(TinyTokenizerJson(), R"({"split_special_tokens": false})").ok());
}

TEST(HfTokenizerRefusalTest, DeeplyNestedJsonIsRefusedWithoutRecursing) {
  std::string deep(200000, '[');
  deep += std::string(200000, ']');
  Json j = TinyTokenizerJson();
  std::string text = j.dump();
  const std::string key = "\"dropout\":null";
  ASSERT_NE(text.find(key), std::string::npos);
  text.replace(text.find(key), key.size(), "\"dropout\":" + deep);
  auto t = BpeTokenizer::FromHfJson(text, "", "src");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented) << t.status();
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("model.dropout is an array"));
}

TEST(HfTokenizerRefusalTest, DataLossNamesTheFileAndField) {
  const auto kD = absl::StatusCode::kDataLoss;
  ExpectError(BpeTokenizer::FromHfJson("{not json", "", "src").status(), kD,
              {"src/tokenizer.json", "not valid JSON"});
  ExpectError(BpeTokenizer::FromHfJson("[1, 2]", "", "src").status(), kD, {"top level"});
  ExpectError(BpeTokenizer::FromHfJson("", "", "src").status(), kD, {"not valid JSON"});
  auto bad = [&](auto mutate, std::vector<std::string> substrings) {
    Json j = TinyTokenizerJson();
    mutate(j);
    ExpectError(Load(j), kD, substrings);
  };
  bad([](Json& j) { j.erase("model"); }, {"src/tokenizer.json", "model"});
  bad([](Json& j) { j["model"].erase("vocab"); }, {"model.vocab"});
  bad([](Json& j) { j["model"].erase("merges"); }, {"model.merges"});
  bad([](Json& j) { j["model"].erase("type"); }, {"model.type", "missing"});
  bad([](Json& j) { j["model"]["vocab"]["a"] = -1; }, {"model.vocab", "-1"});
  bad([](Json& j) { j["model"]["vocab"]["a"] = 1099511627776LL; }, {"model.vocab"});
  bad([](Json& j) { j["model"]["vocab"]["a"] = "zero"; }, {"model.vocab"});
  bad([](Json& j) { j["model"]["vocab"]["a"] = 1; }, {"model.vocab", "unique"});
  bad([](Json& j) { j["model"]["vocab"]["Ġab"] = 40; }, {"gaps"});
  bad([](Json& j) { j["model"]["merges"].push_back("a c"); }, {"model.merges[2]", "a c"});
  bad([](Json& j) { j["model"]["merges"].push_back("b a"); }, {"model.merges[2]"});  // "ba"
  bad([](Json& j) { j["model"]["merges"].push_back("ab"); }, {"model.merges[2]", "one space"});
  bad([](Json& j) { j["model"]["merges"].push_back(Json::array({1, 2})); }, {"model.merges[2]"});
  bad([](Json& j) { j["model"]["byte_fallback"] = "yes"; }, {"model.byte_fallback", "yes"});
  bad([](Json& j) { j["model"]["unk_token"] = "<unk>"; }, {"model.unk_token", "<unk>"});
  bad([](Json& j) { j["added_tokens"][0]["id"] = 6; }, {"gaps"});
  bad([](Json& j) { j["added_tokens"][0]["id"] = -3; }, {"added_tokens[0].id"});
  bad([](Json& j) { j["added_tokens"][0]["content"] = ""; }, {"added_tokens[0].content"});
  bad([](Json& j) { j["added_tokens"].push_back(j["added_tokens"][0]); }, {"added_tokens[1].id"});
  bad([](Json& j) { j["pre_tokenizer"]["use_regex"] = 1; }, {"pre_tokenizer.use_regex"});
  bad(
      [](Json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
      },
      {"pre_tokenizer.replacement"});
  bad(
      [](Json& j) {
        j["normalizer"] = {{"type", "Replace"}, {"content", "x"}};
      },
      {"normalizer.pattern"});
  bad(
      [](Json& j) {
        j["post_processor"] = Json::parse(R"({"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<t>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {}})");
      },
      {"post_processor.special_tokens", "<t>"});
  // tokenizer_config.json problems name that file.
  const Json tj = TinyTokenizerJson();
  ExpectError(Load(tj, "{oops"), kD, {"src/tokenizer_config.json", "not valid JSON"});
  ExpectError(Load(tj, R"({"eos_token": "</s>"})"), kD,
              {"src/tokenizer_config.json", "eos_token", "</s>"});
  ExpectError(Load(tj, R"({"pad_token": 7})"), kD, {"src/tokenizer_config.json", "pad_token"});
  ExpectError(Load(tj, R"({"chat_template": 3})"), kD, {"chat_template"});
  ExpectError(Load(tj, R"({"chat_template": [{"name": "default"}]})"), kD, {"chat_template[0]"});
  // Accepted config forms.
  auto t = BpeTokenizer::FromHfJson(
      tj.dump(),
      R"({"bos_token": {"content": "<s>", "__type": "AddedToken"}, "eos_token": "<s>",
          "unk_token": null, "pad_token": "ab", "model_max_length": 1e30,
          "chat_template": [{"name": "tool_use", "template": "T"},
                            {"name": "default", "template": "D"}]})",
      "src");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos_id(), 5);
  EXPECT_EQ(t->eos_id(), 5);
  EXPECT_EQ(t->pad_id(), 2);
  EXPECT_EQ(t->unk_id(), -1);
  EXPECT_EQ(t->chat_template(), "D");
}

TEST(HfTokenizerRefusalTest, MissingFolderIsNotFound) {
  auto t = BpeTokenizer::FromHfFolder("no/such/folder");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("no/such/folder/tokenizer.json"));
}

}  // namespace
}  // namespace lspo::model
