// Supervised fine-tuning data; see sft.h.
#include "data/sft.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "data/records.h"
#include "runtime/record_keys.h"
#include "runtime/status_macros.h"
#include "runtime/utf8.h"

namespace lspo::data {
namespace {

using Json = nlohmann::ordered_json;

absl::Status Bad(const std::string& where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

std::string Keys(const Json& j) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.push_back(absl::StrCat("\"", k, "\""));
  return keys.empty() ? "none" : absl::StrJoin(keys, ", ");
}

// The format whose keys `j` has, if any (runtime/record_keys.h, shared with the scheduler).
std::optional<SftFormat> FormatOfKeys(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  const absl::string_view name =
      runtime::SftFormatOfKeys([&](const char* key) { return j.contains(key); });
  if (name == "chat") return SftFormat::kChat;
  if (name == "alpaca") return SftFormat::kAlpaca;
  if (name == "prompt_completion") return SftFormat::kPromptCompletion;
  return std::nullopt;
}

absl::Status NotAnyFormat(const JsonRecord& r) {
  if (!r.value.is_object()) {
    return Bad(r.where, "expected a JSON object (one record per line)");
  }
  if (r.value.contains("label") && r.value.contains("text")) {
    return Bad(r.where,
               "a {\"label\", \"text\"} record is classification data; set "
               "data.format: classification");
  }
  return Bad(r.where, absl::StrCat("keys ", Keys(r.value),
                                   " match no format; expected \"messages\" "
                                   "(chat), \"conversations\" (ShareGPT chat), \"instruction\" + "
                                   "\"output\" (alpaca) or \"prompt\" + "
                                   "\"completion\" (prompt_completion)"));
}

absl::StatusOr<std::string> StringField(const JsonRecord& r, absl::string_view key, bool required,
                                        bool non_empty) {
  auto it = r.value.find(std::string(key));
  if (it == r.value.end() || it->is_null()) {
    if (required) {
      return Bad(r.where, absl::StrCat("missing key \"", key, "\" (a string)"));
    }
    return std::string();
  }
  if (!it->is_string()) {
    return Bad(r.where,
               absl::StrCat("\"", key, "\" is a ", it->type_name(), "; expected a string"));
  }
  std::string s = it->get<std::string>();
  if (non_empty && s.find_first_not_of(" \t\r\n") == std::string::npos) {
    return Bad(r.where, absl::StrCat("\"", key, "\" is ", s.empty() ? "empty" : "white space only",
                                     "; every record needs a non-empty \"", key,
                                     "\" (remove the record or fill it in)"));
  }
  return s;
}

// ShareGPT's speaker names ("from") for the chat roles: Axolotl's default role map of its
// chat_template / sharegpt loaders (user: human, user; assistant: gpt, assistant, model;
// system: system), which covers FastChat's human / gpt. Null for another name.
const char* ShareGptRole(absl::string_view from) {
  if (from == "human" || from == "user") return "user";
  if (from == "gpt" || from == "assistant" || from == "model") return "assistant";
  if (from == "system") return "system";
  return nullptr;
}

// A list of {"role", "content"} messages at r.value[key]; for key "conversations" (ShareGPT)
// items are {"from", "value"} with the speakers of ShareGptRole (an item with "role" is read
// as a message).
absl::StatusOr<std::vector<model::ChatMessage>> Messages(const JsonRecord& r,
                                                         absl::string_view key) {
  const Json& list = r.value.at(std::string(key));
  const bool sharegpt = key == "conversations";
  const char* shape = sharegpt ? "{\"from\", \"value\"}" : "{\"role\", \"content\"}";
  if (!list.is_array() || list.empty()) {
    return Bad(r.where,
               absl::StrCat("\"", key, "\" must be a non-empty array of ", shape, " objects"));
  }
  std::vector<model::ChatMessage> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const Json& m = list[i];
    const std::string at = absl::StrCat("\"", key, "\"[", i, "]");
    if (!m.is_object()) return Bad(r.where, absl::StrCat(at, " is not an object"));
    const bool from_value = sharegpt && !m.contains("role");
    const char* role_key = from_value ? "from" : "role";
    const char* content_key = from_value ? "value" : "content";
    auto role = m.find(role_key);
    auto content = m.find(content_key);
    if (role == m.end() || !role->is_string()) {
      return Bad(r.where, absl::StrCat(at, " needs a string \"", role_key, "\""));
    }
    if (content == m.end() || !content->is_string()) {
      return Bad(r.where, absl::StrCat(at, " needs a string \"", content_key, "\"",
                                       content != m.end() && content->is_array()
                                           ? " (content parts lists are not supported; join "
                                             "the text parts)"
                                           : ""));
    }
    std::string rs = role->get<std::string>();
    if (from_value) {
      const char* mapped = ShareGptRole(rs);
      if (mapped == nullptr) {
        return Bad(r.where,
                   absl::StrCat(at, " is from \"", rs,
                                "\"; ShareGPT speakers: human or user, gpt, assistant or model, "
                                "system"));
      }
      rs = mapped;
    } else if (rs != "system" && rs != "user" && rs != "assistant") {
      return Bad(r.where, absl::StrCat(at, " has role \"", rs,
                                       "\"; supported roles: system, user, assistant"));
    }
    std::string cs = content->get<std::string>();
    if (rs == "assistant" && cs.find_first_not_of(" \t\r\n") == std::string::npos) {
      return Bad(r.where, absl::StrCat(at,
                                       " is an assistant turn with empty content; remove "
                                       "the turn or the record"));
    }
    out.push_back({rs, std::move(cs)});
  }
  return out;
}

absl::StatusOr<SftRecord> ParseRecord(const JsonRecord& r, SftFormat format) {
  std::optional<SftFormat> f = FormatOfKeys(r.value);
  if (!f.has_value()) return NotAnyFormat(r);
  if (*f != format) {
    return Bad(r.where,
               absl::StrCat("a record of format ", SftFormatName(*f), " in a file of format ",
                            SftFormatName(format), " (its first record); one format per file"));
  }
  SftRecord rec;
  rec.where = r.where;
  rec.format = format;
  switch (format) {
    case SftFormat::kAlpaca: {
      ASSIGN_OR_RETURN(std::string instruction, StringField(r, "instruction", true, true));
      ASSIGN_OR_RETURN(std::string input, StringField(r, "input", false, false));
      ASSIGN_OR_RETURN(std::string output, StringField(r, "output", true, true));
      rec.messages.push_back(
          {"user", input.empty() ? instruction : absl::StrCat(instruction, "\n\n", input)});
      rec.messages.push_back({"assistant", std::move(output)});
      break;
    }
    case SftFormat::kChat: {
      rec.sharegpt = !r.value.contains("messages");  // chat by its "conversations"
      ASSIGN_OR_RETURN(rec.messages, Messages(r, rec.sharegpt ? "conversations" : "messages"));
      if (std::none_of(rec.messages.begin(), rec.messages.end(),
                       [](const model::ChatMessage& m) { return m.role == "assistant"; })) {
        return Bad(r.where,
                   "the conversation has no assistant turn, so nothing to learn; "
                   "add the reply or remove the record");
      }
      break;
    }
    case SftFormat::kPromptCompletion: {
      const Json& p = r.value.at("prompt");
      const Json& c = r.value.at("completion");
      if (p.is_string() && c.is_string()) {
        rec.conversational = false;
        rec.prompt = p.get<std::string>();
        ASSIGN_OR_RETURN(rec.completion, StringField(r, "completion", true, true));
      } else if (p.is_array() && c.is_array()) {
        ASSIGN_OR_RETURN(rec.messages, Messages(r, "prompt"));
        ASSIGN_OR_RETURN(std::vector<model::ChatMessage> completion, Messages(r, "completion"));
        for (const auto& m : completion) {
          if (m.role != "assistant") {
            return Bad(r.where, absl::StrCat("\"completion\" has a \"", m.role,
                                             "\" turn; a completion holds assistant turns only"));
          }
        }
        rec.completion_from = rec.messages.size();
        rec.messages.insert(rec.messages.end(), completion.begin(), completion.end());
      } else {
        return Bad(r.where, absl::StrCat("\"prompt\" is a ", p.type_name(),
                                         " and \"completion\" a ", c.type_name(),
                                         "; both must be strings or both lists "
                                         "of messages"));
      }
      break;
    }
  }
  return rec;
}

// True when `prefix` is a prefix of `all`.
bool IsPrefix(const std::vector<int32_t>& prefix, const std::vector<int32_t>& all) {
  return prefix.size() <= all.size() && std::equal(prefix.begin(), prefix.end(), all.begin());
}

// The end of the loss span that starts at `from`: just past the first special token, or the
// end.
size_t AnswerEnd(const model::BpeTokenizer& tok, const std::vector<int32_t>& ids, size_t from) {
  for (size_t i = from; i < ids.size(); ++i) {
    if (tok.IsSpecial(ids[i])) return i + 1;
  }
  return ids.size();
}

}  // namespace

std::string SftTurnName(const SftRecord& record, size_t k) {
  switch (record.format) {
    case SftFormat::kAlpaca:
      return k == 0 ? "the \"instruction\" (and \"input\")" : "\"output\"";
    case SftFormat::kPromptCompletion:
      return k < record.completion_from
                 ? absl::StrCat("\"prompt\"[", k, "]")
                 : absl::StrCat("\"completion\"[", k - record.completion_from, "]");
    case SftFormat::kChat:
      break;
  }
  return absl::StrCat(record.sharegpt ? "\"conversations\"[" : "\"messages\"[", k, "]");
}

absl::string_view SftFormatName(SftFormat f) {
  switch (f) {
    case SftFormat::kAlpaca:
      return "alpaca";
    case SftFormat::kChat:
      return "chat";
    case SftFormat::kPromptCompletion:
      return "prompt_completion";
  }
  return "?";
}

absl::StatusOr<SftFormat> DetectSftFormat(const std::string& path) {
  ASSIGN_OR_RETURN(std::vector<JsonRecord> records, ReadJsonRecords(path));
  return DetectSftFormatOfRecords(records, path);
}

absl::StatusOr<SftFormat> DetectSftFormatOfRecords(absl::Span<const JsonRecord> records,
                                                   absl::string_view path) {
  if (records.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no records (the file is empty)"));
  }
  std::optional<SftFormat> f = FormatOfKeys(records[0].value);
  if (!f.has_value()) return NotAnyFormat(records[0]);
  return *f;
}

absl::StatusOr<std::vector<SftRecord>> LoadSftRecords(const std::string& path, SftFormat format) {
  ASSIGN_OR_RETURN(std::vector<JsonRecord> records, ReadJsonRecords(path));
  return SftRecordsFromJson(records, format);
}

absl::StatusOr<std::vector<SftRecord>> SftRecordsFromJson(absl::Span<const JsonRecord> records,
                                                          SftFormat format) {
  std::vector<SftRecord> out;
  out.reserve(records.size());
  for (const JsonRecord& r : records) {
    ASSIGN_OR_RETURN(SftRecord rec, ParseRecord(r, format));
    out.push_back(std::move(rec));
  }
  return out;
}

absl::StatusOr<TokenizedExample> TokenizeSftRecord(const SftRecord& record,
                                                   const model::BpeTokenizer& tok,
                                                   const model::ChatTemplate* tmpl, int max_len,
                                                   bool* truncated, int64_t* full_length) {
  if (max_len < 2) {
    return Bad(record.where, absl::StrCat("seq_len ", max_len, " is too small; expected >= 2"));
  }
  std::vector<int32_t> ids;
  std::vector<bool> loss;
  if (!record.conversational) {
    // TRL's standard prompt-completion: tokenizer(prompt) (with the BOS its post-processor
    // adds) and tokenizer(prompt + completion + eos); the loss from the end of the prompt.
    std::vector<int32_t> prompt_ids;
    if (tok.adds_bos() && tok.bos_id() >= 0) prompt_ids.push_back(tok.bos_id());
    const std::vector<int32_t> p = tok.Encode(record.prompt);
    prompt_ids.insert(prompt_ids.end(), p.begin(), p.end());
    std::string whole = record.prompt + record.completion;
    const bool add_eos =
        tok.eos_id() >= 0 && !absl::EndsWith(record.completion, tok.IdToToken(tok.eos_id()));
    if (tok.adds_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
    const std::vector<int32_t> w = tok.Encode(whole);
    ids.insert(ids.end(), w.begin(), w.end());
    if (add_eos) ids.push_back(tok.eos_id());
    if (!IsPrefix(prompt_ids, ids)) {
      return Bad(record.where,
                 "the prompt's tokens are not a prefix of prompt + completion's (the "
                 "completion's first characters merge with the prompt's last when tokenized); "
                 "end the prompt with a space or newline, or start the completion with one");
    }
    loss.assign(ids.size(), false);
    std::fill(loss.begin() + static_cast<ptrdiff_t>(prompt_ids.size()), loss.end(), true);
  } else {
    if (tmpl == nullptr) {
      return Bad(record.where,
                 "a conversation needs a chat template (the model has none; set "
                 "data.chat_template)");
    }
    auto rendered = tmpl->Render(record.messages, /*add_generation_prompt=*/false);
    if (!rendered.ok()) return Bad(record.where, rendered.status().message());
    ids = tok.Encode(rendered->text);
    loss.assign(ids.size(), false);
    for (size_t k = record.completion_from; k < record.messages.size(); ++k) {
      if (record.messages[k].role != "assistant") continue;
      auto prompt = tmpl->Render(absl::MakeConstSpan(record.messages).subspan(0, k),
                                 /*add_generation_prompt=*/true);
      if (!prompt.ok()) return Bad(record.where, prompt.status().message());
      if (!absl::StartsWith(rendered->text, prompt->text)) {
        return Bad(
            record.where,
            absl::StrCat(
                "the chat template renders the conversation before ", SftTurnName(record, k),
                " (with the generation prompt) differently from the start of the whole "
                "conversation, so the loss mask of that assistant turn is not defined; use a "
                "template whose earlier turns do not change (set data.chat_template)"));
      }
      const std::vector<int32_t> prompt_ids = tok.Encode(prompt->text);
      if (!IsPrefix(prompt_ids, ids) || prompt_ids.size() == ids.size()) {
        return Bad(
            record.where,
            absl::StrCat(
                "the tokens of the conversation before ", SftTurnName(record, k),
                " are not a prefix of the whole conversation's (its first characters merge with "
                "the generation prompt when tokenized, or the template drops them, e.g. by "
                "trimming an answer of white space and punctuation)"));
      }
      const size_t end = AnswerEnd(tok, ids, prompt_ids.size());
      std::fill(loss.begin() + static_cast<ptrdiff_t>(prompt_ids.size()),
                loss.begin() + static_cast<ptrdiff_t>(end), true);
    }
  }
  if (full_length != nullptr) *full_length = static_cast<int64_t>(ids.size());
  const size_t first_loss =
      static_cast<size_t>(std::find(loss.begin(), loss.end(), true) - loss.begin());
  if (truncated != nullptr) *truncated = false;
  TokenizedExample ex;
  if (first_loss >= static_cast<size_t>(max_len) || first_loss == ids.size()) {
    return ex;  // skipped: no loss token within max_len
  }
  if (ids.size() > static_cast<size_t>(max_len)) {
    ids.resize(static_cast<size_t>(max_len));
    loss.resize(static_cast<size_t>(max_len));
    if (truncated != nullptr) *truncated = true;
  }
  ex.answer_start = static_cast<int32_t>(first_loss);
  ex.labels.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) ex.labels[i] = loss[i] ? ids[i] : kIgnoreIndex;
  ex.input_ids = std::move(ids);
  return ex;
}

absl::StatusOr<std::vector<TokenizedExample>> LoadSftExamples(
    const std::string& path, const SftFormat* format, const model::BpeTokenizer& tok,
    const model::ChatTemplate* tmpl, int max_len, int max_examples, DataSummary* summary) {
  SftFormat f;
  if (format != nullptr) {
    f = *format;
  } else {
    ASSIGN_OR_RETURN(f, DetectSftFormat(path));
  }
  ASSIGN_OR_RETURN(std::vector<SftRecord> records, LoadSftRecords(path, f));
  DataSummary s;
  s.records = static_cast<int64_t>(records.size());
  std::vector<TokenizedExample> out;
  for (const SftRecord& r : records) {
    if (max_examples > 0 && static_cast<int>(out.size()) >= max_examples) break;
    bool cut = false;
    int64_t full = 0;
    ASSIGN_OR_RETURN(TokenizedExample ex, TokenizeSftRecord(r, tok, tmpl, max_len, &cut, &full));
    if (ex.input_ids.empty()) {
      s.longest = std::max(s.longest, full);
      ++s.skipped;
      continue;
    }
    CountExample(tok, ex, cut, full, &s);
    out.push_back(std::move(ex));
  }
  s.examples = static_cast<int64_t>(out.size());
  if (summary != nullptr) *summary = s;
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no example left: ", s.skipped, " of ", s.records,
                     " records have no answer "
                     "token within seq_len ",
                     max_len, " (the longest has ", s.longest, " tokens); raise seq_len"));
  }
  return out;
}

void CountExample(const model::BpeTokenizer& tok, const TokenizedExample& ex, bool truncated,
                  int64_t full_length, DataSummary* s) {
  s->longest = std::max(s->longest, full_length);
  s->truncated += truncated;
  s->tokens += static_cast<int64_t>(ex.input_ids.size());
  for (int32_t l : ex.labels) s->loss_tokens += l != kIgnoreIndex;
  if (s->rendered_example.empty()) s->rendered_example = RenderLossMask(tok, ex);
}

std::string RenderLossMask(const model::BpeTokenizer& tok, const TokenizedExample& ex) {
  // Each run of tokens on one side of the mask is decoded as a whole (a character that byte-
  // level BPE split over several tokens comes out whole), then repaired: a character cut by
  // the mask boundary or by the truncation at seq_len becomes U+FFFD, as tokenizers' decode
  // shows it, so the text is well-formed UTF-8 (it goes into protobuf strings and JSON).
  std::string text;
  bool in_loss = false;
  size_t start = 0;
  auto flush = [&](size_t end) {
    if (end > start) {
      text += runtime::Utf8Lossy(
          tok.Decode(absl::MakeConstSpan(ex.input_ids.data() + start, end - start)));
    }
    start = end;
  };
  for (size_t i = 0; i < ex.input_ids.size(); ++i) {
    const bool l = i < ex.labels.size() && ex.labels[i] != kIgnoreIndex;
    if (l != in_loss) {
      flush(i);
      text += l ? "[[" : "]]";
    }
    in_loss = l;
  }
  flush(ex.input_ids.size());
  if (in_loss) text += "]]";
  return text;
}

std::string FormatDataSummary(const std::string& path, absl::string_view format, int max_len,
                              const DataSummary& s) {
  const double pct =
      s.tokens > 0 ? 100.0 * static_cast<double>(s.loss_tokens) / static_cast<double>(s.tokens)
                   : 0.0;
  return absl::StrCat("data ", path, " (", format, "): ", s.examples, " examples (", s.records,
                      " records, ", s.skipped, " skipped with no answer token within seq_len, ",
                      s.truncated, " truncated to ", max_len, " tokens), ", s.tokens, " tokens, ",
                      s.loss_tokens, " loss tokens (", absl::StrFormat("%.1f", pct), "%), longest ",
                      s.longest, " tokens\nexample (loss on [[...]]):\n", s.rendered_example);
}

}  // namespace lspo::data
