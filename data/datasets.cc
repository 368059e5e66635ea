// Datasets and batching; see datasets.h.
#include "data/datasets.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/records.h"
#include "model/chat_template.h"
#include "nlohmann/json.hpp"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"

namespace lspo::data {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  return runtime::ReadFileToString(path, "data file");
}

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

absl::StatusOr<LabeledText> JsonToLabeled(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a JSON object {\"label\": ..., \"text\": ...}"));
  }
  auto label = j.find("label");
  auto text = j.find("text");
  if (label == j.end() || !label->is_string() || text == j.end() || !text->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the object needs string fields \"label\" and \"text\"; saw ", j.dump(-1, ' ',
        false, nlohmann::json::error_handler_t::replace).substr(0, 120)));
  }
  LabeledText out{label->get<std::string>(), text->get<std::string>()};
  if (out.label.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": empty \"label\""));
  }
  return out;
}

absl::StatusOr<std::vector<LabeledText>> ParseJsonl(absl::string_view content,
                                                    const std::string& path) {
  std::vector<LabeledText> rows;
  RETURN_IF_ERROR(ForEachLine(content, [&](int64_t line_no, absl::string_view line) {
    if (line.find_first_not_of(" \t") == absl::string_view::npos) return absl::OkStatus();
    std::string where = absl::StrCat(path, ":", line_no);
    nlohmann::json j = nlohmann::json::parse(line.begin(), line.end(), nullptr,
                                             /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": not valid JSON (UTF-8); each line must be one object "
                 "{\"label\": ..., \"text\": ...}"));
    }
    ASSIGN_OR_RETURN(LabeledText row, JsonToLabeled(j, where));
    rows.push_back(std::move(row));
    return absl::OkStatus();
  }));
  return rows;
}

// The classification conversation: [system: system_prompt (omitted if empty)] +
// [user: question + "\n\n" + text] (+ [assistant: answer] when not empty).
std::vector<model::ChatMessage> ClassificationMessages(absl::string_view text,
                                                       absl::string_view question,
                                                       absl::string_view system_prompt,
                                                       absl::string_view answer = "") {
  std::vector<model::ChatMessage> messages;
  if (!system_prompt.empty()) messages.push_back({"system", std::string(system_prompt)});
  messages.push_back({"user", question.empty() ? std::string(text)
                                               : absl::StrCat(question, "\n\n", text)});
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

// Prompt ids with the text cut so that they number at most `budget`.
absl::StatusOr<std::vector<int32_t>> FitPrompt(const model::BpeTokenizer& tok,
                                               const model::ChatTemplate& tmpl,
                                               absl::string_view text,
                                               absl::string_view question,
                                               absl::string_view system_prompt,
                                               int64_t budget, int64_t answer_tokens) {
  ASSIGN_OR_RETURN(std::string whole, RenderPrompt(tmpl, text, question, system_prompt));
  std::vector<int32_t> full = tok.Encode(whole);
  if (static_cast<int64_t>(full.size()) <= budget) return full;
  ASSIGN_OR_RETURN(std::string empty, RenderPrompt(tmpl, "", question, system_prompt));
  const int64_t overhead = static_cast<int64_t>(tok.Encode(empty).size());
  if (overhead > budget) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_len ", budget + answer_tokens, " cannot hold the chat prompt (", overhead,
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
  std::vector<LabeledText> rows;
  RETURN_IF_ERROR(ForEachLine(content, [&](int64_t line_no, absl::string_view line) {
    if (line.empty()) return absl::OkStatus();
    std::string decoded = IsValidUtf8(line) ? std::string(line) : Latin1ToUtf8(line);
    size_t tab = decoded.find('\t');
    if (tab == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", line_no, ": no tab in '", decoded.substr(0, 60),
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
  ASSIGN_OR_RETURN(std::string content, ReadFile(path));
  return ParseJsonl(content, path);
}

absl::StatusOr<std::vector<LabeledText>> LoadLabeled(const std::string& path) {
  if (absl::EndsWith(path, ".tsv")) return LoadLabeledTsv(path);
  if (absl::EndsWith(path, ".jsonl")) return LoadLabeledJsonl(path);
  if (absl::EndsWith(path, ".json")) {
    ASSIGN_OR_RETURN(std::string content, ReadFile(path));
    nlohmann::json j = nlohmann::json::parse(content, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_array()) return ParseJsonl(content, path);
    std::vector<LabeledText> rows;
    rows.reserve(j.size());
    for (size_t i = 0; i < j.size(); ++i) {
      ASSIGN_OR_RETURN(LabeledText row,
                       JsonToLabeled(j[i], absl::StrCat(path, ": element ", i)));
      rows.push_back(std::move(row));
    }
    return rows;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", path, "' has an unsupported extension; use .tsv (label<TAB>text), .jsonl or .json"));
}

// ---------------------------------------------------------------------------------------------
// The answer ids of a classification example: the tokens the template writes after the
// prompt for an assistant turn `label`, up to and including the first special token (the
// end-of-turn token: <|im_end|>, <|eot_id|>, </s>); the prompt must be a prefix of the whole
// conversation, as text and as ids.
absl::StatusOr<std::vector<int32_t>> AnswerIds(const model::BpeTokenizer& tok,
                                               const model::ChatTemplate& tmpl,
                                               absl::string_view text, absl::string_view label,
                                               absl::string_view question,
                                               absl::string_view system_prompt) {
  ASSIGN_OR_RETURN(std::string prompt, RenderPrompt(tmpl, text, question, system_prompt));
  ASSIGN_OR_RETURN(model::RenderedChat whole,
                   tmpl.Render(ClassificationMessages(text, question, system_prompt, label),
                               /*add_generation_prompt=*/false));
  if (!absl::StartsWith(whole.text, prompt)) {
    return absl::InvalidArgumentError(
        "the chat template renders the prompt (with the generation prompt) differently from "
        "the start of the conversation with the answer (Mistral v0.3's template, for one, drops "
        "the system turn unless the last turn is the user's); leave data.system_prompt empty or "
        "set data.chat_template to a template whose prompt is a prefix of the conversation");
  }
  const std::vector<int32_t> prompt_ids = tok.Encode(prompt);
  const std::vector<int32_t> all = tok.Encode(whole.text);
  if (all.size() <= prompt_ids.size() ||
      !std::equal(prompt_ids.begin(), prompt_ids.end(), all.begin())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt's tokens are not a prefix of the conversation's (the answer '", label,
        "' merges with the end of the prompt when tokenized); end the question with a space "
        "or newline, or set data.chat_template"));
  }
  std::vector<int32_t> answer(all.begin() + static_cast<ptrdiff_t>(prompt_ids.size()), all.end());
  for (size_t i = 0; i < answer.size(); ++i) {
    if (tok.IsSpecial(answer[i])) {
      answer.resize(i + 1);
      break;
    }
  }
  return answer;
}

absl::StatusOr<TokenizedExample> BuildClassificationChat(const model::BpeTokenizer& tokenizer,
                                                         const model::ChatTemplate& chat_template,
                                                         absl::string_view text,
                                                         absl::string_view label,
                                                         absl::string_view question,
                                                         absl::string_view system_prompt,
                                                         int max_len) {
  if (label.empty()) {
    return absl::InvalidArgumentError("BuildClassificationChat: empty label; pass the class name");
  }
  if (max_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BuildClassificationChat: max_len = ", max_len, "; expected >= 1"));
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> answer,
                   AnswerIds(tokenizer, chat_template, text, label, question, system_prompt));
  const int64_t budget = static_cast<int64_t>(max_len) - static_cast<int64_t>(answer.size());
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
                   FitPrompt(tokenizer, chat_template, text, question, system_prompt, budget,
                             static_cast<int64_t>(answer.size())));
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
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt,
                   FitPrompt(tokenizer, chat_template, text, question, system_prompt, max_len, 0));
  TokenizedExample ex;
  ex.answer_start = static_cast<int32_t>(prompt.size());
  ex.labels.assign(prompt.size(), kIgnoreIndex);
  ex.input_ids = std::move(prompt);
  return ex;
}

// ---------------------------------------------------------------------------------------------
absl::StatusOr<std::vector<std::vector<int32_t>>> PackTextBlocks(
    const model::BpeTokenizer& tokenizer, absl::Span<const std::string> paths,
    int64_t block_len, int64_t max_blocks) {
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
  return PackTextBlocks(tokenizer, absl::Span<const std::string>(&path, 1), block_len,
                        max_blocks);
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
    if (ex == nullptr) continue;
    const int64_t len = static_cast<int64_t>(ex->input_ids.size());
    for (int64_t t = 0; t < len; ++t) {
      batch.input_ids[b * T + t] = ex->input_ids[t];
      if (t < static_cast<int64_t>(ex->labels.size())) {
        batch.labels[b * T + t] = ex->labels[t];
        if (t >= 1 && ex->labels[t] != kIgnoreIndex) ++batch.num_loss_tokens;
      }
    }
    batch.last_index[b] = len - 1;
  }
  return batch;
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
