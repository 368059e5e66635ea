// Tests for data/datasets.h on the real files in datasets/ (run from the repository root).
#include "data/datasets.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "data/records.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "nlohmann/json.hpp"
#include "tests/chatml_reference.h"
#include "tests/test_files.h"
#include "text/chat_template.h"

namespace lspo::data {
namespace {

using ::lspo::tests::ApplyChatMlTemplate;
using ::lspo::tests::ReadAll;
using ::lspo::tests::TempFile;

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr char kTrain[] = "datasets/sms-spam/train.tsv";
constexpr char kTest[] = "datasets/sms-spam/test.tsv";
constexpr char kMobyDick[] = "datasets/moby-dick/moby-dick.txt";
constexpr char kGgufPath[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kOraclePath[] = "tests/oracle/data/tokenizer_oracle.json";

const model::BpeTokenizer* SmolLm() {
  static const model::BpeTokenizer* tok = []() -> const model::BpeTokenizer* {
    if (!std::filesystem::exists(kGgufPath)) return nullptr;
    auto gguf = model::GgufFile::Open(kGgufPath);
    if (!gguf.ok()) return nullptr;
    auto t = model::BpeTokenizer::FromGguf(*gguf);
    if (!t.ok()) return nullptr;
    return new model::BpeTokenizer(std::move(t).value());
  }();
  return tok;
}

#define REQUIRE_SMOLLM()                                                              \
  const model::BpeTokenizer* tok = SmolLm();                                          \
  if (tok == nullptr) GTEST_SKIP() << kGgufPath << " is absent (gitignored model); " \
                                   << "place the GGUF there to run this test";        \
  auto tmpl_or = model::ChatTemplate::ForTokenizer(*tok);                             \
  ASSERT_TRUE(tmpl_or.ok()) << tmpl_or.status();                                      \
  const model::ChatTemplate& tmpl = *tmpl_or

// Independent count: std::getline, label = bytes before the first tab.
std::map<std::string, int> CountLabelsByHand(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::map<std::string, int> counts;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    counts[line.substr(0, line.find('\t'))]++;
  }
  return counts;
}

TEST(LoadLabeledTsvTest, SmsSpamCountsMatchIndependentCount) {
  for (auto [path, rows] : {std::pair<const char*, size_t>{kTrain, 926}, {kTest, 398}}) {
    auto data = LoadLabeledTsv(path);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(data->size(), rows) << path;  // datasets/README.md
    std::map<std::string, int> counts;
    for (const LabeledText& r : *data) {
      counts[r.label]++;
      EXPECT_FALSE(r.text.empty());
    }
    EXPECT_EQ(counts, CountLabelsByHand(path)) << path;
    EXPECT_EQ(counts.size(), 2u);
    EXPECT_GT(counts["ham"], 0);
    EXPECT_GT(counts["spam"], 0);
  }
}

TEST(LoadLabeledTsvTest, Latin1LinesBecomeUtf8) {
  // Line 159 of test.tsv (1-based) stores "£" as the single byte 0xA3.
  std::istringstream raw(ReadAll(kTest));
  std::string line;
  for (int i = 0; i < 159; ++i) std::getline(raw, line);
  ASSERT_NE(line.find('\xa3'), std::string::npos);
  auto data = LoadLabeledTsv(kTest);
  ASSERT_TRUE(data.ok());
  const std::string& text = (*data)[158].text;
  EXPECT_NE(text.find("\xc2\xa3"), std::string::npos) << text;  // U+00A3 in UTF-8
  // Latin-1 byte b >= 0x80 is U+00b: UTF-8 0xC0 | b >> 6, 0x80 | b & 0x3F.
  std::string want;
  for (char ch : line.substr(line.find('\t') + 1)) {
    unsigned char b = static_cast<unsigned char>(ch);
    if (b < 0x80) {
      want.push_back(ch);
    } else {
      want.push_back(static_cast<char>(0xC0 | (b >> 6)));
      want.push_back(static_cast<char>(0x80 | (b & 0x3F)));
    }
  }
  EXPECT_EQ(text, want);
}

TEST(LoadLabeledTsvTest, LineWithoutTabNamesTheLine) {
  std::string path = TempFile("lspo_bad.tsv", "ham\thello\r\n\nspam\tbuy now\nno tab here\n");
  auto data = LoadLabeledTsv(path);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr(path + ":4"));

  std::string empty_label = TempFile("lspo_empty_label.tsv", "\ttext\n");
  EXPECT_EQ(LoadLabeledTsv(empty_label).status().code(), absl::StatusCode::kInvalidArgument);

  std::string ok = TempFile("lspo_ok.tsv", "ham\thello\r\n\nspam\tbuy\tnow\n");
  auto rows = LoadLabeledTsv(ok);
  ASSERT_TRUE(rows.ok());
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].text, "hello");  // "\r" removed
  EXPECT_EQ((*rows)[1].text, "buy\tnow");
}

TEST(ReadJsonRecordsTest, FileAndRecordSizesAreBounded) {
  // A file over the file limit and a line over the record limit are refused naming the file
  // (and the line), before they are held or parsed whole.
  const std::string path =
      (std::filesystem::temp_directory_path() / "lspo-records-limits.jsonl").string();
  {
    std::ofstream f(path);
    f << "{\"text\": \"short\"}\n{\"text\": \"" << std::string(100, 'x') << "\"}\n";
  }
  EXPECT_TRUE(ReadJsonRecords(path).ok());
  DataFileLimits small_file;
  small_file.max_file_bytes = 50;
  auto file = ReadJsonRecords(path, small_file);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kResourceExhausted) << file.status();
  EXPECT_NE(file.status().message().find(path), std::string::npos) << file.status();
  DataFileLimits small_record;
  small_record.max_record_bytes = 50;
  auto record = ReadJsonRecords(path, small_record);
  EXPECT_EQ(record.status().code(), absl::StatusCode::kResourceExhausted) << record.status();
  EXPECT_NE(record.status().message().find(path + ":2"), std::string::npos) << record.status();
  std::filesystem::remove(path);
}

TEST(LoadLabeledTest, MissingFileIsNotFound) {
  for (const char* p : {"no/such/file.tsv", "no/such/file.jsonl", "no/such/file.json"}) {
    auto data = LoadLabeled(p);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound) << p;
    EXPECT_THAT(std::string(data.status().message()), HasSubstr(p));
  }
}

TEST(LoadLabeledTest, JsonlJsonAndDispatch) {
  std::string jsonl = TempFile(
      "lspo_rows.jsonl",
      "{\"label\": \"spam\", \"text\": \"WIN \\u00a31000\\tnow\", \"id\": 3}\n\n"
      "{\"text\": \"hi\", \"label\": \"ham\"}\n");
  auto rows = LoadLabeled(jsonl);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].label, "spam");
  EXPECT_EQ((*rows)[0].text, "WIN \xc2\xa3" "1000\tnow");
  EXPECT_EQ((*rows)[1].label, "ham");

  std::string array = TempFile("lspo_rows.json",
                               "[{\"label\": \"a\", \"text\": \"x\"}, {\"label\": \"b\", "
                               "\"text\": \"y\"}]");
  auto arr = LoadLabeled(array);
  ASSERT_TRUE(arr.ok()) << arr.status();
  ASSERT_EQ(arr->size(), 2u);
  EXPECT_EQ((*arr)[1].text, "y");

  std::string bad_json = TempFile("lspo_bad.jsonl", "{\"label\": \"a\", \"text\": \"x\"}\n{oops\n");
  auto bad = LoadLabeled(bad_json);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(bad_json + ":2"));

  std::string no_text = TempFile("lspo_no_text.jsonl", "{\"label\": \"a\", \"txt\": \"x\"}\n");
  EXPECT_EQ(LoadLabeled(no_text).status().code(), absl::StatusCode::kInvalidArgument);

  EXPECT_EQ(LoadLabeled(TempFile("lspo_rows.csv", "a,b\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
TEST(BuildClassificationChatTest, PromptMatchesOracleChat) {
  REQUIRE_SMOLLM();
  // The oracle's "user_only_gen" chat is this prompt rendered and tokenised by transformers.
  auto oracle = nlohmann::json::parse(ReadAll(kOraclePath), nullptr, false);
  ASSERT_FALSE(oracle.is_discarded());
  std::vector<int32_t> want;
  for (const auto& c : oracle["chat_cases"]) {
    if (c["name"] == "user_only_gen") want = c["ids"].get<std::vector<int32_t>>();
  }
  ASSERT_FALSE(want.empty());
  auto prompt = BuildClassificationPrompt(*tok, tmpl, "WINNER!! Call 09061701461 now.",
                                          kSpamQuestion, "", 512);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_THAT(prompt->input_ids, ElementsAreArray(want));
  EXPECT_EQ(prompt->answer_start, static_cast<int32_t>(want.size()));
  for (int32_t l : prompt->labels) EXPECT_EQ(l, kIgnoreIndex);

  auto train = BuildClassificationChat(*tok, tmpl, "WINNER!! Call 09061701461 now.", "spam",
                                       kSpamQuestion, "", 512);
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_GT(train->input_ids.size(), want.size());
  EXPECT_THAT(std::vector<int32_t>(train->input_ids.begin(),
                                   train->input_ids.begin() + want.size()),
              ElementsAreArray(want));
}

TEST(BuildClassificationChatTest, LossOnlyOnAnswerAndImEnd) {
  REQUIRE_SMOLLM();
  auto rows = LoadLabeledTsv(kTrain);
  ASSERT_TRUE(rows.ok());
  for (size_t i = 0; i < 40; ++i) {
    const LabeledText& r = (*rows)[i];
    auto ex = BuildClassificationChat(*tok, tmpl, r.text, r.label, kSpamQuestion,
                                      "You classify SMS messages.", 256);
    ASSERT_TRUE(ex.ok()) << ex.status();
    ASSERT_EQ(ex->input_ids.size(), ex->labels.size());
    std::vector<int32_t> answer;
    for (size_t t = 0; t < ex->labels.size(); ++t) {
      if (static_cast<int32_t>(t) < ex->answer_start) {
        EXPECT_EQ(ex->labels[t], kIgnoreIndex);
      } else {
        EXPECT_EQ(ex->labels[t], ex->input_ids[t]);
        answer.push_back(ex->labels[t]);
      }
    }
    EXPECT_EQ(tok->Decode(answer), r.label + "<|im_end|>");
    EXPECT_EQ(ex->input_ids.back(), 2);  // <|im_end|>, docs/formats.md §5
    // The prompt part is exactly the tokenised ChatML text (independent rendering).
    std::string prompt = ApplyChatMlTemplate(
        {{"system", "You classify SMS messages."},
         {"user", std::string(kSpamQuestion) + "\n\n" + r.text}},
        true);
    if (ex->input_ids.size() < 256) {
      EXPECT_EQ(tok->Decode(ex->input_ids), prompt + r.label + "<|im_end|>");
    }
  }
}

// With SmolLM2's ChatML template the examples are the ChatML formula of earlier versions:
// Encode(ApplyChatMlTemplate(prompt)) ++ Encode(label) ++ [<|im_end|>], on every training row.
TEST(BuildClassificationChatTest, SmolLm2ExamplesAreTheChatMlFormula) {
  REQUIRE_SMOLLM();
  auto rows = LoadLabeledTsv(kTrain);
  ASSERT_TRUE(rows.ok());
  for (const LabeledText& r : *rows) {
    auto ex = BuildClassificationChat(*tok, tmpl, r.text, r.label, kSpamQuestion, "", 4096);
    ASSERT_TRUE(ex.ok()) << ex.status();
    std::vector<int32_t> want = tok->Encode(ApplyChatMlTemplate(
        {{"user", std::string(kSpamQuestion) + "\n\n" + r.text}}, true));
    const std::vector<int32_t> label = tok->Encode(r.label);
    want.insert(want.end(), label.begin(), label.end());
    want.push_back(2);  // <|im_end|>
    ASSERT_EQ(ex->input_ids, want) << r.text;
  }
}

// Other families' templates: Llama 3.1 ends the answer with <|eot_id|>, Mistral v0.1 with
// </s>; Mistral v0.3 drops the system turn unless the user's turn is last, so a system prompt
// is refused with the reason instead of a silently different prompt.
TEST(BuildClassificationChatTest, AnswerEndsWithTheTemplatesEndOfTurnToken) {
  const std::string tokenizers = "tests/oracle/data/hf_tokenizers/";
  const std::string templates = "tests/oracle/data/chat_templates/";
  struct Case {
    const char* tokenizer;
    const char* tmpl;
    const char* system;
    const char* answer;  // decoded answer tokens
  };
  for (const Case& c : {Case{"llama3", "llama3.1.jinja", "Be brief.", "spam<|eot_id|>"},
                        Case{"llama3", "llama3.jinja", "", "spam<|eot_id|>"},
                        Case{"spm_metaspace", "mistral-v0.3.jinja", "", "spam</s>"},
                        Case{"qwen2", "qwen2.5.jinja", "", "spam<|im_end|>"}}) {
    SCOPED_TRACE(c.tmpl);
    auto tok = model::BpeTokenizer::FromHfFolder(tokenizers + c.tokenizer);
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto tmpl = model::ChatTemplate::ForTokenizer(*tok, templates + c.tmpl);
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    auto ex = BuildClassificationChat(*tok, *tmpl, "WINNER!! Call now.", "spam", kSpamQuestion,
                                      c.system, 256);
    ASSERT_TRUE(ex.ok()) << ex.status();
    std::vector<int32_t> answer(ex->input_ids.begin() + ex->answer_start, ex->input_ids.end());
    EXPECT_EQ(tok->Decode(answer), c.answer);
    EXPECT_TRUE(tok->IsSpecial(answer.back()));
    for (int32_t t = 0; t < ex->answer_start; ++t) EXPECT_EQ(ex->labels[t], kIgnoreIndex);
  }
  auto tok = model::BpeTokenizer::FromHfFolder(tokenizers + "spm_metaspace");
  ASSERT_TRUE(tok.ok());
  auto v03 = model::ChatTemplate::ForTokenizer(*tok, templates + "mistral-v0.3.jinja");
  ASSERT_TRUE(v03.ok());
  auto refused = BuildClassificationChat(*tok, *v03, "x", "spam", kSpamQuestion, "Be brief.", 256);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("system"));
}

TEST(BuildClassificationChatTest, LongTextIsCutToFit) {
  REQUIRE_SMOLLM();
  std::string text = ReadAll(kMobyDick).substr(0, 20000);
  for (int max_len : {60, 64, 100, 257}) {
    auto ex = BuildClassificationChat(*tok, tmpl, text, "ham", kSpamQuestion, "", max_len);
    ASSERT_TRUE(ex.ok()) << ex.status();
    EXPECT_LE(ex->input_ids.size(), static_cast<size_t>(max_len));
    EXPECT_GE(ex->input_ids.size(), static_cast<size_t>(max_len) - 3);  // nearly full
    std::vector<int32_t> answer(ex->input_ids.begin() + ex->answer_start, ex->input_ids.end());
    EXPECT_EQ(tok->Decode(answer), "ham<|im_end|>");
    // The message in the prompt is a prefix of the text.
    std::string prompt = tok->Decode(
        std::vector<int32_t>(ex->input_ids.begin(), ex->input_ids.begin() + ex->answer_start));
    std::string head = std::string(kSpamQuestion) + "\n\n";
    size_t start = prompt.find(head);
    ASSERT_NE(start, std::string::npos);
    size_t end = prompt.rfind("<|im_end|>\n<|im_start|>assistant\n");
    std::string message = prompt.substr(start + head.size(), end - start - head.size());
    EXPECT_TRUE(absl::StartsWith(text, message)) << message;
    EXPECT_GT(message.size(), 0u);

    auto eval = BuildClassificationPrompt(*tok, tmpl, text, kSpamQuestion, "", max_len);
    ASSERT_TRUE(eval.ok());
    EXPECT_LE(eval->input_ids.size(), static_cast<size_t>(max_len));
  }
  auto too_small = BuildClassificationChat(*tok, tmpl, text, "ham", kSpamQuestion, "", 20);
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_small.status().message()), HasSubstr("max_len 20"));
  EXPECT_EQ(BuildClassificationChat(*tok, tmpl, text, "", kSpamQuestion, "", 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildClassificationPrompt(*tok, tmpl, text, kSpamQuestion, "", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
TEST(PackTextBlocksTest, MobyDickBlocksArePrefixOfText) {
  REQUIRE_SMOLLM();
  const std::string text = ReadAll(kMobyDick);
  auto blocks = PackTextBlocks(*tok, kMobyDick, 128, 10);
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  ASSERT_EQ(blocks->size(), 10u);
  std::vector<int32_t> all;
  for (const auto& b : *blocks) {
    EXPECT_EQ(b.size(), 128u);
    all.insert(all.end(), b.begin(), b.end());
  }
  std::string decoded = tok->Decode(all);
  EXPECT_GT(decoded.size(), 1280u * 2);
  EXPECT_TRUE(absl::StartsWith(text, decoded));

  auto every = PackTextBlocks(*tok, kMobyDick, 1000, 0);
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(static_cast<int64_t>(every->size()),
            static_cast<int64_t>(tok->Encode(text).size()) / 1000);  // remainder dropped
}

TEST(PackTextBlocksTest, DocumentsSeparatedByEosAndErrors) {
  REQUIRE_SMOLLM();
  std::string a = TempFile("lspo_doc_a.txt", "First document.");
  std::string b = TempFile("lspo_doc_b.txt", "Second one here.");
  std::vector<int32_t> want = tok->Encode("First document.");
  want.push_back(tok->eos_id());
  std::vector<int32_t> bi = tok->Encode("Second one here.");
  want.insert(want.end(), bi.begin(), bi.end());
  std::vector<std::string> paths = {a, b};
  auto one = PackTextBlocks(*tok, paths, static_cast<int64_t>(want.size()), 0);
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_THAT((*one)[0], ElementsAreArray(want));
  auto too_long = PackTextBlocks(*tok, paths, static_cast<int64_t>(want.size()) + 1, 0);
  ASSERT_TRUE(too_long.ok());
  EXPECT_TRUE(too_long->empty());

  EXPECT_EQ(PackTextBlocks(*tok, "no/such/doc.txt", 8, 0).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(PackTextBlocks(*tok, a, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
TEST(MakeBatchTest, RightPadsAndMasks) {
  TokenizedExample a{{5, 6, 7, 8}, {kIgnoreIndex, kIgnoreIndex, 7, 8}, 2};
  TokenizedExample b{{9, 10}, {kIgnoreIndex, 10}, 1};
  std::vector<const TokenizedExample*> rows = {&a, &b, nullptr};
  Batch batch = MakeBatch(rows, /*pad_id=*/2);
  EXPECT_EQ(batch.batch_size, 3);
  EXPECT_EQ(batch.seq_len, 4);
  EXPECT_THAT(batch.input_ids, ElementsAreArray<int64_t>({5, 6, 7, 8, 9, 10, 2, 2, 2, 2, 2, 2}));
  EXPECT_THAT(batch.labels,
              ElementsAreArray<int64_t>({-100, -100, 7, 8, -100, 10, -100, -100, -100, -100,
                                         -100, -100}));
  EXPECT_THAT(batch.last_index, ElementsAreArray<int64_t>({3, 1, -1}));
  EXPECT_EQ(batch.num_loss_tokens, 3);
  EXPECT_EQ(batch.padding_tokens, 2 + 4);
  EXPECT_FALSE(batch.packed());  // no packed row: the model's default layout
  EXPECT_TRUE(batch.positions.empty());

  Batch empty = MakeBatch({}, 0);
  EXPECT_EQ(empty.batch_size, 0);
  EXPECT_EQ(empty.seq_len, 0);
  EXPECT_TRUE(empty.input_ids.empty());
}

// Packing in order: rows close when the next example would not fit; an example longer than
// max_len is a row of its own, uncut; the label at each later example's first token is
// ignored; MakeBatch gives positions restarting per example and segment ids, padding its own
// segment with positions running on, and unpacked rows one segment.
TEST(PackExamplesTest, PacksInOrderWithSegmentsAndPositions) {
  const TokenizedExample a{{1, 2, 3}, {kIgnoreIndex, 2, 3}, 1};
  const TokenizedExample b{{4, 5}, {kIgnoreIndex, 5}, 1};
  const TokenizedExample c{{6, 7, 8, 9}, {kIgnoreIndex, kIgnoreIndex, 8, 9}, 2};
  const TokenizedExample d{{10, 11, 12, 13, 14, 15, 16}, {kIgnoreIndex, 11, 12, 13, 14, 15, 16}, 1};
  const TokenizedExample e{{17, 18}, {17, 18}, 0};  // a label at 0, which packing must drop
  const TokenizedExample empty{};
  const std::vector<TokenizedExample> rows = PackExamples({a, b, e, c, empty, d}, 7);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_THAT(rows[0].input_ids, ElementsAreArray<int32_t>({1, 2, 3, 4, 5, 17, 18}));
  EXPECT_THAT(rows[0].labels, ElementsAreArray<int32_t>({kIgnoreIndex, 2, 3, kIgnoreIndex, 5,
                                                         kIgnoreIndex, 18}));
  EXPECT_THAT(rows[0].segment_starts, ElementsAreArray<int32_t>({0, 3, 5}));
  EXPECT_EQ(rows[0].answer_start, 1);
  EXPECT_THAT(rows[1].input_ids, ElementsAreArray<int32_t>({6, 7, 8, 9}));  // 7 + 4 > 7
  EXPECT_THAT(rows[1].segment_starts, ElementsAreArray<int32_t>({0}));
  EXPECT_THAT(rows[2].input_ids, ElementsAreArray<int32_t>({10, 11, 12, 13, 14, 15, 16}));
  // The loss tokens (positions t >= 1) are those of the examples: 2 + 1 + 1 + 2 + 6.
  int64_t loss = 0;
  for (const auto& r : rows) {
    for (size_t t = 1; t < r.labels.size(); ++t) loss += r.labels[t] != kIgnoreIndex;
  }
  EXPECT_EQ(loss, 12);
  // An example longer than max_len is a row of its own, not cut.
  const std::vector<TokenizedExample> over = PackExamples({d, a}, 6);
  ASSERT_EQ(over.size(), 2u);
  EXPECT_EQ(over[0].input_ids.size(), 7u);
  EXPECT_EQ(PackExamples({a, b}, 0).size(), 2u);  // max_len < 1: one example per row

  const TokenizedExample plain = c;  // not from PackExamples: one sequence
  std::vector<const TokenizedExample*> ptrs = {&rows[0], &plain};
  Batch batch = MakeBatch(ptrs, /*pad_id=*/0);
  ASSERT_TRUE(batch.packed());
  EXPECT_EQ(batch.seq_len, 7);
  EXPECT_THAT(batch.positions,
              ElementsAreArray<int64_t>({0, 1, 2, 0, 1, 0, 1, 0, 1, 2, 3, 4, 5, 6}));
  EXPECT_THAT(batch.segment_ids,
              ElementsAreArray<int64_t>({0, 0, 0, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(batch.num_loss_tokens, 4 + 2);
  EXPECT_EQ(batch.padding_tokens, 3);
}

TEST(ShuffledOrderTest, DeterministicPermutation) {
  for (int64_t n : {1, 7, 8, 1023, 1025}) {
    std::vector<int64_t> o = ShuffledOrder(n, 42, 0);
    ASSERT_EQ(static_cast<int64_t>(o.size()), n);
    std::set<int64_t> s(o.begin(), o.end());
    EXPECT_EQ(static_cast<int64_t>(s.size()), n);
    EXPECT_EQ(*s.begin(), 0);
    EXPECT_EQ(*s.rbegin(), n - 1);
    EXPECT_EQ(o, ShuffledOrder(n, 42, 0));
  }
  EXPECT_NE(ShuffledOrder(1025, 42, 0), ShuffledOrder(1025, 42, 1));
  EXPECT_NE(ShuffledOrder(1025, 42, 0), ShuffledOrder(1025, 43, 0));
  std::vector<int64_t> identity(1025);
  for (int64_t i = 0; i < 1025; ++i) identity[i] = i;
  EXPECT_NE(ShuffledOrder(1025, 42, 0), identity);
  EXPECT_TRUE(ShuffledOrder(0, 1, 0).empty());
  EXPECT_TRUE(ShuffledOrder(-3, 1, 0).empty());
}

}  // namespace

TEST(BalancedOrderTest, AlternatesClassesAndOversamplesTheSmallOne) {
  // 7 examples of class 0, 2 of class 1 (indices 3 and 8).
  const std::vector<int32_t> cls = {0, 0, 0, 1, 0, 0, 0, 0, 1};
  const std::vector<int64_t> order = BalancedOrder(cls, /*seed=*/5, /*epoch=*/0);
  ASSERT_EQ(order.size(), 14u);  // K * largest = 2 * 7
  std::set<int64_t> zeros;
  int ones_3 = 0, ones_8 = 0;
  for (size_t k = 0; k < order.size(); ++k) {
    EXPECT_EQ(cls[order[k]], static_cast<int32_t>(k % 2)) << "position " << k;
    if (k % 2 == 0) zeros.insert(order[k]);
    ones_3 += order[k] == 3;
    ones_8 += order[k] == 8;
  }
  EXPECT_EQ(zeros.size(), 7u);  // every class-0 example exactly once
  EXPECT_EQ(ones_3 + ones_8, 7);
  EXPECT_GE(std::min(ones_3, ones_8), 3);  // cycled: 4 + 3
  EXPECT_EQ(order, BalancedOrder(cls, 5, 0));  // deterministic
  EXPECT_NE(order, BalancedOrder(cls, 5, 1));  // a new epoch reshuffles
  EXPECT_TRUE(BalancedOrder({}, 1, 0).empty());
}

}  // namespace lspo::data
