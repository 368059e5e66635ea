// `lspctl generate` and `lspctl eval`: use a model (an HF folder such as a job's output
// directory, or a GGUF file) without a training job.
//
//   generate: KV-cached decoding (model/generate.h) from a plain prompt or from conversations,
//             streaming the text as it is generated, stopping at the model's EOS ids.
//   eval:     loss, perplexity and (classification) accuracy of a data file through the same
//             evaluation code as a job (the worker's EvaluateJob on a job that trains nothing).
//
// Thread-safety: functions of a command-line process; not for concurrent use.
#ifndef LSPO_CLIENT_MODEL_TOOLS_H_
#define LSPO_CLIENT_MODEL_TOOLS_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/metrics.pb.h"

namespace lspo::client {

struct GenerateCommand {
  std::string model;   // HF folder or GGUF file
  std::string prompt;  // plain text (tokenized as is; the tokenizer's BOS prepended when its
                       // post-processor adds one, as transformers' tokenizer(prompt) does)
  // JSONL file of conversations: each line {"messages": [{"role", "content"}, ...]} (one reply
  // per line), or each line one {"role", "content"} message (the whole file is one
  // conversation). Rendered with the model's chat template and the generation prompt.
  std::string chat_file;
  int64_t max_new_tokens = 256;
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  int32_t num_threads = 0;  // 0 = all cores
};

// Runs `cmd`: streams each reply to `out` as it is generated and a summary line per reply
// ("[N tokens, X tokens/s, prefill Y s, stopped at eos | max_new_tokens]") to `err`.
// Errors: kInvalidArgument when neither or both of prompt and chat_file are given, a
// conversation line is malformed (file:line named), num_threads < 0, the model path is a file
// that is not a .gguf, the tokenizer has more ids than the model's vocab_size, or a prompt
// plus max_new_tokens exceeds max_position_embeddings; kNotFound for a missing model path or
// a folder without config.json; the model's and tokenizer's load errors; kUnimplemented for
// a chat template that is not recognised; Generate's errors.
absl::Status RunGenerate(const GenerateCommand& cmd, std::FILE* out, std::FILE* err);

struct EvalCommand {
  std::string model;    // HF folder or GGUF file
  std::string data;     // evaluation file
  std::string format;   // "classification" or "text" (empty = classification for .tsv /
                        // .jsonl, text otherwise)
  int32_t seq_len = 0;  // 0 = the job default (128)
  int32_t max_examples = 0;  // 0 = all
  std::string perplexity_path;  // optional text file whose perplexity is also measured
  std::string question;         // classification: the question (empty = the job default)
  std::string system_prompt;    // classification: the system turn (empty = the model's default)
  int32_t num_threads = 0;
};

// The data format eval uses: cmd.format, or classification for .tsv / .jsonl, else text.
std::string EvalFormat(const EvalCommand& cmd);

// Evaluates `cmd.model` on `cmd.data` (no training, no output directory written): the
// EvalMetrics of a job's step-0 evaluation. Errors: kNotFound for a missing --model / --data /
// --perplexity_path, the model path checks of RunGenerate, the job spec's validation errors
// (named fields), load errors (tokenizer larger than the model included), evaluation errors.
absl::StatusOr<lspo::v1::EvalMetrics> RunEval(const EvalCommand& cmd);

}  // namespace lspo::client

#endif  // LSPO_CLIENT_MODEL_TOOLS_H_
