// Datasets and batching; see datasets.h.
#include "data/datasets.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/records.h"
#include "data/sft.h"
#include "nlohmann/json.hpp"
#include "runtime/file_io.h"
#include "runtime/json_text.h"
#include "runtime/status_macros.h"
#include "text/chat_template.h"

namespace lspo::data {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) { return ReadDataFile(path); }

std::string Latin1ToUtf8(absl::string_view s) {
  std::string out;
  out.reserve(s.size() + s.size() / 8);
  for (char ch : s) {
    uint8_t b = static_cast<uint8_t>(ch);
    if (b < 0x80) {
      out.push_back(ch);
    } else {
      out.push_back(static_cast<char>(0xC0 | (b >> 6)));
      out.push_back(static_cast<char>(0x80 | (b & 0x3F)));
    }
  }
  return out;
}

absl::StatusOr<LabeledText> JsonToLabeled(const JsonRecord& r) {
  const nlohmann::ordered_json& j = r.value;
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.where, ": expected a JSON object {\"label\": ..., \"text\": ...}"));
  }
  auto label = j.find("label");
  auto text = j.find("text");
  if (label == j.end() || !label->is_string() || text == j.end() || !text->is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.where, ": the object needs string fields \"label\" and \"text\"; saw ",
                     runtime::JsonForMessage(j, 120)));
  }
  LabeledText out{label->get<std::string>(), text->get<std::string>()};
  if (out.label.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(r.where, ": empty \"label\""));
  }
  return out;
}

// The classification conversation: [system: system_prompt (omitted if empty)] +
// [user: question + "\n\n" + text] (+ [assistant: answer] when not empty).
std::vector<model::ChatMessage> ClassificationMessages(absl::string_view text,
                                                       absl::string_view question,
                                                       absl::string_view system_prompt,
                                                       absl::string_view answer = "") {
  std::vector<model::ChatMessage> messages;
  if (!system_prompt.empty()) messages.push_back({"system", std::string(system_prompt)});
  messages.push_back(
      {"user", question.empty() ? std::string(text) : absl::StrCat(question, "\n\n", text)});
  if (!answer.empty()) messages.push_back({"assistant", std::string(answer)});
  return messages;
}

// The prompt text (ending in the template's generation prompt) for a possibly cut text.
absl::StatusOr<std::string> RenderPrompt(const model::ChatTemplate& tmpl, absl::string_view text,
                                         absl::string_view question,
                                         absl::string_view system_prompt) {
  ASSIGN_OR_RETURN(model::RenderedChat r,
                   tmpl.Render(ClassificationMessages(text, question, system_prompt),
                               /*add_generation_prompt=*/true));
  return std::move(r.text);
}

// Prompt ids with the text cut so that they number at most `budget`; `full` = the ids of the
// uncut prompt (returned as they are when they fit).
absl::StatusOr<std::vector<int32_t>> FitPrompt(const model::BpeTokenizer& tok,
                                               const model::ChatTemplate& tmpl,
                                               absl::string_view text, absl::string_view question,
                                               absl::string_view system_prompt, int64_t budget,
                                               int64_t answer_tokens, std::vector<int32_t> full) {
  if (static_cast<int64_t>(full.size()) <= budget) return full;
  ASSIGN_OR_RETURN(std::string empty, RenderPrompt(tmpl, "", question, system_prompt));
  const int64_t overhead = static_cast<int64_t>(tok.Encode(empty).size());
  if (overhead > budget) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_len ", budget + answer_tokens, " cannot hold the chat prompt (", overhead,
                     " tokens with an empty message) plus the answer (", answer_tokens,
                     " tokens); raise max_len or shorten the question/system prompt"));
  }
  // Cut at the byte end of the first k text tokens, verify, and shrink k until it fits. The
  // prompt-internal tokenisation can differ from Encode(text) at the message start, hence the
  // check.
  const std::vector<int32_t> text_ids = tok.Encode(text);
  std::vector<size_t> end_offset(text_ids.size() + 1, 0);  // decoded bytes of the first k
  for (size_t k = 0; k < text_ids.size(); ++k) {
    end_offset[k + 1] = end_offset[k] + tok.Decode({&text_ids[k], 1}).size();
  }
  int64_t k = std::clamp<int64_t>(budget - overhead, 0, static_cast<int64_t>(text_ids.size()));
  while (true) {
    size_t cut = std::min(end_offset[k], text.size());
    while (cut > 0 && cut < text.size() && (static_cast<uint8_t>(text[cut]) & 0xC0) == 0x80) {
      --cut;  // do not split a UTF-8 character
    }
    ASSIGN_OR_RETURN(std::string cut_prompt,
                     RenderPrompt(tmpl, text.substr(0, cut), question, system_prompt));
    std::vector<int32_t> ids = tok.Encode(cut_prompt);
    int64_t excess = static_cast<int64_t>(ids.size()) - budget;
    if (excess <= 0) return ids;
    if (k == 0) {  // cannot happen (overhead <= budget), kept as a guard
      return absl::InternalError("FitPrompt: empty text does not fit the budget");
    }
    k = std::max<int64_t>(0, k - excess);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
absl::StatusOr<std::vector<LabeledText>> LoadLabeledTsv(const std::string& path) {
  ASSIGN_OR_RETURN(std::string content, ReadFile(path));
  return ParseLabeledTsv(content, path);
}

absl::StatusOr<std::vector<LabeledText>> ParseLabeledTsv(absl::string_view content,
                                                         absl::string_view path) {
  std::vector<LabeledText> rows;
  RETURN_IF_ERROR(ForEachLine(content, [&](int64_t line_no, absl::string_view line) {
    if (line.empty()) return absl::OkStatus();
    std::string decoded = IsValidUtf8(line) ? std::string(line) : Latin1ToUtf8(line);
    size_t tab = decoded.find('\t');
    if (tab == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": no tab in '",
                                                     decoded.substr(0, 60),
                                                     "'; expected label<TAB>text"));
    }
    if (tab == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": empty label; expected label<TAB>text"));
    }
    rows.push_back({decoded.substr(0, tab), decoded.substr(tab + 1)});
    return absl::OkStatus();
  }));
  return rows;
}

absl::StatusOr<std::vector<LabeledText>> LoadLabeledJsonl(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<JsonRecord> records, ReadJsonRecords(path));
  return LabeledFromJsonRecords(records);
}

absl::StatusOr<std::vector<LabeledText>> LabeledFromJsonRecords(
    absl::Span<const JsonRecord> records) {
  std::vector<LabeledText> rows;
  rows.reserve(records.size());
  for (const JsonRecord& r : records) {
    ASSIGN_OR_RETURN(LabeledText row, JsonToLabeled(r));
    rows.push_back(std::move(row));
  }
  return rows;
}

absl::StatusOr<std::vector<LabeledText>> LoadLabeled(const std::string& path) {
  if (absl::EndsWith(path, ".tsv")) return LoadLabeledTsv(path);
  if (absl::EndsWith(path, ".jsonl") || absl::EndsWith(path, ".json")) {
    return LoadLabeledJsonl(path);  // ReadJsonRecords: JSON Lines or a top-level array
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", path, "' has an unsupported extension; use .tsv (label<TAB>text), .jsonl or .json"));
}

// ---------------------------------------------------------------------------------------------
// The uncut prompt ids and the answer ids of a classification example, by the rule of SFT
// conversations (data/sft.h TokenizeSftRecord: the template's tokens after the generation
// prompt up to and including the first special token, the prompt a prefix of the whole
// conversation as text and as ids); tokens after the end-of-turn token are dropped.
struct PromptAndAnswer {
  std::vector<int32_t> prompt;
  std::vector<int32_t> answer;
};

absl::StatusOr<PromptAndAnswer> SplitClassificationChat(
    const model::BpeTokenizer& tok, const model::ChatTemplate& tmpl, absl::string_view text,
    absl::string_view label, absl::string_view question, absl::string_view system_prompt) {
  SftRecord record;
  record.messages = ClassificationMessages(text, question, system_prompt, label);
  record.where = "classification example";
  absl::StatusOr<TokenizedExample> whole =
      TokenizeSftRecord(record, tok, &tmpl, std::numeric_limits<int>::max());
  if (!whole.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        whole.status().message(),
        system_prompt.empty()
            ? ""
            : " (with data.system_prompt set: some templates, Mistral v0.3's for one, drop the "
              "system "
              "turn unless the last turn is the user's; leave data.system_prompt empty)"));
  }
  if (whole->input_ids.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the chat template renders no tokens for the answer '", label, "'; check the template"));
  }
  PromptAndAnswer out;
  const auto& ids = whole->input_ids;
  size_t end = ids.size();
  while (end > 0 && whole->labels[end - 1] == kIgnoreIndex) --end;
  out.prompt.assign(ids.begin(), ids.begin() + whole->answer_start);
  out.answer.assign(ids.begin() + whole->answer_start, ids.begin() + static_cast<ptrdiff_t>(end));
  return out;
}

absl::StatusOr<TokenizedExample> BuildClassificationChat(
    const model::BpeTokenizer& tokenizer, const model::ChatTemplate& chat_template,
    absl::string_view text, absl::string_view label, absl::string_view question,
    absl::string_view system_prompt, int max_len, bool* truncated, int64_t* full_length) {
  if (label.empty()) {
    return absl::InvalidArgumentError("BuildClassificationChat: empty label; pass the class name");
  }
  if (max_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BuildClassificationChat: max_len = ", max_len, "; expected >= 1"));
  }
  ASSIGN_OR_RETURN(PromptAndAnswer split, SplitClassificationChat(tokenizer, chat_template, text,
                                                                  label, question, system_prompt));
  const std::vector<int32_t>& answer = split.answer;
  const size_t uncut_prompt = split.prompt.size();
  if (full_length != nullptr) *full_length = static_cast<int64_t>(uncut_prompt + answer.size());
  const int64_t budget = static_cast<int64_t>(max_len) - static_cast<int64_t>(answer.size());
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
                   FitPrompt(tokenizer, chat_template, text, question, system_prompt, budget,
                             static_cast<int64_t>(answer.size()), std::move(split.prompt)));
  if (truncated != nullptr) *truncated = prompt.size() < uncut_prompt;
  TokenizedExample ex;
  ex.answer_start = static_cast<int32_t>(prompt.size());
  ex.input_ids = std::move(prompt);
  ex.labels.assign(ex.input_ids.size(), kIgnoreIndex);
  ex.input_ids.insert(ex.input_ids.end(), answer.begin(), answer.end());
  ex.labels.insert(ex.labels.end(), answer.begin(), answer.end());
  return ex;
}

absl::StatusOr<TokenizedExample> BuildClassificationPrompt(const model::BpeTokenizer& tokenizer,
                                                           const model::ChatTemplate& chat_template,
                                                           absl::string_view text,
                                                           absl::string_view question,
                                                           absl::string_view system_prompt,
                                                           int max_len) {
  if (max_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BuildClassificationPrompt: max_len = ", max_len, "; expected >= 1"));
  }
  ASSIGN_OR_RETURN(std::string whole, RenderPrompt(chat_template, text, question, system_prompt));
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
                   FitPrompt(tokenizer, chat_template, text, question, system_prompt, max_len, 0,
                             tokenizer.Encode(whole)));
  TokenizedExample ex;
  ex.answer_start = static_cast<int32_t>(prompt.size());
  ex.labels.assign(prompt.size(), kIgnoreIndex);
  ex.input_ids = std::move(prompt);
  return ex;
}

// ---------------------------------------------------------------------------------------------
absl::StatusOr<std::vector<std::vector<int32_t>>> PackTextBlocks(
    const model::BpeTokenizer& tokenizer, absl::Span<const std::string> paths, int64_t block_len,
    int64_t max_blocks) {
  if (block_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackTextBlocks: block_len = ", block_len, "; expected >= 1"));
  }
  if (paths.empty()) {
    return absl::InvalidArgumentError("PackTextBlocks: no input files; pass at least one path");
  }
  if (paths.size() > 1 && tokenizer.eos_id() < 0) {
    return absl::InvalidArgumentError(
        "PackTextBlocks: the tokenizer has no eos token to separate documents; pass one file");
  }
  std::vector<int32_t> stream;
  for (size_t d = 0; d < paths.size(); ++d) {
    if (max_blocks > 0 && static_cast<int64_t>(stream.size()) >= max_blocks * block_len) break;
    ASSIGN_OR_RETURN(std::string doc, ReadFile(paths[d]));
    if (d > 0) stream.push_back(tokenizer.eos_id());
    std::vector<int32_t> ids = tokenizer.Encode(doc);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  int64_t n_blocks = static_cast<int64_t>(stream.size()) / block_len;
  if (max_blocks > 0) n_blocks = std::min(n_blocks, max_blocks);
  std::vector<std::vector<int32_t>> blocks(n_blocks);
  for (int64_t b = 0; b < n_blocks; ++b) {
    blocks[b].assign(stream.begin() + b * block_len, stream.begin() + (b + 1) * block_len);
  }
  return blocks;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> PackTextBlocks(
    const model::BpeTokenizer& tokenizer, const std::string& path, int64_t block_len,
    int64_t max_blocks) {
  return PackTextBlocks(tokenizer, absl::Span<const std::string>(&path, 1), block_len, max_blocks);
}

// ---------------------------------------------------------------------------------------------
Batch MakeBatch(absl::Span<const TokenizedExample* const> examples, int32_t pad_id) {
  Batch batch;
  batch.batch_size = static_cast<int64_t>(examples.size());
  for (const TokenizedExample* ex : examples) {
    if (ex != nullptr) {
      batch.seq_len = std::max<int64_t>(batch.seq_len, static_cast<int64_t>(ex->input_ids.size()));
    }
  }
  const int64_t T = batch.seq_len;
  batch.input_ids.assign(batch.batch_size * T, pad_id);
  batch.labels.assign(batch.batch_size * T, kIgnoreIndex);
  batch.last_index.assign(batch.batch_size, -1);
  for (int64_t b = 0; b < batch.batch_size; ++b) {
    const TokenizedExample* ex = examples[b];
    if (ex == nullptr) {
      batch.padding_tokens += T;  // an empty row is all padding
      continue;
    }
    const int64_t len = static_cast<int64_t>(ex->input_ids.size());
    for (int64_t t = 0; t < len; ++t) {
      batch.input_ids[b * T + t] = ex->input_ids[t];
      if (t < static_cast<int64_t>(ex->labels.size())) {
        batch.labels[b * T + t] = ex->labels[t];
        if (t >= 1 && ex->labels[t] != kIgnoreIndex) ++batch.num_loss_tokens;
      }
    }
    batch.last_index[b] = len - 1;
    batch.padding_tokens += T - len;
  }
  bool packed = false;
  for (const TokenizedExample* ex : examples) {
    packed = packed || (ex != nullptr && ex->segment_starts.size() > 1);
  }
  if (!packed) return batch;
  batch.positions.assign(batch.batch_size * T, 0);
  batch.segment_ids.assign(batch.batch_size * T, 0);
  for (int64_t b = 0; b < batch.batch_size; ++b) {
    const TokenizedExample* ex = examples[b];
    const std::vector<int32_t> whole = {0};
    const std::vector<int32_t>& starts =
        (ex != nullptr && !ex->segment_starts.empty()) ? ex->segment_starts : whole;
    const int64_t len = ex != nullptr ? static_cast<int64_t>(ex->input_ids.size()) : 0;
    int64_t segment = 0, start = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (t < len && segment + 1 < static_cast<int64_t>(starts.size()) &&
          t == starts[static_cast<size_t>(segment + 1)]) {
        start = t;
        ++segment;
      }
      batch.positions[b * T + t] = t - start;  // padding (t >= len) continues the last example
      batch.segment_ids[b * T + t] = t < len ? segment : segment + 1;
    }
  }
  return batch;
}

std::vector<TokenizedExample> PackExamples(absl::Span<const TokenizedExample> examples,
                                           int64_t max_len) {
  std::vector<TokenizedExample> rows;
  for (const TokenizedExample& ex : examples) {
    const int64_t len = static_cast<int64_t>(ex.input_ids.size());
    if (len == 0) continue;  // no tokens, no loss: nothing to pack
    const bool fits = !rows.empty() && max_len >= 1 &&
                      static_cast<int64_t>(rows.back().input_ids.size()) + len <= max_len;
    if (!fits) {
      TokenizedExample row = ex;
      row.labels.resize(ex.input_ids.size(), kIgnoreIndex);
      row.segment_starts = {0};
      rows.push_back(std::move(row));
      continue;
    }
    TokenizedExample& row = rows.back();
    const int32_t start = static_cast<int32_t>(row.input_ids.size());
    row.segment_starts.push_back(start);
    row.input_ids.insert(row.input_ids.end(), ex.input_ids.begin(), ex.input_ids.end());
    for (int64_t t = 0; t < len; ++t) {
      const int32_t label =
          t < static_cast<int64_t>(ex.labels.size()) ? ex.labels[t] : kIgnoreIndex;
      row.labels.push_back(t == 0 ? kIgnoreIndex : label);
    }
  }
  return rows;
}

std::vector<int64_t> ShuffledOrder(int64_t n, uint64_t seed, int64_t epoch) {
  if (n <= 0) return {};
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937_64 rng(seed ^ (0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(epoch) + 1)));
  for (int64_t i = n - 1; i >= 1; --i) {
    int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

std::vector<int64_t> BalancedOrder(absl::Span<const int32_t> class_of, uint64_t seed,
                                   int64_t epoch) {
  std::vector<std::vector<int64_t>> members;
  for (size_t i = 0; i < class_of.size(); ++i) {
    const int32_t c = class_of[i];
    if (c < 0) continue;
    if (static_cast<size_t>(c) >= members.size()) members.resize(c + 1);
    members[c].push_back(static_cast<int64_t>(i));
  }
  size_t largest = 0;
  std::vector<std::vector<int64_t>> orders;
  for (size_t c = 0; c < members.size(); ++c) {
    largest = std::max(largest, members[c].size());
    orders.push_back(ShuffledOrder(members[c].size(), seed + c, epoch));
  }
  std::vector<int64_t> out;
  for (size_t k = 0; k < largest; ++k) {
    for (size_t c = 0; c < members.size(); ++c) {
      if (members[c].empty()) continue;
      const auto& ord = orders[c];
      out.push_back(members[c][ord[k % ord.size()]]);
    }
  }
  return out;
}

}  // namespace lspo::data
