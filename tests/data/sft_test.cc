// Tests of data/sft.h: the ids and loss masks of alpaca, chat (single- and multi-turn) and
// prompt-completion (text and conversational) records equal transformers' apply_chat_template
// with return_assistant_tokens_mask (on the real template marked with {% generation %}) and
// TRL's prompt-completion rule (tests/oracle/make_sft_oracle.py ->
// tests/oracle/data/sft_oracle.json), for SmolLM2's, Llama 3.1's and Qwen2.5's templates and
// tokenizers; format detection; truncation and skipping; and every bad input named by
// file:line.
#include "data/sft.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "nlohmann/json.hpp"
#include "runtime/utf8.h"
#include "tests/test_files.h"

namespace lspo::data {
namespace {

using ::lspo::tests::TempFile;

using ::testing::HasSubstr;

constexpr char kOracle[] = "tests/oracle/data/sft_oracle.json";
constexpr char kTokenizers[] = "tests/oracle/data/hf_tokenizers/";
constexpr char kTemplates[] = "tests/oracle/data/chat_templates/";
constexpr char kCooking[] = "datasets/cooking-stackexchange/";

SftFormat ParseFormat(const std::string& s) {
  return s == "alpaca" ? SftFormat::kAlpaca : s == "chat" ? SftFormat::kChat
                                                          : SftFormat::kPromptCompletion;
}

struct Family {
  model::BpeTokenizer tok;
  model::ChatTemplate tmpl;
};

Family Load(const std::string& tokenizer, const std::string& tmpl_file) {
  auto tok = model::BpeTokenizer::FromHfFolder(kTokenizers + tokenizer);
  EXPECT_TRUE(tok.ok()) << tok.status();
  auto tmpl = model::ChatTemplate::ForTokenizer(*tok, kTemplates + tmpl_file);
  EXPECT_TRUE(tmpl.ok()) << tmpl.status();
  return Family{*std::move(tok), *std::move(tmpl)};
}

// RenderLossMask on text whose characters byte-level BPE splits over several tokens (issue 43):
// each side of the mask is decoded as a run, so whole characters come out whole; a mask
// boundary inside a character, and a truncation inside one, give U+FFFD (as tokenizers'
// decode does); the result is always well-formed UTF-8 (it goes into protobuf strings).
TEST(SftTest, TheRenderedLossMaskIsWellFormedUtf8ForTextInAnyScript) {
  auto tok = model::BpeTokenizer::FromHfFolder(std::string(kTokenizers) + "smollm2");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::string text = "鶏肉は中心温度が七十五度になるまで加熱 Как сварить рис?";
  TokenizedExample ex;
  ex.input_ids = tok->Encode(text);
  ASSERT_GT(ex.input_ids.size(), 10u);
  ASSERT_EQ(tok->Decode(ex.input_ids), text);
  // Whole text, no loss: the text itself.
  ex.labels.assign(ex.input_ids.size(), kIgnoreIndex);
  EXPECT_EQ(RenderLossMask(*tok, ex), text);
  // A boundary k that falls inside a character (the prefix is not well-formed on its own),
  // and one that does not.
  int inside = -1, outside = -1;
  for (size_t k = 1; k < ex.input_ids.size(); ++k) {
    const std::string prefix = tok->Decode(absl::MakeConstSpan(ex.input_ids.data(), k));
    (runtime::IsValidUtf8(prefix) ? outside : inside) = static_cast<int>(k);
    if (inside > 0 && outside > 0) break;
  }
  ASSERT_GT(inside, 0) << "no token boundary inside a character: pick other text";
  ASSERT_GT(outside, 0);
  for (int k : {inside, outside}) {
    TokenizedExample m = ex;
    for (size_t i = k; i < m.labels.size(); ++i) m.labels[i] = m.input_ids[i];
    const auto ids = absl::MakeConstSpan(m.input_ids);
    const std::string want = runtime::Utf8Lossy(tok->Decode(ids.subspan(0, k))) + "[[" +
                             runtime::Utf8Lossy(tok->Decode(ids.subspan(k))) + "]]";
    const std::string got = RenderLossMask(*tok, m);
    EXPECT_EQ(got, want) << k;
    EXPECT_TRUE(runtime::IsValidUtf8(got)) << k;
    EXPECT_EQ(got.find("\xEF\xBF\xBD") != std::string::npos, k == inside) << k;
    // Cut inside a character at the end (truncation): U+FFFD there, the rest intact.
    TokenizedExample cut = m;
    cut.input_ids.resize(inside);
    cut.labels.resize(inside);
    const std::string c = RenderLossMask(*tok, cut);
    EXPECT_TRUE(runtime::IsValidUtf8(c)) << c;
  }
}

TEST(SftTest, IdsAndLossMasksEqualTransformersAndTrl) {
  std::ifstream in(kOracle);
  ASSERT_TRUE(in.good()) << kOracle;
  const nlohmann::json oracle = nlohmann::json::parse(in);
  int cases = 0, records = 0, multi_turn_masks = 0;
  for (const auto& c : oracle["cases"]) {
    const std::string file = c["file"].get<std::string>();
    SCOPED_TRACE(c["tokenizer"].get<std::string>() + " / " + c["template"].get<std::string>() +
                 " / " + file);
    Family f = Load(c["tokenizer"].get<std::string>(), c["template"].get<std::string>());
    const SftFormat format = ParseFormat(c["format"].get<std::string>());
    auto detected = DetectSftFormat(file);
    ASSERT_TRUE(detected.ok()) << detected.status();
    EXPECT_EQ(*detected, format);
    auto recs = LoadSftRecords(file, format);
    ASSERT_TRUE(recs.ok()) << recs.status();
    ++cases;
    for (size_t i = 0; i < c["records"].size(); ++i) {
      const auto& want = c["records"][i];
      auto ex = TokenizeSftRecord((*recs)[i], f.tok, &f.tmpl, 4096);
      ASSERT_TRUE(ex.ok()) << ex.status();
      EXPECT_EQ(ex->input_ids, want["input_ids"].get<std::vector<int32_t>>()) << (*recs)[i].where;
      std::vector<int> mask;
      for (int32_t l : ex->labels) mask.push_back(l != kIgnoreIndex);
      const auto want_mask = want["mask"].get<std::vector<int>>();
      EXPECT_EQ(mask, want_mask) << (*recs)[i].where;
      int spans = 0;
      for (size_t t = 0; t < want_mask.size(); ++t) spans += want_mask[t] && (t == 0 || !want_mask[t - 1]);
      multi_turn_masks += spans > 1;
      for (size_t t = 0; t < ex->labels.size(); ++t) {
        if (ex->labels[t] != kIgnoreIndex) EXPECT_EQ(ex->labels[t], ex->input_ids[t]);
      }
      ++records;
    }
  }
  EXPECT_EQ(cases, 15);
  EXPECT_EQ(records, 240);
  EXPECT_EQ(multi_turn_masks, 3 * 16);  // the multi-turn file: two assistant turns each
}

// ShareGPT records ({"conversations": [{"from", "value"}]}) are chat records: each chat file of
// the oracle rewritten in ShareGPT's keys and speakers (user -> human, assistant -> gpt) gives
// the oracle's ids and loss masks, record for record.
TEST(SftTest, ShareGptRecordsAreChatRecordsWithTheSameIdsAndMasks) {
  std::ifstream in(kOracle);
  ASSERT_TRUE(in.good()) << kOracle;
  const nlohmann::json oracle = nlohmann::json::parse(in);
  int checked = 0;
  for (const auto& c : oracle["cases"]) {
    if (c["format"] != "chat") continue;
    const std::string file = c["file"].get<std::string>();
    SCOPED_TRACE(c["tokenizer"].get<std::string>() + " / " + file);
    std::ifstream chat(file);
    std::string line, rewritten;
    int k = 0;
    while (std::getline(chat, line)) {
      if (line.empty()) continue;
      const nlohmann::json rec = nlohmann::json::parse(line);
      nlohmann::json turns = nlohmann::json::array();
      for (const auto& m : rec["messages"]) {
        const std::string role = m["role"].get<std::string>();
        // Both of Axolotl's spellings of each speaker, alternating over the records.
        const std::string from = role == "user"        ? (k % 2 ? "human" : "user")
                                 : role == "assistant" ? (k % 2 ? "gpt" : "model")
                                                       : role;
        turns.push_back({{"from", from}, {"value", m["content"]}});
      }
      rewritten += nlohmann::json{{"conversations", turns}}.dump() + "\n";
      ++k;
    }
    const std::string path = TempFile("sft_sharegpt_" + std::to_string(checked) + ".jsonl", rewritten);
    auto detected = DetectSftFormat(path);
    ASSERT_TRUE(detected.ok()) << detected.status();
    EXPECT_EQ(*detected, SftFormat::kChat);
    auto recs = LoadSftRecords(path, SftFormat::kChat);
    ASSERT_TRUE(recs.ok()) << recs.status();
    ASSERT_GE(recs->size(), c["records"].size());
    Family f = Load(c["tokenizer"].get<std::string>(), c["template"].get<std::string>());
    for (size_t i = 0; i < c["records"].size(); ++i) {
      auto ex = TokenizeSftRecord((*recs)[i], f.tok, &f.tmpl, 4096);
      ASSERT_TRUE(ex.ok()) << ex.status();
      EXPECT_EQ(ex->input_ids, c["records"][i]["input_ids"].get<std::vector<int32_t>>());
      std::vector<int> mask;
      for (int32_t l : ex->labels) mask.push_back(l != kIgnoreIndex);
      EXPECT_EQ(mask, c["records"][i]["mask"].get<std::vector<int>>());
    }
    EXPECT_EQ(SftTurnName((*recs)[0], 1), "\"conversations\"[1]");
    ++checked;
  }
  EXPECT_GE(checked, 6);  // the single- and multi-turn chat files, for every family
}

TEST(SftTest, DetectsTheFormatFromTheKeys) {
  auto alpaca = DetectSftFormat(std::string(kCooking) + "train.alpaca.jsonl");
  ASSERT_TRUE(alpaca.ok());
  EXPECT_EQ(*alpaca, SftFormat::kAlpaca);
  const std::string array = TempFile("sft_array.json",
                                     R"([{"prompt": "a", "completion": "b"}, {"prompt": "c", "completion": "d"}])");
  auto pc = DetectSftFormat(array);
  ASSERT_TRUE(pc.ok()) << pc.status();
  EXPECT_EQ(*pc, SftFormat::kPromptCompletion);
  auto recs = LoadSftRecords(array, SftFormat::kPromptCompletion);
  ASSERT_TRUE(recs.ok());
  ASSERT_EQ(recs->size(), 2u);
  EXPECT_THAT((*recs)[1].where, HasSubstr("record 2"));
  auto cls = DetectSftFormat(TempFile("sft_cls.jsonl", "{\"label\": \"a\", \"text\": \"b\"}\n"));
  EXPECT_EQ(cls.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cls.status().message()), HasSubstr("classification"));
}

// Every bad record is an error naming file:line and the key; nothing is skipped silently.
TEST(SftTest, BadRecordsAreNamedWithFileLineAndKey) {
  struct Case {
    const char* name;
    SftFormat format;
    std::string content;
    const char* expect;
  };
  auto good = [](SftFormat f) -> std::string {
    switch (f) {
      case SftFormat::kAlpaca:
        return R"({"instruction": "i", "output": "o"})";
      case SftFormat::kChat:
        return R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})";
      case SftFormat::kPromptCompletion:
        return R"({"prompt": "p", "completion": "c"})";
    }
    return "";
  };
  const std::vector<Case> cases = {
      {"missing_output", SftFormat::kAlpaca, R"({"instruction": "i", "input": "x"})", "missing key \"output\""},
      {"wrong_type", SftFormat::kAlpaca, R"({"instruction": 3, "output": "o"})", "\"instruction\" is a number"},
      {"empty_output", SftFormat::kAlpaca, R"({"instruction": "i", "output": ""})", "\"output\" is empty"},
      {"blank_output", SftFormat::kAlpaca, R"({"instruction": "i", "output": " \n "})",
       "\"output\" is white space only"},
      {"unknown_role", SftFormat::kChat,
       R"({"messages": [{"role": "tool", "content": "q"}, {"role": "assistant", "content": "a"}]})",
       "role \"tool\""},
      {"empty_assistant", SftFormat::kChat,
       R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "  "}]})",
       "empty content"},
      {"no_assistant", SftFormat::kChat, R"({"messages": [{"role": "user", "content": "q"}]})",
       "no assistant turn"},
      {"content_parts", SftFormat::kChat,
       R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "q"}]}]})",
       "content parts"},
      {"messages_not_list", SftFormat::kChat, R"({"messages": "hi"})", "non-empty array"},
      {"mixed_formats", SftFormat::kChat, R"({"instruction": "i", "output": "o"})",
       "a record of format alpaca in a file of format chat"},
      {"mixed_pc", SftFormat::kPromptCompletion,
       R"({"prompt": "p", "completion": [{"role": "assistant", "content": "a"}]})",
       "both must be strings"},
      {"pc_user_completion", SftFormat::kPromptCompletion,
       R"({"prompt": [{"role": "user", "content": "p"}], "completion": [{"role": "user", "content": "a"}]})",
       "assistant turns only"},
      {"not_json", SftFormat::kChat, "{\"messages\": [", "not valid JSON"},
      {"bad_utf8", SftFormat::kChat, "{\"messages\": \"\xff\xfe\"}", "invalid UTF-8 at byte 15"},
      {"no_format", SftFormat::kChat, R"({"question": "q", "answer": "a"})", "match no format"},
      {"sharegpt_speaker", SftFormat::kChat,
       R"({"conversations": [{"from": "bot", "value": "q"}, {"from": "gpt", "value": "a"}]})",
       "\"conversations\"[0] is from \"bot\"; ShareGPT speakers: human or user"},
      {"sharegpt_value", SftFormat::kChat,
       R"({"conversations": [{"from": "human", "text": "q"}, {"from": "gpt", "value": "a"}]})",
       "\"conversations\"[0] needs a string \"value\""},
      {"sharegpt_not_list", SftFormat::kChat, R"({"conversations": {"from": "human"}})",
       "\"conversations\" must be a non-empty array of {\"from\", \"value\"} objects"},
      {"sharegpt_no_reply", SftFormat::kChat,
       R"({"conversations": [{"from": "human", "value": "q"}]})", "no assistant turn"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = TempFile(std::string("sft_bad_") + c.name + ".jsonl",
                                      good(c.format) + "\n\n" + c.content + "\n");
    // The bad record is on line 3 (line 2 is blank); line 1 is a good record of the format.
    auto recs = LoadSftRecords(path, c.format);
    ASSERT_FALSE(recs.ok());
    EXPECT_EQ(recs.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string msg(recs.status().message());
    EXPECT_THAT(msg, HasSubstr(path + ":3")) << msg;
    EXPECT_THAT(msg, HasSubstr(c.expect)) << msg;
  }
  EXPECT_EQ(LoadSftRecords("/no/such/file.jsonl", SftFormat::kChat).status().code(),
            absl::StatusCode::kNotFound);
}

// Truncation keeps the start (prompt + the start of the answer); an example whose answer
// starts past seq_len is skipped and counted; the summary counts tokens and loss tokens.
TEST(SftTest, TruncatesKeepingTheStartAndSkipsWhatHasNoAnswerLeft) {
  Family f = Load("smollm2", "smollm2.jinja");
  const std::string path = std::string(kCooking) + "sample.chat.jsonl";
  const SftFormat chat = SftFormat::kChat;
  DataSummary full;
  auto all = LoadSftExamples(path, &chat, f.tok, &f.tmpl, 4096, 0, &full);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(full.records, 64);
  EXPECT_EQ(full.examples, 64);
  EXPECT_EQ(full.truncated + full.skipped, 0);
  int64_t shortest_answer_start = 1 << 30, longest = 0;
  for (const auto& ex : *all) {
    shortest_answer_start = std::min<int64_t>(shortest_answer_start, ex.answer_start);
    longest = std::max<int64_t>(longest, static_cast<int64_t>(ex.input_ids.size()));
  }
  EXPECT_EQ(full.longest, longest);
  // seq_len between the shortest and the longest answer start: some are skipped, the others
  // are cut to seq_len with at least one loss token.
  const int seq_len = static_cast<int>(shortest_answer_start) + 2;
  DataSummary cut;
  auto some = LoadSftExamples(path, &chat, f.tok, &f.tmpl, seq_len, 0, &cut);
  ASSERT_TRUE(some.ok()) << some.status();
  EXPECT_GT(cut.skipped, 0);
  EXPECT_GT(cut.truncated, 0);
  EXPECT_EQ(cut.examples + cut.skipped, 64);
  for (const auto& ex : *some) {
    EXPECT_LE(ex.input_ids.size(), static_cast<size_t>(seq_len));
    EXPECT_LT(ex.answer_start, seq_len);
  }
  int64_t loss = 0, tokens = 0;
  for (const auto& ex : *some) {
    tokens += static_cast<int64_t>(ex.input_ids.size());
    for (int32_t l : ex.labels) loss += l != kIgnoreIndex;
  }
  EXPECT_EQ(cut.tokens, tokens);
  EXPECT_EQ(cut.loss_tokens, loss);
  EXPECT_THAT(cut.rendered_example, HasSubstr("[["));
  EXPECT_THAT(FormatDataSummary(path, SftFormatName(chat), seq_len, cut), HasSubstr("skipped"));
  // Nothing left: a clear error.
  auto none = LoadSftExamples(path, &chat, f.tok, &f.tmpl, 8, 0, nullptr);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("raise seq_len"));
}

// A template whose earlier turns change once later ones exist (Mistral v0.3 puts the system
// text on the last user turn) has no defined mask: refused with the turn named.
TEST(SftTest, RefusesTemplatesWithoutThePrefixProperty) {
  Family f = Load("spm_metaspace", "mistral-v0.3.jinja");
  SftRecord r;
  r.where = "x.jsonl:7";
  r.messages = {{"system", "Be brief."}, {"user", "q1"}, {"assistant", "a1"}, {"user", "q2"},
                {"assistant", "a2"}};
  auto ex = TokenizeSftRecord(r, f.tok, &f.tmpl, 512);
  EXPECT_EQ(ex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ex.status().message()), HasSubstr("x.jsonl:7"));
  EXPECT_THAT(std::string(ex.status().message()), HasSubstr("\"messages\"[2]"));
  // Without the system turn it is fine, with both answers (and their </s>) in the loss.
  r.messages.erase(r.messages.begin());
  ex = TokenizeSftRecord(r, f.tok, &f.tmpl, 512);
  ASSERT_TRUE(ex.ok()) << ex.status();
  std::vector<int32_t> answer;
  for (int32_t l : ex->labels) {
    if (l != kIgnoreIndex) answer.push_back(l);
  }
  EXPECT_EQ(f.tok.Decode(answer), "a1</s> a2</s>");
  // A template that raises (roles must alternate) names the record.
  r.messages = {{"user", "q1"}, {"user", "q2"}, {"assistant", "a"}};
  ex = TokenizeSftRecord(r, f.tok, &f.tmpl, 512);
  EXPECT_EQ(ex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ex.status().message()), HasSubstr("alternate"));
}

}  // namespace
}  // namespace lspo::data
