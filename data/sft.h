// Supervised fine-tuning data in the ecosystem's formats (TRL's dataset types): instruction
// (Alpaca), chat (messages) and prompt-completion records, read with errors that name
// "file:line", and tokenized with the model's chat template and TRL's loss masking: the loss
// is on what the model should learn to say (every assistant turn, the completion) and nowhere
// else. Torch-free.
//
// Formats (one per file; detected from the keys of the first record when not given):
//   alpaca             {"instruction": str, "input": str (optional), "output": str}
//                      -> [user: instruction (+ "\n\n" + input when not empty),
//                          assistant: output]
//   chat               {"messages": [{"role": "system"|"user"|"assistant", "content": str}, ...]}
//                      multi-turn; at least one assistant turn. Or ShareGPT's
//                      {"conversations": [{"from": str, "value": str}, ...]} (FastChat's
//                      layout, Axolotl's type: sharegpt), roles mapped as Axolotl's default
//                      role map: human / user -> user, gpt / assistant / model -> assistant,
//                      system -> system (items with "role" / "content" are read as such).
//   prompt_completion  {"prompt": str, "completion": str}: plain text, no chat template (as TRL
//                      treats standard prompt-completion data): prompt ids (with the BOS when
//                      the tokenizer adds one) ++ ids of completion + the EOS token, loss on the
//                      completion and the EOS; or {"prompt": [messages], "completion":
//                      [messages]} (conversational): the chat template on prompt + completion,
//                      loss on the completion's assistant turns.
// Files: .jsonl (one object per line; blank lines skipped) or .json (a top-level array of
// objects, or JSON Lines when the file is not one JSON value).
//
// Loss mask of a conversation (TRL's assistant-only loss, restated without {% generation %}
// markers so that it works with every template): for each assistant turn k, the prompt
// P_k = Render(messages[:k], add_generation_prompt=true) must be a prefix of the whole
// conversation's rendering, as text and as token ids; the loss covers the tokens from the end
// of P_k up to and including the first special token after it (the template's end-of-turn
// token: <|im_end|>, <|eot_id|>, </s>), or to the end of the conversation if none follows.
// A template for which the prefix property fails (it renders earlier turns differently once
// later ones exist) is refused with the turn named, never masked approximately.
//
// Length (seq_len): an example longer than max_len keeps its first max_len tokens (the prompt
// and the start of the answer); one whose first loss token lies at or past max_len would keep
// no loss token and is skipped. Both are counted in DataSummary.
#ifndef LSPO_DATA_SFT_H_
#define LSPO_DATA_SFT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "data/datasets.h"
#include "data/records.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lspo::data {

enum class SftFormat { kAlpaca, kChat, kPromptCompletion };

// "alpaca", "chat", "prompt_completion".
absl::string_view SftFormatName(SftFormat f);

// One record. Conversational records carry `messages` (prompt and completion turns in order)
// and the index of the first completion turn (`completion_from`: 0 for chat, where every
// assistant turn carries loss); standard prompt-completion records carry `prompt` and
// `completion` text.
struct SftRecord {
  bool conversational = true;
  std::vector<model::ChatMessage> messages;
  size_t completion_from = 0;  // assistant turns at index >= this carry loss
  std::string prompt;
  std::string completion;
  std::string where;                    // "file:line" (or "file: record N" in a JSON array)
  SftFormat format = SftFormat::kChat;  // the file's: how errors name a turn (SftTurnName)
  bool sharegpt = false;                // chat read from ShareGPT's "conversations" (SftTurnName)
};

// How errors name messages[k] of `record` in the file's own keys: "messages"[k] (chat),
// "conversations"[k] (chat in ShareGPT's keys),
// "prompt"[k] / "completion"[k - completion_from] (conversational prompt_completion), the
// instruction (with its input) / "output" (alpaca).
std::string SftTurnName(const SftRecord& record, size_t k);

// The format of `path` from the keys of its first record: "messages" -> chat, "instruction"
// -> alpaca, "prompt" + "completion" -> prompt_completion. Errors: kNotFound (missing file);
// kInvalidArgument naming the file and line for a record that is not a JSON object, or keys of
// none of the formats (the keys found and the ones expected are listed; {"label", "text"}
// records are classification data).
absl::StatusOr<SftFormat> DetectSftFormat(const std::string& path);

// DetectSftFormat on the records of a file already read (data/records.h ReadJsonRecords or
// ParseJsonRecords); `path` names the file in messages. The same format and errors, but for a
// missing file.
absl::StatusOr<SftFormat> DetectSftFormatOfRecords(absl::Span<const JsonRecord> records,
                                                   absl::string_view path);

// Reads every record of `path` in `format`. Errors (kInvalidArgument, naming "file:line", the
// key and the fix): invalid UTF-8 (the byte offset), invalid JSON, a record of another format
// (one format per file), a missing or non-string key, an empty or white-space-only
// "instruction" / "output" / "completion", "messages" not a non-empty array, a message that
// is not {"role", "content"} strings, an unknown role (supported: system, user, assistant),
// an assistant turn with empty content, a conversation without an assistant turn; kNotFound
// for a missing file. A bad record is never skipped or read as an empty example.
absl::StatusOr<std::vector<SftRecord>> LoadSftRecords(const std::string& path, SftFormat format);

// LoadSftRecords on records already read (ReadJsonRecords or ParseJsonRecords): the same
// records and kInvalidArgument errors (naming each record's `where`).
absl::StatusOr<std::vector<SftRecord>> SftRecordsFromJson(absl::Span<const JsonRecord> records,
                                                          SftFormat format);

// What tokenizing a data file did (printed and logged at job start).
struct DataSummary {
  int64_t records = 0;      // read from the file
  int64_t examples = 0;     // kept (records - skipped, capped by max_examples)
  int64_t tokens = 0;       // input tokens of the kept examples, after truncation
  int64_t loss_tokens = 0;  // of which carry loss
  int64_t truncated = 0;    // examples cut to max_len
  int64_t skipped = 0;      // examples with no loss token within max_len
  int64_t longest = 0;      // tokens of the longest example before truncation
  // The first kept example as text, the loss part between "[[" and "]]" (decoded tokens).
  std::string rendered_example;
};

// Tokenizes one record (the rules in the file comment). Returns the example, or an empty
// example (input_ids empty) when it is skipped for having no loss token within max_len;
// *truncated / *full_length (optional) report the cut and the length before it.
// Errors: kInvalidArgument (naming record.where) when max_len < 2, the template fails to
// render (its own message, e.g. roles that must alternate), or the prefix property fails (the
// turn and whether as text or as ids is named); a conversation whose completion turns are not
// assistant turns.
absl::StatusOr<TokenizedExample> TokenizeSftRecord(const SftRecord& record,
                                                   const model::BpeTokenizer& tokenizer,
                                                   const model::ChatTemplate* chat_template,
                                                   int max_len, bool* truncated = nullptr,
                                                   int64_t* full_length = nullptr);

// Loads and tokenizes `path` (format detected when `format` is null), keeping at most
// `max_examples` examples (<= 0: all), and fills `*summary` (optional). `chat_template` may be
// null for standard prompt-completion data (then conversational records are refused).
// Errors: those of DetectSftFormat, LoadSftRecords and TokenizeSftRecord; kInvalidArgument
// when no example is left (every record skipped: max_len too small, named).
absl::StatusOr<std::vector<TokenizedExample>> LoadSftExamples(
    const std::string& path, const SftFormat* format, const model::BpeTokenizer& tokenizer,
    const model::ChatTemplate* chat_template, int max_len, int max_examples,
    DataSummary* summary = nullptr);

// Counts one kept example into `*summary` (tokens, loss tokens, the truncation, the longest
// length before it) and renders it as the summary's example when it is the first.
// full_length = its tokens before truncation.
void CountExample(const model::BpeTokenizer& tokenizer, const TokenizedExample& example,
                  bool truncated, int64_t full_length, DataSummary* summary);

// `example` decoded, its loss tokens (labels != kIgnoreIndex) between "[[" and "]]": each run
// of tokens on one side of the mask decoded as a whole, then made well-formed UTF-8 (a
// character cut by the mask boundary or by truncation becomes U+FFFD, runtime/utf8.h).
std::string RenderLossMask(const model::BpeTokenizer& tokenizer, const TokenizedExample& example);

// The summary as lines for a log: "data FILE (FORMAT): N examples (R records, S skipped, C
// truncated to L tokens), T tokens, K loss tokens (P%), longest M" and the rendered example.
// `format` is the data format's name (SftFormatName, "classification", "text").
std::string FormatDataSummary(const std::string& path, absl::string_view format, int max_len,
                              const DataSummary& summary);

}  // namespace lspo::data

#endif  // LSPO_DATA_SFT_H_
