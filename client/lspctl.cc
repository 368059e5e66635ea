// lspctl: the LSP-Offload command-line client.
//
//   lspctl run    --spec=examples/smollm2-sms-spam.yaml   embedded mode (all three services in
//                                                        this process), progress bar, summary
//   lspctl submit --spec=FILE [--watch]                  to a running scheduler
//   lspctl status JOB_ID | watch JOB_ID | cancel JOB_ID | list
//   lspctl health [SERVICE]                              grpc.health.v1 check of any of the
//                                                        three services (--scheduler=ADDRESS)
//   lspctl metrics                                       jobs in Prometheus text format
//   lspctl generate --model=DIR|FILE (--prompt=TEXT | --chat=FILE.jsonl) [--max_new_tokens
//                   --temperature --top_k --top_p --seed --chat_template --adapter=DIR]
//                                                        KV-cached decoding, streamed
//   lspctl eval --model=DIR|FILE --data=FILE [--format --adapter=DIR]
//                                                        loss / perplexity / accuracy
//   lspctl convert --model=FILE.gguf --output_dir=DIR    a GGUF as a Hugging Face model folder
//   lspctl export --model=DIR --format=gguf [--outtype=auto|f32|f16|bf16|q8_0 --outfile=F]
//                                                        an HF folder as a GGUF (llama.cpp)
//   lspctl plan --spec=FILE [--device=cpu|cuda --device_memory_gb=4]
//                                                        memory per mode; does it fit
// run, submit and plan take KEY=VALUE arguments after the command: any spec field by its
// dotted path (optim.lr=3e-4) or its transformers / TRL / Axolotl name (max_steps=50;
// spec/spec_names.h). Common flags: --scheduler=127.0.0.1:50060, spec overrides --steps,
// --mode, --output_dir;
// security: --auth_token_file, --tls_ca (runtime/grpc_flags.h).
// Exit codes: 0 success (job SUCCEEDED for run/watch, SERVING for health), 1 job
// failed/cancelled, not SERVING, nothing to cancel, or RPC error; 2 usage error.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/lspctl_commands.h"
#include "client/model_tools.h"
#include "client/prometheus.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
#include "offload/training_mode.h"
#include "proto/job_spec.pb.h"
#include "proto/metrics.pb.h"
#include "proto/scheduler.grpc.pb.h"
#include "proto/scheduler.pb.h"
#include "runtime/cpu_blas.h"
#include "runtime/grpc_flags.h"
#include "runtime/process_env.h"
#include "runtime/proto_json.h"
#include "runtime/rpc_status.h"
#include "runtime/status_macros.h"
#include "spec/job_spec.h"

ABSL_FLAG(std::string, spec, "", "job spec file (.yaml, .yml or .json) for run/submit");
ABSL_FLAG(std::string, scheduler, "127.0.0.1:50060", "scheduler address for remote commands");
ABSL_FLAG(int32_t, steps, 0, "override the spec's steps (0 = keep)");
ABSL_FLAG(std::string, mode, "",
          "override the spec's mode: lsp, zero, native, lora, galore or galore-offload "
          "(galore with galore.offload); another mode's lora / galore settings are dropped");
ABSL_FLAG(std::string, schedule, "", "override the spec's offload schedule: overlap or serial");
ABSL_FLAG(std::string, output_dir, "",
          "run/submit: override the spec's output directory; convert: the folder to write");
ABSL_FLAG(int32_t, rank, -1,
          "run/submit: this process's rank of a data-parallel job (distributed.rank; -1 = keep)");
ABSL_FLAG(std::string, bind_address, "",
          "run/submit: this rank's address for the collectives (distributed.bind_address; a "
          "per-host setting when the ranks share one spec file; empty = keep)");
ABSL_FLAG(std::string, rendezvous, "",
          "run/submit: rank 0's host:port for a data-parallel job (distributed.rendezvous; "
          "empty = keep)");
ABSL_FLAG(std::string, rendezvous_token_file, "",
          "run/submit: file holding the data-parallel job's rendezvous token (mode 0600, the same "
          "token on every rank; distributed.rendezvous_token_file; a per-host path; empty = "
          "keep)");
ABSL_FLAG(bool, allow_remote_rendezvous, false,
          "run/submit: allow a rendezvous address that is not loopback (distributed.allow_remote; "
          "needs --rendezvous_token_file; false = keep)");
ABSL_FLAG(bool, watch, false, "submit: watch the job until it ends");
ABSL_FLAG(bool, json, false, "status/list: print JSON instead of a table");
ABSL_FLAG(bool, verbose, false, "run: also print the services' INFO logs to stderr");
ABSL_FLAG(bool, skip_memory_check, false,
          "run: train even when the job's memory plan does not fit the device (for a plan "
          "that overestimates a job known to fit; `lspctl plan` prints it)");
ABSL_FLAG(double, timeout_seconds, 5, "health: deadline of the check, seconds");
ABSL_FLAG(std::string, address, "",
          "health: the address of the service to check, a scheduler, worker or optimizer "
          "(empty = --scheduler)");
ABSL_FLAG(std::string, adapter, "",
          "generate / eval: a PEFT LoRA adapter folder merged into --model (e.g. a lora job's "
          "OUTPUT/adapter onto its base model)");
ABSL_FLAG(std::string, model, "",
          "generate/eval: HF model folder (e.g. a job's output) or GGUF; convert: the GGUF; "
          "export: the HF folder");
ABSL_FLAG(std::string, prompt, "", "generate: plain-text prompt");
ABSL_FLAG(std::string, chat, "", "generate: JSONL conversations ({\"messages\": [...]} per line)");
ABSL_FLAG(std::string, chat_template, "",
          "generate --chat / eval: a Jinja chat template (text or a .jinja file) instead of the "
          "model's");
ABSL_FLAG(int64_t, max_new_tokens, 256, "generate: tokens generated at most");
ABSL_FLAG(double, temperature, 0.0, "generate: sampling temperature (0 = greedy)");
ABSL_FLAG(int64_t, top_k, 0, "generate: keep the k most likely tokens (0 = off)");
ABSL_FLAG(double, top_p, 1.0, "generate: nucleus sampling mass (1 = off)");
ABSL_FLAG(uint64_t, seed, 0, "generate: sampling seed");
ABSL_FLAG(std::string, data, "",
          "eval: data file (.tsv, .json or .jsonl records, or plain text; docs/data.md)");
ABSL_FLAG(std::string, format, "",
          "eval: classification, text, alpaca, chat or prompt_completion (default: from the "
          "keys of the first record, as a job's data.format; text for other files); "
          "export: gguf");
ABSL_FLAG(int32_t, seq_len, 0, "eval: tokens per example or block (0 = 128)");
ABSL_FLAG(int32_t, max_examples, 0, "eval: at most this many examples (0 = all)");
ABSL_FLAG(std::string, perplexity_path, "", "eval: also measure the perplexity of this text");
ABSL_FLAG(std::string, question, "", "eval: classification question (default: the job's)");
ABSL_FLAG(std::string, system_prompt, "", "eval: classification system prompt");
ABSL_FLAG(double, device_memory_gb, 0,
          "plan: answer whether the job fits a device of this many GiB (0 = only the plan); "
          "also spelled --device_memory_gib");
ABSL_FLAG(double, device_memory_gib, 0, "plan: the same as --device_memory_gb (GiB)");
ABSL_FLAG(std::string, device, "", "plan: plan for cpu or cuda (empty = the spec's device)");
ABSL_FLAG(int32_t, threads, 0, "generate/eval/convert: CPU threads (0 = all cores)");
ABSL_FLAG(std::string, outtype, "auto",
          "export: the matrices' type, auto (bf16 for a bf16 model, else f16), f32, f16, bf16 "
          "or q8_0 (llama.cpp's names)");
ABSL_FLAG(std::string, outfile, "",
          "export: the GGUF file to write (must not exist; default <model name>-<TYPE>.gguf "
          "in the current folder)");

namespace {

constexpr char kUsage[] =
    "LSP-Offload client.\n"
    "  lspctl run --spec=FILE [KEY=VALUE ...]  fine-tune in embedded mode (one process);\n"
    "                                      KEY a field (optim.lr) or a transformers / TRL /\n"
    "                                      Axolotl name (learning_rate, max_steps): docs/spec.md\n"
    "  lspctl submit --spec=FILE [--watch] [KEY=VALUE ...]  submit to a running lsp_scheduler\n"
    "  lspctl status JOB | watch JOB | cancel JOB | list\n"
    "  lspctl health [SERVICE] [--address=HOST:PORT]\n"
    "                                      grpc.health.v1 check of the service at --address\n"
    "                                      (a scheduler, worker or optimizer; default\n"
    "                                      --scheduler); exit 0 when SERVING, 1 otherwise\n"
    "  lspctl metrics                      the scheduler's jobs in Prometheus text format\n"
    "  lspctl generate --model=DIR|FILE (--prompt=TEXT | --chat=FILE.jsonl)\n"
    "                  [--max_new_tokens=256 --temperature=0 --top_k=0 --top_p=1 --seed=0\n"
    "                   --chat_template=JINJA|FILE.jinja --adapter=PEFT_DIR]\n"
    "                                      generate from a model (e.g. a job's output folder)\n"
    "  lspctl eval --model=DIR|FILE --data=FILE [--format=classification|text|alpaca|chat|\n"
    "              prompt_completion --chat_template\n"
    "              --question --system_prompt --seq_len --max_examples --perplexity_path\n"
    "              --adapter=PEFT_DIR]\n"
    "                                      loss, perplexity, accuracy; no training\n"
    "  lspctl convert --model=FILE.gguf --output_dir=DIR\n"
    "                                      write a GGUF as a Hugging Face model folder\n"
    "                                      (config.json, fp32 model.safetensors, tokenizer\n"
    "                                      files); DIR must be new or empty\n"
    "  lspctl export --model=DIR --format=gguf [--outtype=auto|f32|f16|bf16|q8_0\n"
    "                --outfile=FILE.gguf]      write an HF folder (e.g. a job's output) as a\n"
    "                                      GGUF for llama.cpp / Ollama (Llama-architecture\n"
    "                                      models with byte-level BPE tokenizers)\n"
    "  lspctl spec --spec=FILE [KEY=VALUE ...]\n"
    "                                      print the spec as read (aliases resolved,\n"
    "                                      overrides applied) as JSON; nothing runs\n"
    "  lspctl plan --spec=FILE [KEY=VALUE ...] [--device=cpu|cuda --device_memory_gib=4]\n"
    "                                      memory per mode from the model's config (no\n"
    "                                      weights read); whether the job fits, the largest\n"
    "                                      micro-batch and lsp d that do\n"
    "Flags: --scheduler=HOST:PORT (127.0.0.1:50060), --json, --watch, --verbose,\n"
    "  spec overrides --steps --mode --schedule --output_dir --rank (a data-parallel job's\n"
    "  rank: one lspctl run per rank, same spec) --bind_address (that rank's address)\n"
    "  --rendezvous (rank 0's host:port) --rendezvous_token_file (the job's token, mode 0600)\n"
    "  --allow_remote_rendezvous (a rendezvous address that is not loopback),\n"
    "  --timeout_seconds --address (health),\n"
    "  --auth_token_file=FILE (bearer token, mode 0600), --tls_ca=CA.pem (TLS).\n"
    "  lspctl --helpfull lists every flag.\n"
    "Exit codes: 0 success, 1 job failed/cancelled, not SERVING or RPC error, 2 usage error.";

bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-help" || a == "-h" || (i == 1 && a == "help")) return true;
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  lspo::runtime::UsePassiveOpenMpWaits(argc, argv);
  lspo::runtime::UseOneMallocArena();
  // SIGINT / SIGTERM: a job watched by `lspctl run` is cancelled; otherwise the process exits
  // with 128 + signal, as by default.
  lspo::lspctl::InstallInterruptHandling();
  absl::SetProgramUsageMessage(kUsage);
  // Abseil's own --help exits 1; asking for help is not an error.
  if (WantsHelp(argc, argv)) {
    std::printf("%s\n", kUsage);
    return 0;
  }
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  if (args.size() < 2) {
    std::fprintf(stderr,
                 "usage: lspctl run|submit|status|watch|cancel|list|health|metrics|generate|eval"
                 "|convert|export|plan|spec ... (--help)\n");
    return 2;
  }
  const std::string cmd = args[1];
  const std::string arg = args.size() > 2 ? args[2] : "";
  if (cmd == "run" || cmd == "submit" || cmd == "plan" || cmd == "spec") {
    // Every argument after the command is a key=value override of the spec.
    lspo::lspctl::SetSpecOverrides(std::vector<std::string>(args.begin() + 2, args.end()));
  }

  if (cmd == "spec") return lspo::lspctl::PrintSpec();
  if (lspo::lspctl::IsModelCommand(cmd)) return lspo::lspctl::RunModelCommand(cmd);
  if (cmd == "run") return lspo::lspctl::RunEmbedded();
  return lspo::lspctl::RunJobCommand(cmd, arg);
}
