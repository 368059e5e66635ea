// Tests for text/tokenizer.h and text/chat_template.h against oracle ids made by
// tests/oracle/make_tokenizer_oracle.py (HF tokenizers / transformers) and the GPT-2 ids listed
// in datasets/README.md. Run from the repository root.
#include "text/tokenizer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "nlohmann/json.hpp"
#include "tests/chatml_reference.h"
#include "tests/test_files.h"
#include "text/chat_template.h"

namespace lspo::model {
namespace {

using ::lspo::tests::ApplyChatMlTemplate;
using ::lspo::tests::ReadAll;

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr char kGgufPath[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kOraclePath[] = "tests/oracle/data/tokenizer_oracle.json";
constexpr char kGpt2Vocab[] = "datasets/gpt2-tokenizer/vocab.json";
constexpr char kGpt2Merges[] = "datasets/gpt2-tokenizer/merges.txt";
constexpr char kMobyDick[] = "datasets/moby-dick/moby-dick.txt";

const nlohmann::json& Oracle() {
  static const nlohmann::json* j = [] {
    std::string text = ReadAll(kOraclePath);
    return new nlohmann::json(nlohmann::json::parse(text, nullptr, false));
  }();
  return *j;
}

const std::set<int>& UnmappedBytes() {
  static const std::set<int>* s =
      new std::set<int>(Oracle()["bytes_without_symbol"].get<std::set<int>>());
  return *s;
}

std::string WithoutUnmappedBytes(const std::string& text) {
  std::string out;
  for (char ch : text) {
    if (!UnmappedBytes().count(static_cast<uint8_t>(ch))) out.push_back(ch);
  }
  return out;
}

// Shared SmolLM2 tokenizer (nullptr if the GGUF file is absent).
const BpeTokenizer* SmolLm() {
  static const BpeTokenizer* tok = []() -> const BpeTokenizer* {
    if (!std::filesystem::exists(kGgufPath)) return nullptr;
    auto gguf = GgufFile::Open(kGgufPath);
    if (!gguf.ok()) {
      ADD_FAILURE() << gguf.status();
      return nullptr;
    }
    auto t = BpeTokenizer::FromGguf(*gguf);
    if (!t.ok()) {
      ADD_FAILURE() << t.status();
      return nullptr;
    }
    return new BpeTokenizer(std::move(t).value());
  }();
  return tok;
}

const BpeTokenizer& Gpt2() {
  static const BpeTokenizer* tok = [] {
    auto t = BpeTokenizer::FromGpt2Files(kGpt2Vocab, kGpt2Merges);
    EXPECT_TRUE(t.ok()) << t.status();
    return new BpeTokenizer(std::move(t).value());
  }();
  return *tok;
}

#define REQUIRE_SMOLLM()                                         \
  const BpeTokenizer* tok = SmolLm();                            \
  if (tok == nullptr)                                            \
  GTEST_SKIP() << kGgufPath << " is absent (gitignored model); " \
               << "place the GGUF there to run this test"

TEST(TokenizerOracleTest, OracleFileIsPresent) {
  ASSERT_FALSE(Oracle().is_discarded()) << kOraclePath;
  EXPECT_GE(Oracle()["smollm_cases"].size(), 25u);
  EXPECT_GE(Oracle()["gpt2_cases"].size(), 25u);
}

TEST(SmolLmTokenizerTest, SpecialIdsAndVocabMatchOracle) {
  REQUIRE_SMOLLM();
  const auto& ids = Oracle()["special_ids"];
  EXPECT_EQ(tok->bos_id(), ids["bos"].get<int>());
  EXPECT_EQ(tok->eos_id(), ids["eos"].get<int>());
  EXPECT_EQ(tok->pad_id(), ids["pad"].get<int>());
  EXPECT_EQ(tok->unk_id(), ids["unk"].get<int>());
  EXPECT_EQ(tok->vocab_size(), Oracle()["vocab_size"].get<int>());
  EXPECT_EQ(tok->pre_tokenizer(), PreTokenizerKind::kSmolLm);
  EXPECT_EQ(tok->TokenToId("<|im_start|>"), 1);
  EXPECT_EQ(tok->IdToToken(2), "<|im_end|>");
  EXPECT_EQ(tok->TokenToId("no such token"), -1);
  EXPECT_EQ(tok->IdToToken(-1), "");
  EXPECT_EQ(tok->IdToToken(tok->vocab_size()), "");
}

TEST(SmolLmTokenizerTest, EncodeMatchesOracleAndRoundTrips) {
  REQUIRE_SMOLLM();
  int checked = 0;
  for (const auto& c : Oracle()["smollm_cases"]) {
    std::string text = c["text"].get<std::string>();
    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got = tok->Encode(text);
    EXPECT_THAT(got, ElementsAreArray(want)) << "case " << c["name"];
    // Decode gives the text back, less the bytes that have no symbol (dropped by Encode).
    EXPECT_EQ(tok->Decode(got), WithoutUnmappedBytes(text)) << "case " << c["name"];
    ++checked;
  }
  EXPECT_GE(checked, 25);
}

TEST(SmolLmTokenizerTest, ChatTemplateMatchesOracle) {
  REQUIRE_SMOLLM();
  for (const auto& c : Oracle()["chat_cases"]) {
    std::vector<ChatMessage> messages;
    for (const auto& m : c["messages"]) {
      messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
    }
    std::string rendered = ApplyChatMlTemplate(messages, c["add_generation_prompt"].get<bool>());
    EXPECT_EQ(rendered, c["text"].get<std::string>()) << "case " << c["name"];
    EXPECT_THAT(tok->Encode(rendered), ElementsAreArray(c["ids"].get<std::vector<int32_t>>()))
        << "case " << c["name"];
  }
}

TEST(ChatTemplateTest, EmptyConversationAndCustomSystem) {
  // Template semantics (docs/formats.md §5): no messages -> no system turn.
  EXPECT_EQ(ApplyChatMlTemplate({}, false), "");
  EXPECT_EQ(ApplyChatMlTemplate({}, true), "<|im_start|>assistant\n");
  std::vector<ChatMessage> m = {{"user", "hi"}};
  EXPECT_EQ(ApplyChatMlTemplate(m, false, "Be brief"),
            "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
}

TEST(SmolLmTokenizerTest, ByteStringsRoundTrip) {
  REQUIRE_SMOLLM();
  // Every single byte survives Encode -> Decode, except the oracle's list of bytes without a
  // symbol, which encode to nothing.
  for (int b = 0; b < 256; ++b) {
    std::string s(1, static_cast<char>(b));
    std::vector<int32_t> ids = tok->Encode(s);
    if (UnmappedBytes().count(b)) {
      EXPECT_TRUE(ids.empty()) << "byte " << b;
    } else {
      EXPECT_EQ(tok->Decode(ids), s) << "byte " << b;
    }
  }
  // Ill-formed UTF-8 (Latin-1 text, truncated sequences) round-trips byte for byte.
  const std::string bad =
      "caf\xe9 \xa3"
      "100 \xe4\xb8 ok \xf0\x9f\x98";
  EXPECT_EQ(tok->Decode(tok->Encode(bad)), bad);
  EXPECT_EQ(tok->Decode(tok->Encode("a\xff\xfe"
                                    "b")),
            "ab");
  // Out-of-range ids are skipped.
  EXPECT_EQ(tok->Decode({-5, 19556, 1 << 30}), "Hello");
}

TEST(SmolLmTokenizerTest, EncodesMobyDickQuicklyAndRoundTrips) {
  REQUIRE_SMOLLM();
  std::string text = ReadAll(kMobyDick);
  ASSERT_GT(text.size(), 1000000u);
  text.resize(1000000);
  // Do not cut a UTF-8 sequence in the middle (it would still round-trip, but keep it clean).
  while (!text.empty() && (static_cast<uint8_t>(text.back()) & 0xC0) == 0x80) text.pop_back();
  auto start = std::chrono::steady_clock::now();
  std::vector<int32_t> ids = tok->Encode(text);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(secs, 10.0) << "encoding 1 MB took " << secs << " s";
  EXPECT_GT(ids.size(), 150000u);
  EXPECT_EQ(tok->Decode(ids), text);
  // The oracle's 2000-character prefix ids are a prefix of the ids of the longer text, up to
  // the last pre-token (which the cut may have split).
  for (const auto& c : Oracle()["smollm_cases"]) {
    if (c["name"] != "moby_2000") continue;
    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    ASSERT_GT(want.size(), 10u);
    want.resize(want.size() - 3);
    EXPECT_THAT(std::vector<int32_t>(ids.begin(), ids.begin() + want.size()),
                ElementsAreArray(want));
  }
}

TEST(SmolLmTokenizerTest, WriteHfFilesProducesLoadableLayout) {
  REQUIRE_SMOLLM();
  std::string dir = ::testing::TempDir() + "/lspo_hf_tokenizer";
  ASSERT_TRUE(tok->WriteHfFiles(dir).ok());
  auto tj = nlohmann::json::parse(ReadAll(dir + "/tokenizer.json"), nullptr, false);
  ASSERT_FALSE(tj.is_discarded());
  EXPECT_EQ(tj["model"]["type"], "BPE");
  EXPECT_EQ(tj["model"]["vocab"].size(), 49152u);   // docs/formats.md §5
  EXPECT_EQ(tj["model"]["merges"].size(), 48900u);  // docs/formats.md §5
  EXPECT_EQ(tj["model"]["vocab"]["<|im_end|>"], 2);
  EXPECT_EQ(tj["model"]["merges"][0], tok->IdToToken(tok->TokenToId("Ġ")) + " t");
  ASSERT_EQ(tj["added_tokens"].size(), 17u);  // ids 0-16 (docs/formats.md §5)
  for (int i = 0; i < 17; ++i) {
    EXPECT_EQ(tj["added_tokens"][i]["id"], i);
    EXPECT_EQ(tj["added_tokens"][i]["special"], true);
    EXPECT_EQ(tj["added_tokens"][i]["normalized"], false);
  }
  EXPECT_TRUE(tj["normalizer"].is_null());
  EXPECT_EQ(tj["pre_tokenizer"]["type"], "Sequence");
  EXPECT_EQ(tj["pre_tokenizer"]["pretokenizers"][0]["type"], "Digits");
  EXPECT_EQ(tj["pre_tokenizer"]["pretokenizers"][0]["individual_digits"], true);
  EXPECT_EQ(tj["pre_tokenizer"]["pretokenizers"][1]["type"], "ByteLevel");
  EXPECT_EQ(tj["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"], false);
  EXPECT_EQ(tj["decoder"]["type"], "ByteLevel");

  auto cfg = nlohmann::json::parse(ReadAll(dir + "/tokenizer_config.json"), nullptr, false);
  ASSERT_FALSE(cfg.is_discarded());
  EXPECT_EQ(cfg["tokenizer_class"], "PreTrainedTokenizerFast");
  EXPECT_EQ(cfg["bos_token"], "<|im_start|>");
  EXPECT_EQ(cfg["eos_token"], "<|im_end|>");
  EXPECT_EQ(cfg["pad_token"], "<|im_end|>");
  EXPECT_EQ(cfg["unk_token"], "<|endoftext|>");
  EXPECT_EQ(cfg["model_max_length"], 8192);
  EXPECT_EQ(cfg["chat_template"], tok->chat_template());
  EXPECT_TRUE(absl::StartsWith(tok->chat_template(), "{% for message in messages %}"));

  auto stm = nlohmann::json::parse(ReadAll(dir + "/special_tokens_map.json"), nullptr, false);
  ASSERT_FALSE(stm.is_discarded());
  EXPECT_EQ(stm["eos_token"], "<|im_end|>");

  // A regular file in place of the directory is rejected.
  std::string file = ::testing::TempDir() + "/lspo_not_a_dir";
  std::ofstream(file) << "x";
  absl::Status st = tok->WriteHfFiles(file);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr(file));
}

// ---------------------------------------------------------------------------------------------
TEST(Gpt2TokenizerTest, KnownIdsFromDataReadme) {
  const BpeTokenizer& tok = Gpt2();
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_THAT(tok.Encode("Hello world"), ElementsAreArray({15496, 995}));
  EXPECT_THAT(tok.Encode("Call me Ishmael. Some years ago"),
              ElementsAreArray({14134, 502, 1148, 21720, 417, 13, 2773, 812, 2084}));
  EXPECT_EQ(tok.eos_id(), tok.TokenToId("<|endoftext|>"));
  EXPECT_EQ(tok.pad_id(), -1);
}

TEST(Gpt2TokenizerTest, EncodeMatchesOracleAndRoundTrips) {
  const BpeTokenizer& tok = Gpt2();
  int checked = 0;
  for (const auto& c : Oracle()["gpt2_cases"]) {
    std::string text = c["text"].get<std::string>();
    std::vector<int32_t> got = tok.Encode(text);
    EXPECT_THAT(got, ElementsAreArray(c["ids"].get<std::vector<int32_t>>()))
        << "case " << c["name"];
    EXPECT_EQ(tok.Decode(got), text) << "case " << c["name"];
    ++checked;
  }
  EXPECT_GE(checked, 25);
}

TEST(Gpt2TokenizerTest, MissingAndMalformedFiles) {
  auto missing = BpeTokenizer::FromGpt2Files("no/such/vocab.json", kGpt2Merges);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("no/such/vocab.json"));

  std::string dir = ::testing::TempDir();
  std::string vocab = dir + "/lspo_vocab.json", merges = dir + "/lspo_merges.txt";
  std::ofstream(vocab) << R"({"a": 0, "b": 1, "ab": 2})";
  std::ofstream(merges) << "#version: 0.2\na b\nab\n";
  auto bad_merge = BpeTokenizer::FromGpt2Files(vocab, merges);
  EXPECT_EQ(bad_merge.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(bad_merge.status().message()), HasSubstr("lspo_merges.txt':3"));

  std::ofstream(merges) << "a c\n";
  auto unknown = BpeTokenizer::FromGpt2Files(vocab, merges);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kDataLoss);

  std::ofstream(vocab) << R"({"a": 0, "b": 5})";
  auto gap = BpeTokenizer::FromGpt2Files(vocab, merges);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kDataLoss);

  std::ofstream(vocab) << "{not json";
  auto not_json = BpeTokenizer::FromGpt2Files(vocab, merges);
  EXPECT_EQ(not_json.status().code(), absl::StatusCode::kDataLoss);
}

TEST(BpeTokenizerTest, CreateRejectsBadSpecs) {
  BpeTokenizerSpec empty;
  EXPECT_EQ(BpeTokenizer::Create(empty).status().code(), absl::StatusCode::kInvalidArgument);

  BpeTokenizerSpec types;
  types.tokens = {"a", "b"};
  types.token_types = {1};
  EXPECT_EQ(BpeTokenizer::Create(types).status().code(), absl::StatusCode::kInvalidArgument);

  BpeTokenizerSpec ids;
  ids.tokens = {"a", "b"};
  ids.eos_id = 2;
  EXPECT_EQ(BpeTokenizer::Create(ids).status().code(), absl::StatusCode::kInvalidArgument);

  BpeTokenizerSpec merge;
  merge.tokens = {"a", "b"};
  merge.merges = {"a b"};  // "ab" is not in the vocabulary
  EXPECT_EQ(BpeTokenizer::Create(merge).status().code(), absl::StatusCode::kInvalidArgument);
}

// Minimal GGUF v3 writer for metadata-only files (docs/formats.md §1).
class GgufBuilder {
 public:
  void AddString(const std::string& key, const std::string& value) {
    Key(key);
    U32(8);
    Str(value);
    ++n_kv_;
  }
  std::vector<uint8_t> Build() const {
    std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};
    auto put = [&out](uint64_t v, int bytes) {
      for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
    };
    put(3, 4);
    put(0, 8);
    put(n_kv_, 8);
    out.insert(out.end(), kv_.begin(), kv_.end());
    while (out.size() % 32 != 0) out.push_back(0);
    return out;
  }

 private:
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) kv_.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void Str(const std::string& s) {
    uint64_t n = s.size();
    for (int i = 0; i < 8; ++i) kv_.push_back(static_cast<uint8_t>(n >> (8 * i)));
    kv_.insert(kv_.end(), s.begin(), s.end());
  }
  void Key(const std::string& k) { Str(k); }
  std::vector<uint8_t> kv_;
  uint64_t n_kv_ = 0;
};

TEST(BpeTokenizerTest, FromGgufRejectsUnsupportedTokenizers) {
  {
    GgufBuilder b;
    b.AddString("tokenizer.ggml.model", "llama");  // SentencePiece
    auto gguf = GgufFile::FromBytes(b.Build(), "spm.gguf");
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    auto t = BpeTokenizer::FromGguf(*gguf);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("llama"));
  }
  {
    GgufBuilder b;
    b.AddString("tokenizer.ggml.model", "gpt2");
    b.AddString("tokenizer.ggml.pre", "deepseek-coder");  // a llama.cpp name not read here
    auto gguf = GgufFile::FromBytes(b.Build(), "ds.gguf");
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    auto t = BpeTokenizer::FromGguf(*gguf);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("deepseek-coder"));
    EXPECT_THAT(std::string(t.status().message()), HasSubstr("llama-bpe"));
  }
  {
    GgufBuilder b;
    b.AddString("tokenizer.ggml.model", "gpt2");
    b.AddString("tokenizer.ggml.pre", "smollm");  // no tokens
    auto gguf = GgufFile::FromBytes(b.Build(), "notokens.gguf");
    ASSERT_TRUE(gguf.ok()) << gguf.status();
    EXPECT_FALSE(BpeTokenizer::FromGguf(*gguf).ok());
  }
}

TEST(PreTokenizeTest, PiecesConcatenateToInput) {
  // Property: the split is a partition of the input for both kinds.
  for (const auto& c : Oracle()["smollm_cases"]) {
    std::string text = c["text"].get<std::string>();
    for (PreTokenizerKind kind : {PreTokenizerKind::kGpt2, PreTokenizerKind::kSmolLm}) {
      std::string joined;
      for (absl::string_view p : PreTokenize(text, kind)) {
        EXPECT_FALSE(p.empty());
        joined.append(p.data(), p.size());
      }
      EXPECT_EQ(joined, text);
    }
  }
}

}  // namespace
}  // namespace lspo::model
