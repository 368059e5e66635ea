// Datasets and batching for fine-tuning: labelled text files, ChatML classification examples
// with an answer-only loss mask, packed language-modelling blocks, padded batches and a
// reproducible shuffle. Torch-free: everything is plain int32/int64 vectors that the trainer
// copies into tensors.
//
// Legend: B = batch size (rows), T = sequence length (tokens, after padding), L = block length.
// Label convention (Hugging Face causal LM): labels are aligned with input_ids, not shifted;
// the loss at position t compares logits[t - 1] with labels[t], and kIgnoreIndex (-100) marks
// positions without loss.
//
// Thread-safety: all functions are pure (no shared state) and may run concurrently.
#ifndef LSPO_DATA_DATASETS_H_
#define LSPO_DATA_DATASETS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "data/records.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lspo::data {

// Label value of positions that carry no loss (PyTorch CrossEntropyLoss ignore_index).
inline constexpr int32_t kIgnoreIndex = -100;

// Default question put before each message for the SMS spam task.
inline constexpr absl::string_view kSpamQuestion = "Is this message spam or ham?";

// One labelled example, UTF-8.
struct LabeledText {
  std::string label;
  std::string text;
};

// Reads "label<TAB>text" lines (split at the first tab; further tabs stay in the text; a
// trailing "\r" is removed; empty lines are skipped). A line that is not valid UTF-8 is read
// as Latin-1 and converted to UTF-8 (the SMS Spam Collection stores "£" as byte 0xA3).
// Errors: kNotFound (missing file, path named); kInvalidArgument naming "path:line" for a line
// without a tab or with an empty label.
absl::StatusOr<std::vector<LabeledText>> LoadLabeledTsv(const std::string& path);

// LoadLabeledTsv on `content`, the text of a file named `path` in messages (nothing is read
// from disk); the same rows and errors, but for a missing file.
absl::StatusOr<std::vector<LabeledText>> ParseLabeledTsv(absl::string_view content,
                                                         absl::string_view path);

// Reads JSON Lines: one object {"label": string, "text": string} per non-empty line (other
// keys ignored). Errors: kNotFound (missing file); kInvalidArgument naming "path:line" for a
// line that is not a JSON object or lacks a string "label"/"text" (or has an empty label).
absl::StatusOr<std::vector<LabeledText>> LoadLabeledJsonl(const std::string& path);

// LoadLabeledJsonl on records already read (data/records.h ReadJsonRecords or
// ParseJsonRecords): the same rows and the same kInvalidArgument errors, naming each record's
// `where`.
absl::StatusOr<std::vector<LabeledText>> LabeledFromJsonRecords(
    absl::Span<const JsonRecord> records);

// Dispatches on the extension: ".tsv" -> LoadLabeledTsv, ".jsonl" -> LoadLabeledJsonl,
// ".json" -> a top-level JSON array of {"label","text"} objects, or JSON Lines if the file is
// not one JSON value. Errors: as the loaders; kInvalidArgument for any other extension.
absl::StatusOr<std::vector<LabeledText>> LoadLabeled(const std::string& path);

// One tokenised sequence. input_ids and labels have the same length T0 (no padding).
struct TokenizedExample {
  std::vector<int32_t> input_ids;  // (T0,) token ids
  std::vector<int32_t> labels;     // (T0,) = input_ids on loss positions, kIgnoreIndex elsewhere
  int32_t answer_start = 0;        // index of the first answer token (= prompt length)
  // A packed row (PackExamples): the index of each example's first token, ascending, the
  // first 0. Empty for an example that is not a packed row (one sequence).
  std::vector<int32_t> segment_starts;
};

// Packing (TRL's SFTConfig.packing, in order rather than best-fit): concatenates the
// examples, in the given order, into rows of at most max_len tokens; a row is closed when
// the next example would not fit. An example longer than max_len is a row of its own, not
// cut (the loaders have already applied the seq_len policy). Each row records where its
// examples start (segment_starts), and the label at each start after the first is
// kIgnoreIndex, so that no loss position predicts across a boundary (the label at position
// 0 of an example is never a target anyway: the loss at t compares logits[t - 1] with
// labels[t]). answer_start is that of the row's first example. MakeBatch then gives every
// token its position within its example and a segment id, which the model uses to restart
// RoPE and to block attention across examples. max_len < 1 puts each example in its own
// row; an example without tokens is left out. Never fails; the input order is kept (rows are in
// order, examples in order inside).
std::vector<TokenizedExample> PackExamples(absl::Span<const TokenizedExample> examples,
                                           int64_t max_len);

// Builds a supervised classification chat with the model's chat template
// (text/chat_template.h; the job's ChatTemplate::ForTokenizer(tokenizer, data.chat_template)):
//   messages  = [system: system_prompt (omitted if empty, so that a template's default system
//                turn, e.g. SmolLM2's, is used)] + [user: question + "\n\n" + text]
//   prompt    = Encode(Render(messages, add_generation_prompt=true))
//   answer    = the ids of Render(messages + [assistant: label]) after the prompt's, up to and
//               including the first special token (the template's end-of-turn token:
//               <|im_end|> for ChatML, <|eot_id|> for Llama 3, </s> for Mistral)
//   input_ids = prompt ++ answer
//   labels    = kIgnoreIndex on the prompt, = input_ids on the answer.
// For SmolLM2's ChatML this is prompt ++ Encode(label) ++ [<|im_end|>]. Each text is tokenised
// as one string (as apply_chat_template does). If input_ids would exceed max_len tokens, the
// text is cut to its longest token prefix that fits (cut at a UTF-8 character boundary); the
// question, template and answer are never cut.
// Errors: kInvalidArgument if label is empty, max_len < 1, max_len cannot hold the prompt with
// an empty text plus the answer (the message gives both sizes), the template's prompt is not a
// prefix of the conversation with the answer (as text or as ids; the message says why), or
// the template fails to render (its own message, e.g. roles that must alternate).
// *truncated / *full_length (optional) report whether the text was cut and the example's
// tokens before the cut.
absl::StatusOr<TokenizedExample> BuildClassificationChat(
    const model::BpeTokenizer& tokenizer, const model::ChatTemplate& chat_template,
    absl::string_view text, absl::string_view label, absl::string_view question,
    absl::string_view system_prompt, int max_len, bool* truncated = nullptr,
    int64_t* full_length = nullptr);

// The evaluation variant: input_ids = the prompt of BuildClassificationChat (ending in the
// template's generation prompt), labels all kIgnoreIndex, answer_start = input_ids.size(); the
// text is cut so that the prompt has at most max_len tokens. For a prompt consistent with a
// training example of length max_len, pass max_len minus the answer length.
// Errors: kInvalidArgument if max_len < 1, cannot hold the prompt with an empty text, or the
// template fails to render.
absl::StatusOr<TokenizedExample> BuildClassificationPrompt(const model::BpeTokenizer& tokenizer,
                                                           const model::ChatTemplate& chat_template,
                                                           absl::string_view text,
                                                           absl::string_view question,
                                                           absl::string_view system_prompt,
                                                           int max_len);

// Language-modelling blocks: each file is one document (raw bytes, tokenised whole);
// documents are concatenated with eos_id() between consecutive documents, and the stream is
// cut into consecutive blocks of exactly block_len tokens; the remainder is dropped. At most
// max_blocks blocks are returned (max_blocks <= 0: no limit); documents after the last needed
// one are not read. Result: (num_blocks, L) int32 ids.
// Errors: kInvalidArgument if block_len < 1, paths is empty, or several documents are given
// and the tokenizer has no eos; kNotFound for a missing file.
absl::StatusOr<std::vector<std::vector<int32_t>>> PackTextBlocks(
    const model::BpeTokenizer& tokenizer, absl::Span<const std::string> paths, int64_t block_len,
    int64_t max_blocks);
// Single-document convenience overload.
absl::StatusOr<std::vector<std::vector<int32_t>>> PackTextBlocks(
    const model::BpeTokenizer& tokenizer, const std::string& path, int64_t block_len,
    int64_t max_blocks);

// A right-padded batch, row-major.
struct Batch {
  int64_t batch_size = 0;           // B
  int64_t seq_len = 0;              // T = longest example
  std::vector<int64_t> input_ids;   // (B, T) ids; pad_id after each row's tokens
  std::vector<int64_t> labels;      // (B, T) labels; kIgnoreIndex at padding
  std::vector<int64_t> last_index;  // (B,) index of each row's last real token (-1: empty row)
  int64_t num_loss_tokens = 0;      // #positions t >= 1 with labels[t] != kIgnoreIndex, i.e.
                                    // the next-token predictions that enter the loss
  int64_t padding_tokens = 0;       // #pad positions (B x T minus the rows' lengths)
  // Only when some row is packed (segment_starts of size > 1), else both empty:
  std::vector<int64_t> positions;    // (B, T) each token's position within its example (RoPE);
                                     // padding continues the last example's positions
  std::vector<int64_t> segment_ids;  // (B, T) 0, 1, ... per example of the row; the padding
                                     // is a segment of its own (one past the last example's)
  bool packed() const { return !positions.empty(); }
};

// Pads `examples` (B pointers, none null; a null pointer is treated as an empty example) on
// the right to the longest length with pad_id; labels missing or past an example's end are
// kIgnoreIndex. Rows that are not packed are one segment (positions 0..len-1, padding id 1)
// when positions are filled. Never fails.
Batch MakeBatch(absl::Span<const TokenizedExample* const> examples, int32_t pad_id);

// A deterministic permutation of 0..n-1 for (seed, epoch), identical on every platform:
//   rng = std::mt19937_64(seed ^ (0x9E3779B97F4A7C15 * (epoch + 1)))   (uint64 arithmetic)
//   order = [0, 1, ..., n-1]; for i = n-1 down to 1: swap(order[i], order[rng() % (i + 1)])
// (Fisher-Yates; the modulo bias is below 2^-40 for n < 2^24). n <= 0 gives an empty vector.
std::vector<int64_t> ShuffledOrder(int64_t n, uint64_t seed, int64_t epoch);

// A class-balanced epoch order over examples whose class ids are `class_of` (values >= 0).
// Each class's indices are shuffled with ShuffledOrder(size, seed + class id, epoch); the
// order then takes one example of every class in turn (class 0, 1, ..., K-1, 0, ...), cycling
// through the smaller classes again (oversampling) until the largest class is used up, so
// every batch sees the classes equally often. Length = K * (largest class size). Empty
// input gives an empty vector. Use for classification data with a skewed label prior (e.g.
// SMS spam: 9% spam in train), where plain shuffling lets a model settle on the prior.
std::vector<int64_t> BalancedOrder(absl::Span<const int32_t> class_of, uint64_t seed,
                                   int64_t epoch);

}  // namespace lspo::data

#endif  // LSPO_DATA_DATASETS_H_
