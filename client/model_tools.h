// `lspctl generate`, `lspctl eval` and `lspctl convert`: use a model (an HF folder such as a
// job's output directory, or a GGUF file) without a training job.
//
//   generate: KV-cached decoding (model/generate.h) from a plain prompt or from conversations,
//             streaming the text as it is generated, stopping at the model's EOS ids.
//   eval:     loss, perplexity and (classification) accuracy of a data file through the same
//             evaluation code as a job (the worker's EvaluateJob on a job that trains nothing).
//   convert:  a Llama-architecture GGUF written as a Hugging Face model folder by the same code
//             that writes a job's output_dir (offload/hf_export.h).
//   export:   an HF folder written as a GGUF file for llama.cpp / Ollama (offload/gguf_export.h).
//   plan:     the memory a job needs in every mode, from the model's config alone
//             (offload/memory_plan.h), and whether it fits a device of a given size.
//
// Thread-safety: functions of a command-line process; not for concurrent use.
#ifndef LSPO_CLIENT_MODEL_TOOLS_H_
#define LSPO_CLIENT_MODEL_TOOLS_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "offload/gguf_export.h"
#include "proto/job_spec.pb.h"
#include "proto/metrics.pb.h"

namespace lspo::client {

struct GenerateCommand {
  std::string model;    // HF folder or GGUF file
  std::string adapter;  // PEFT LoRA adapter folder merged into `model` (JobSpec model.adapter_path)
  std::string prompt;   // plain text (tokenized as is; the tokenizer's BOS prepended when its
                        // post-processor adds one, as transformers' tokenizer(prompt) does)
  // JSONL file of conversations: each line {"messages": [{"role", "content"}, ...]} (one reply
  // per line), or each line one {"role", "content"} message (the whole file is one
  // conversation). Rendered with the model's chat template and the generation prompt.
  std::string chat_file;
  // Overrides the model's chat template: Jinja text, or the path of a file holding it (as
  // data.chat_template in a job spec). Empty = the template in the model's tokenizer files.
  std::string chat_template;
  int64_t max_new_tokens = 256;
  double temperature = 0.0;  // 0 = greedy
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;
  int32_t num_threads = 0;  // 0 = all cores
};

// Runs `cmd`: streams each reply to `out` as it is generated and a summary line per reply
// ("[N tokens, X tokens/s, prefill Y s, stopped at eos | max_new_tokens]") to `err`.
// `cmd.model` (here and in RunEval) may also be a model id ("org/name") in the local Hugging
// Face cache (runtime/hf_cache.h; its errors, naming the cache, when it is not there).
// Errors: kInvalidArgument when neither or both of prompt and chat_file are given, a
// conversation line is malformed (file:line named), num_threads < 0, the model path is a file
// that is not a .gguf, the tokenizer has more ids than the model's vocab_size, or a prompt
// plus max_new_tokens exceeds max_position_embeddings; kNotFound for a missing model path or
// a folder without config.json; the model's and tokenizer's load errors; for --chat,
// kFailedPrecondition when the model has no chat template and none is given, and the
// template's parse and render errors (text/chat_template.h: kInvalidArgument naming the
// template line, e.g. the template's own "roles must alternate"; kUnimplemented for Jinja
// outside the supported subset), with the chat file and conversation number; Generate's
// errors.
absl::Status RunGenerate(const GenerateCommand& cmd, std::FILE* out, std::FILE* err);

struct EvalCommand {
  std::string model;    // HF folder or GGUF file
  std::string adapter;  // PEFT LoRA adapter folder merged into `model` (JobSpec model.adapter_path)
  std::string data;     // evaluation file
  std::string format;   // classification, text, alpaca, chat or prompt_completion (empty:
                        // classification for .tsv, detected from the keys for .jsonl /
                        // .json as in a job, text otherwise)
  std::string chat_template;    // as data.chat_template (empty = the model's)
  int32_t seq_len = 0;          // 0 = the job default (128)
  int32_t max_examples = 0;     // 0 = all
  std::string perplexity_path;  // optional text file whose perplexity is also measured
  std::string question;         // classification: the question (empty = the job default)
  std::string system_prompt;    // classification: the system turn (empty = the model's default)
  int32_t num_threads = 0;
};

// The data format eval uses: cmd.format, or classification for .tsv, the detected format for
// .jsonl / .json (proto/job_spec.proto DataFormat), else text.
std::string EvalFormat(const EvalCommand& cmd);

// Evaluates `cmd.model` on `cmd.data` (no training, no output directory written): the
// EvalMetrics of a job's step-0 evaluation. Errors: kNotFound for a missing --model / --data /
// --perplexity_path, the model path checks of RunGenerate, the job spec's validation errors
// (named fields), load errors (tokenizer larger than the model included), evaluation errors.
absl::StatusOr<lspo::v1::EvalMetrics> RunEval(const EvalCommand& cmd);

struct ConvertCommand {
  std::string model;        // a Llama-architecture GGUF file
  std::string output_dir;   // the HF folder to write: must not exist, or be an empty folder
  int32_t num_threads = 0;  // 0 = all cores
};

// Writes the GGUF `cmd.model` as a Hugging Face model folder `cmd.output_dir` (parents
// created), through offload::WriteHfModelFolder, the writer of a job's output_dir:
//   config.json             LlamaConfig::ToHfConfigJson("float32") of the GGUF's metadata
//   generation_config.json  the special ids (bos, eos, pad)
//   model.safetensors       F32, every tensor of LlamaModel::FromGguf (dequantised) under its
//                           HF name and shape (e.g. model.embed_tokens.weight [vocab, hidden])
//   tokenizer.json, tokenizer_config.json (with the GGUF's tokenizer.chat_template),
//   special_tokens_map.json (BpeTokenizer::WriteHfFiles of the GGUF's tokenizer)
// The folder is written beside `output_dir` under a temporary name and renamed into place
// when complete, so a failure leaves no partial folder. Loading it back
// (LlamaModel::FromHfCheckpoint, BpeTokenizer::FromHfFolder) gives tensors bit-identical to
// FromGguf's and the GGUF tokenizer's ids.
// Errors: kInvalidArgument when --model or --output_dir is empty, --model is a folder or a file
// that is not a GGUF (no "GGUF" magic), --output_dir is a file or a folder that is not empty
// (refused, never overwritten), num_threads < 0, or the tokenizer has more ids than the
// model's vocab_size; kNotFound for a missing --model; the GGUF reader's and FromGguf's errors
// (kDataLoss for a corrupt file, kUnimplemented for an architecture or tensor type that is not
// supported), prefixed with the path; write errors (kPermissionDenied, kResourceExhausted,
// kInternal) naming the path.
absl::Status RunConvert(const ConvertCommand& cmd);

struct ExportCommand {
  std::string model;    // an HF model folder (e.g. a job's output_dir) or a model id in the cache
  std::string format;   // "gguf" (or empty, meaning gguf: the one format exported)
  std::string outtype;  // auto, f32, f16, bf16, q8_0 (offload/gguf_export.h; empty = auto)
  std::string outfile;  // the file to write (must not exist); empty = MODEL/<name>-<type>.gguf
};

// Writes `cmd.model` as a GGUF file (offload::ExportGguf; what is written and which families
// and tokenizers are: offload/gguf_export.h) and returns its result (the path written
// included). `cmd.model` may be a model id in the local Hugging Face cache (RunGenerate).
// Errors: kInvalidArgument for an empty --model, a --format other than gguf, an unknown
// --outtype, or a --model that is a file (a GGUF needs no export); kNotFound for a missing
// --model; ExportGguf's (kAlreadyExists for an existing --outfile, kUnimplemented for an
// unsupported family or tokenizer, naming it and the alternative).
absl::StatusOr<lspo::offload::GgufExportResult> RunExport(const ExportCommand& cmd);

struct PlanCommand {
  lspo::v1::JobSpec spec;       // the job (defaults are resolved here)
  std::string device;           // "cpu", "cuda", or "" = the spec's device (cuda when unset)
  double device_memory_gb = 0;  // > 0: also answer whether the job fits a device this large
};

// Writes to `out` the memory plan of `cmd.spec` in lsp, zero, native, lora, galore and
// galore-offload (a mode whose settings do not fit the model is left out, with its reason)
// for the worker on `cmd.device`, read from the model's config without loading a weight
// (offload::LoadJobModelConfig, offload::PlanJobMemory); with device_memory_gb, for each mode
// whether the job fits and the largest micro-batch (and lsp d) that does
// (offload::FitOnDevice), against the GiB given less kCudaContextBytes on CUDA, or against
// the spec's device_memory_limit_mb when it is set and smaller.
// Errors: kInvalidArgument for a device other than cpu / cuda or device_memory_gb < 0; the
// config readers' errors (naming the path); PlanJobMemory's for the spec's own mode.
absl::Status RunPlan(const PlanCommand& cmd, std::FILE* out);

}  // namespace lspo::client

#endif  // LSPO_CLIENT_MODEL_TOOLS_H_
