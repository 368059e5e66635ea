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
//   lspctl plan --spec=FILE [--device=cpu|cuda --device_memory_gb=4]
//                                                        memory per mode; does it fit
// Common flags: --scheduler=127.0.0.1:50060, spec overrides --steps, --mode, --output_dir;
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
#include "client/embedded.h"
#include "client/model_tools.h"
#include "client/prometheus.h"
#include "glog/logging.h"
#include "grpcpp/grpcpp.h"
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
#include "scheduler/job_spec.h"

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
ABSL_FLAG(double, timeout_seconds, 5, "health: deadline of the check, seconds");
ABSL_FLAG(std::string, adapter, "",
          "generate / eval: a PEFT LoRA adapter folder merged into --model (e.g. a lora job's "
          "OUTPUT/adapter onto its base model)");
ABSL_FLAG(std::string, model, "",
          "generate/eval: HF model folder (e.g. a job's output) or GGUF; convert: the GGUF");
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
ABSL_FLAG(std::string, data, "", "eval: data file (.tsv/.jsonl classification, else text)");
ABSL_FLAG(std::string, format, "", "eval: classification or text (default from the extension)");
ABSL_FLAG(int32_t, seq_len, 0, "eval: tokens per example or block (0 = 128)");
ABSL_FLAG(int32_t, max_examples, 0, "eval: at most this many examples (0 = all)");
ABSL_FLAG(std::string, perplexity_path, "", "eval: also measure the perplexity of this text");
ABSL_FLAG(std::string, question, "", "eval: classification question (default: the job's)");
ABSL_FLAG(std::string, system_prompt, "", "eval: classification system prompt");
ABSL_FLAG(double, device_memory_gb, 0,
          "plan: answer whether the job fits a device of this many GiB (0 = only the plan)");
ABSL_FLAG(std::string, device, "", "plan: plan for cpu or cuda (empty = the spec's device)");
ABSL_FLAG(int32_t, threads, 0, "generate/eval/convert: CPU threads (0 = all cores)");

namespace {

using lspo::v1::JobStatus;

constexpr char kUsage[] =
    "LSP-Offload client.\n"
    "  lspctl run --spec=FILE              fine-tune in embedded mode (one process)\n"
    "  lspctl submit --spec=FILE [--watch] submit to a running lsp_scheduler\n"
    "  lspctl status JOB | watch JOB | cancel JOB | list\n"
    "  lspctl health [SERVICE]             grpc.health.v1 check of the server at --scheduler\n"
    "                                      (also a worker or optimizer address); exit 0 when\n"
    "                                      SERVING, 1 otherwise\n"
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
    "  lspctl plan --spec=FILE [--device=cpu|cuda --device_memory_gb=4]\n"
    "                                      memory per mode from the model's config (no\n"
    "                                      weights read); whether the job fits, the largest\n"
    "                                      micro-batch and lsp d that do\n"
    "Flags: --scheduler=HOST:PORT (127.0.0.1:50060), --json, --watch, --verbose,\n"
    "  spec overrides --steps --mode --schedule --output_dir --rank (a data-parallel job's\n"
    "  rank: one lspctl run per rank, same spec) --bind_address (that rank's address)\n"
    "  --rendezvous (rank 0's host:port) --rendezvous_token_file (the job's token, mode 0600)\n"
    "  --allow_remote_rendezvous (a rendezvous address that is not loopback),\n"
    "  --timeout_seconds (health),\n"
    "  --auth_token_file=FILE (bearer token, mode 0600), --tls_ca=CA.pem (TLS).\n"
    "  lspctl --helpfull lists every flag.\n"
    "Exit codes: 0 success, 1 job failed/cancelled, not SERVING or RPC error, 2 usage error.";

// Prints "lspctl: <message>" to stderr; returns exit code 1.
int Fail(const absl::Status& status) {
  std::fprintf(stderr, "lspctl: %s\n", std::string(status.message()).c_str());
  return 1;
}

std::string Duration(double s) {
  if (!(s >= 0) || !std::isfinite(s)) return "?";
  const int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm", t / 3600, (t / 60) % 60);
  if (t >= 60) return absl::StrFormat("%dm%02ds", t / 60, t % 60);
  return absl::StrFormat("%ds", t);
}

std::string StateName(lspo::v1::JobState s) { return lspo::v1::JobState_Name(s); }

// The headline number of an evaluation: tag F1 of a generative one, else the accuracy of a
// classification one, else the perplexity when measured, else the loss.
std::string EvalHeadline(const lspo::v1::EvalMetrics& e, bool classification) {
  if (e.generated_examples() > 0) {
    return absl::StrFormat("F1 %.4f exact %.4f", e.f1(), e.exact_match());
  }
  if (classification) return absl::StrFormat("accuracy %.4f", e.accuracy());
  if (e.perplexity() > 0) return absl::StrFormat("ppl %.3f", e.perplexity());
  return absl::StrFormat("loss %.4f", e.loss());
}

bool IsClassification(const JobStatus& s) {
  return s.spec().data().format() == lspo::v1::DATA_FORMAT_CLASSIFICATION;
}

// One-line progress: [#####-----] step 12/60 loss 0.4312 tok/s 210 ETA 4m10s | eval F1 0.41
// | phase; a data-parallel rank adds "rank 1/2" after the step.
std::string ProgressLine(const JobStatus& s) {
  const int width = 24;
  const int total = std::max(1, s.total_steps());
  const int filled = static_cast<int>(static_cast<double>(s.step()) / total * width);
  std::string bar(filled, '#');
  bar.append(width - filled, '-');
  std::string line = absl::StrFormat("[%s] step %d/%d", bar, s.step(), s.total_steps());
  if (s.spec().distributed().world_size() > 1) {  // each rank's scheduler shows its rank
    absl::StrAppendFormat(&line, " rank %d/%d", s.spec().distributed().rank(),
                          s.spec().distributed().world_size());
  }
  if (s.has_last_step()) {
    absl::StrAppendFormat(&line, " loss %.4f tok/s %.0f ETA %s", s.last_step().loss(),
                          s.last_step().tokens_per_second(), Duration(s.eta_seconds()));
  }
  if (s.evals_size() > 0) {
    absl::StrAppend(&line, " | eval ",
                    EvalHeadline(s.evals(s.evals_size() - 1), IsClassification(s)));
  }
  absl::StrAppend(&line, " | ", s.phase());
  return line;
}

// `text` for one terminal line: control characters, quotes and backslashes C-escaped
// (absl::Utf8SafeCHexEscape: \n, \x1b; UTF-8 kept), at most `max_bytes` bytes (then "...").
std::string OneLine(const std::string& text, size_t max_bytes = 160) {
  std::string out = absl::Utf8SafeCHexEscape(text);
  if (out.size() > max_bytes) {
    size_t cut = max_bytes;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
    out = absl::StrCat(out.substr(0, cut), "...");
  }
  return out;
}

// `earlier`: the evaluation was made by the run this one resumed (its metrics.jsonl history).
void PrintEval(const lspo::v1::EvalMetrics& e, bool classification, bool earlier = false) {
  std::string line = EvalHeadline(e, classification);
  // The headline of a generative evaluation is its F1; keep accuracy and perplexity visible.
  if (e.generated_examples() > 0 && classification) {
    absl::StrAppendFormat(&line, ", accuracy %.4f", e.accuracy());
  }
  if (e.perplexity() > 0 && (e.generated_examples() > 0 || classification)) {
    absl::StrAppendFormat(&line, ", ppl %.3f", e.perplexity());
  }
  if (!absl::StartsWith(line, "loss")) {
    absl::StrAppendFormat(&line, ", answer loss %.4f", e.loss());
  }
  std::printf("\n  eval after step %d%s: %s (%d examples, %.1f s)\n", e.step(),
              earlier ? " (earlier run, before the resume)" : "", line.c_str(), e.examples(),
              e.seconds());
  if (e.generated_examples() > 0) {
    std::printf("    exact match %.4f, tag precision %.4f, recall %.4f, F1 %.4f over %d "
                "generated answers (%.1f s)\n",
                e.exact_match(), e.precision(), e.recall(), e.f1(), e.generated_examples(),
                e.generation_seconds());
    for (const auto& g : e.samples()) {
      std::printf("    want \"%s\"  got \"%s\"  F1 %.2f\n", OneLine(g.reference()).c_str(),
                  OneLine(g.prediction()).c_str(), g.f1());
    }
  }
}

void PrintData(const lspo::v1::DataSummary& d) {
  std::printf("\n  %s data %s (%s): %lld example%s of %lld record%s, %lld tokens, %lld loss "
              "tokens, %lld truncated to %d, %lld skipped, longest %lld\n",
              d.split().c_str(), d.path().c_str(), d.format().c_str(),
              static_cast<long long>(d.examples()), d.examples() == 1 ? "" : "s",
              static_cast<long long>(d.records()), d.records() == 1 ? "" : "s",
              static_cast<long long>(d.tokens()), static_cast<long long>(d.loss_tokens()),
              static_cast<long long>(d.truncated()), d.seq_len(),
              static_cast<long long>(d.skipped()), static_cast<long long>(d.longest()));
  if (d.packed_rows() > 0) {
    std::printf("  packed into %lld rows of at most %d tokens\n",
                static_cast<long long>(d.packed_rows()), d.seq_len());
  }
  if (d.split() == "train" && !d.rendered_example().empty()) {
    std::printf("  first example, loss on [[...]]:\n%s\n", d.rendered_example().c_str());
  }
}

// Streams a job's status with a progress bar; returns the final status.
absl::StatusOr<JobStatus> WatchWithProgress(lspo::v1::Scheduler::Stub* stub,
                                            const std::string& job_id) {
  grpc::ClientContext ctx;
  lspo::v1::WatchJobRequest req;
  req.set_job_id(job_id);
  auto reader = stub->WatchJob(&ctx, req);
  JobStatus s, last;
  int evals_seen = 0, data_seen = 0;
  const bool tty = isatty(fileno(stdout));
  while (reader->Read(&s)) {
    for (; data_seen < s.data_size(); ++data_seen) PrintData(s.data(data_seen));
    for (; evals_seen < s.evals_size(); ++evals_seen) {
      const auto& e = s.evals(evals_seen);
      PrintEval(e, IsClassification(s),
                s.resumed_from_step() > 0 && e.step() <= s.resumed_from_step());
    }
    if (s.mean_projector_error() != last.mean_projector_error()) {
      std::printf("\n  projectors fitted: mean relative estimation bias %.4f\n",
                  s.mean_projector_error());
    }
    const std::string line = ProgressLine(s);
    if (tty) {
      std::printf("\r\033[K%s", line.c_str());
    } else if (s.step() != last.step() || s.phase() != last.phase()) {
      std::printf("%s\n", line.c_str());
    }
    std::fflush(stdout);
    last = s;
  }
  std::printf("\n");
  auto st = lspo::rpc::FromGrpc(reader->Finish(), "scheduler");
  if (!st.ok()) return st;
  return last;
}

bool IsFinished(lspo::v1::JobState s) {
  return s == lspo::v1::SUCCEEDED || s == lspo::v1::FAILED || s == lspo::v1::CANCELLED;
}

int Finish(const JobStatus& s) {
  std::printf("job %s: %s\n", s.job_id().c_str(), StateName(s.state()).c_str());
  // Embedded runs share the file system with the scheduler: show the summary it wrote.
  if (s.state() == lspo::v1::SUCCEEDED && !s.output_dir().empty()) {
    std::ifstream in(s.output_dir() + "/summary.json");
    if (in) std::cout << "summary.json: " << in.rdbuf() << std::flush;
  }
  if (!s.error().empty()) std::printf("error: %s\n", s.error().c_str());
  if (s.skipped_steps() > 0) std::printf("skipped non-finite steps: %d\n", s.skipped_steps());
  if (s.resumed_from_step() > 0) {
    std::printf("resumed from step %d (scheduler restarts: %d)\n", s.resumed_from_step(),
                s.restarts());
  }
  if (s.last_checkpoint_step() > 0) {
    std::printf("last checkpoint: step %d in %s\n", s.last_checkpoint_step(),
                s.last_checkpoint_dir().c_str());
  }
  if (!s.last_error().empty()) std::printf("last error: %s\n", s.last_error().c_str());
  if (s.state() == lspo::v1::SUCCEEDED && !s.output_dir().empty()) {
    // mode lora also writes the PEFT adapter folder (docs/baselines.md).
    const bool adapter = access((s.output_dir() + "/adapter/adapter_config.json").c_str(), R_OK) == 0;
    std::printf("output: %s (report.html, summary.json, metrics.jsonl, events.out.tfevents.* "
                "for tensorboard --logdir, model.safetensors, config.json, tokenizer.json%s)\n",
                s.output_dir().c_str(), adapter ? ", adapter/ for PEFT" : "");
  } else if (IsFinished(s.state()) && !s.output_dir().empty()) {
    // A failed or cancelled job has no model, but its report and logs up to the end.
    std::printf("output: %s (report.html with the outcome, metrics.jsonl up to the end)\n",
                s.output_dir().c_str());
  }
  return s.state() == lspo::v1::SUCCEEDED ? 0 : 1;
}

absl::StatusOr<lspo::v1::JobSpec> SpecFromFlags() {
  const std::string path = absl::GetFlag(FLAGS_spec);
  if (path.empty()) {
    return absl::InvalidArgumentError("--spec=FILE is required (see examples/)");
  }
  auto spec = lspo::scheduler::LoadJobSpecFile(path);
  if (!spec.ok()) return spec.status();
  if (absl::GetFlag(FLAGS_steps) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps), " must be >= 1 (0 keeps the spec)"));
  }
  if (absl::GetFlag(FLAGS_steps) > 0) spec->set_steps(absl::GetFlag(FLAGS_steps));
  // Case and a MODE_ prefix do not matter (--mode=GALORE, --mode=MODE_ZERO), nor - vs _.
  std::string mode = absl::AsciiStrToLower(absl::GetFlag(FLAGS_mode));
  if (absl::StartsWith(mode, "mode_")) mode = mode.substr(5);
  absl::StrReplaceAll({{"_", "-"}}, &mode);
  if (!mode.empty()) {
    static const auto* const kModes = new std::map<std::string, lspo::v1::TrainingMode>{
        {"lsp", lspo::v1::MODE_LSP},       {"native", lspo::v1::MODE_NATIVE},
        {"zero", lspo::v1::MODE_ZERO},     {"lora", lspo::v1::MODE_LORA},
        {"galore", lspo::v1::MODE_GALORE}, {"galore-offload", lspo::v1::MODE_GALORE}};
    auto it = kModes->find(mode);
    if (it == kModes->end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mode=", absl::GetFlag(FLAGS_mode),
                       " is not a mode: use lsp, zero, native, lora, galore or galore-offload"));
    }
    // The spec's settings of another mode would be refused with the new mode: the flag says
    // which mode to run, so they are dropped (with a note), as the lsp section is unused.
    if (it->second != lspo::v1::MODE_LORA && spec->has_lora()) {
      std::fprintf(stderr, "lspctl: --mode=%s: the spec's lora settings are not used\n",
                   mode.c_str());
      spec->clear_lora();
    }
    if (it->second != lspo::v1::MODE_GALORE && spec->has_galore()) {
      std::fprintf(stderr, "lspctl: --mode=%s: the spec's galore settings are not used\n",
                   mode.c_str());
      spec->clear_galore();
    }
    spec->set_mode(it->second);
    if (it->second == lspo::v1::MODE_GALORE) {
      spec->mutable_galore()->set_offload(mode == "galore-offload");
    }
  }
  const std::string schedule = absl::GetFlag(FLAGS_schedule);
  if (schedule == "serial" || schedule == "overlap") {
    spec->set_schedule(schedule == "serial" ? lspo::v1::STEP_SCHEDULE_SERIAL
                                            : lspo::v1::STEP_SCHEDULE_OVERLAP);
  } else if (!schedule.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--schedule=", schedule, " is not a schedule: use overlap or serial"));
  }
  if (!absl::GetFlag(FLAGS_output_dir).empty()) {
    spec->set_output_dir(absl::GetFlag(FLAGS_output_dir));
  }
  if (absl::GetFlag(FLAGS_rank) >= 0) spec->mutable_distributed()->set_rank(absl::GetFlag(FLAGS_rank));
  if (!absl::GetFlag(FLAGS_bind_address).empty()) {
    spec->mutable_distributed()->set_bind_address(absl::GetFlag(FLAGS_bind_address));
  }
  if (!absl::GetFlag(FLAGS_rendezvous).empty()) {
    spec->mutable_distributed()->set_rendezvous(absl::GetFlag(FLAGS_rendezvous));
  }
  if (!absl::GetFlag(FLAGS_rendezvous_token_file).empty()) {
    spec->mutable_distributed()->set_rendezvous_token_file(
        absl::GetFlag(FLAGS_rendezvous_token_file));
  }
  if (absl::GetFlag(FLAGS_allow_remote_rendezvous)) {
    spec->mutable_distributed()->set_allow_remote(true);
  }
  return spec;
}

// The run header: the job's mode, schedule and settings; with `in_process` (lspctl run, where
// this process trains) also the CPU BLAS and its kernel set (runtime/cpu_blas.h), with its
// warning if a generic kernel set runs on an AVX2-or-better CPU.
void PrintChoice(const lspo::v1::JobSpec& in, bool in_process) {
  lspo::v1::JobSpec spec = in;
  lspo::scheduler::ResolveDefaults(&spec);
  const bool on_worker = spec.mode() == lspo::v1::MODE_NATIVE ||
                         spec.mode() == lspo::v1::MODE_LORA ||
                         (spec.mode() == lspo::v1::MODE_GALORE && !spec.galore().offload());
  std::string method;  // The mode's own settings.
  if (spec.mode() == lspo::v1::MODE_LSP) {
    method = absl::StrCat(spec.lsp().d_ratio() > 0 ? absl::StrCat("d_ratio=", spec.lsp().d_ratio())
                                                   : absl::StrCat("d=", spec.lsp().d()),
                          " r=", spec.lsp().r(), ", ");
  } else if (spec.mode() == lspo::v1::MODE_LORA) {
    method = absl::StrCat("lora r=", spec.lora().r(), " alpha=", spec.lora().alpha(), " on ",
                          absl::StrJoin(spec.lora().target_modules(), ","), ", ");
  } else if (spec.mode() == lspo::v1::MODE_GALORE) {
    method = absl::StrCat(spec.galore().offload() ? "galore-offload" : "galore",
                          " rank=", spec.galore().rank(), " gap=", spec.galore().update_proj_gap(),
                          " scale=", spec.galore().scale(), ", ");
  }
  std::printf(
      "LSP-Offload job '%s': mode %s (%s), %ssteps=%d, micro-batch %s x %d "
      "accum, seq_len %d, lr %g (%s, warm-up %d), %d threads\n",
      spec.name().c_str(), lspo::runtime::EnumShortName(spec.mode()).c_str(),
      on_worker ? "no offload"
                : absl::StrCat(lspo::runtime::EnumShortName(spec.schedule()), " schedule",
                               spec.distributed().world_size() > 1 ? ", data parallel" : "")
                      .c_str(),
      method.c_str(), spec.steps(),
      spec.has_micro_batch_size() ? absl::StrCat(spec.micro_batch_size()).c_str()
                                  : "auto (8 on the CPU; a GPU worker takes the largest that fits)",
      spec.grad_accum(), spec.seq_len(),
      spec.optim().lr(), lspo::runtime::EnumShortName(spec.optim().schedule()).c_str(),
      spec.optim().warmup_steps(), spec.num_threads());
  if (spec.distributed().world_size() > 1) {
    const auto& d = spec.distributed();
    std::printf("  data parallel: rank %d of %d, rendezvous %s, %d examples per step\n",
                d.rank(), d.world_size(),
                d.rendezvous().empty() ? "127.0.0.1:29500" : d.rendezvous().c_str(),
                spec.micro_batch_size() * spec.grad_accum() * d.world_size());
  }
  if (in_process) std::printf("  CPU BLAS: %s\n", lspo::runtime::CpuBlas().Line().c_str());
  std::fflush(stdout);
}

// `lspctl run` on Ctrl-C or SIGTERM: the first signal cancels the job being watched through
// the scheduler, as `lspctl cancel` does, so that it ends with its report.html written and the
// embedded services shut down in order; a second signal (or one while no job is watched)
// exits at once with status 128 + signal. The handler only writes the signal number to a
// pipe (async-signal-safe; any thread may take the signal, including threads libraries start
// before main); a waiting thread makes the cancel call.
class InterruptCanceller {
 public:
  // Installs the SIGINT / SIGTERM handler and starts the waiting thread.
  static void Install() {
    if (pipe2(pipe_fds_, O_CLOEXEC) != 0) return;  // keep the default action
    struct sigaction sa = {};
    sa.sa_handler = &OnSignal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    std::thread([] { Wait(); }).detach();
  }
  // The job a signal cancels (stub outlives the watch); Watch(nullptr, "") forgets it.
  static void Watch(lspo::v1::Scheduler::Stub* stub, const std::string& job_id) {
    std::lock_guard<std::mutex> lock(Mu());
    Target().stub = stub;
    Target().job_id = job_id;
  }

 private:
  struct Job {
    lspo::v1::Scheduler::Stub* stub = nullptr;
    std::string job_id;
  };
  static void OnSignal(int sig) {
    if (signalled_.exchange(true)) _exit(128 + sig);  // the second signal: at once
    const unsigned char byte = static_cast<unsigned char>(sig);
    if (write(pipe_fds_[1], &byte, 1) != 1) _exit(128 + sig);
  }
  static std::mutex& Mu() {
    static std::mutex mu;
    return mu;
  }
  static Job& Target() {
    static Job job;
    return job;
  }
  static void Wait() {
    unsigned char byte = 0;
    while (read(pipe_fds_[0], &byte, 1) != 1) {
    }
    const int sig = byte;
    std::lock_guard<std::mutex> lock(Mu());
    const Job& job = Target();
    if (job.stub == nullptr) {
      std::fprintf(stderr, "\nlspctl: %s: exiting now\n", strsignal(sig));
      _exit(128 + sig);
    }
    std::fprintf(stderr,
                 "\nlspctl: %s: cancelling job %s (it stops after its current step or "
                 "evaluation batch; press Ctrl-C again to quit at once)\n",
                 strsignal(sig), job.job_id.c_str());
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    lspo::v1::CancelJobRequest req;
    req.set_job_id(job.job_id);
    lspo::v1::CancelJobReply rep;
    absl::Status st = lspo::rpc::FromGrpc(job.stub->CancelJob(&ctx, req, &rep), "scheduler");
    if (!st.ok()) std::fprintf(stderr, "lspctl: cancel failed: %s\n", st.ToString().c_str());
  }
  static inline int pipe_fds_[2] = {-1, -1};
  static inline std::atomic<bool> signalled_{false};
};

int Submit(lspo::v1::Scheduler::Stub* stub, bool watch, bool cancel_on_signal = false,
           bool in_process = false) {
  auto spec = SpecFromFlags();
  if (!spec.ok()) {
    std::fprintf(stderr, "lspctl: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  PrintChoice(*spec, in_process);
  grpc::ClientContext ctx;
  lspo::v1::SubmitJobRequest req;
  *req.mutable_spec() = *spec;
  lspo::v1::SubmitJobReply rep;
  auto st = lspo::rpc::FromGrpc(stub->SubmitJob(&ctx, req, &rep), "scheduler");
  if (!st.ok()) {
    std::fprintf(stderr, "lspctl: submit failed: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("submitted %s\n", rep.job_id().c_str());
  if (!watch) return 0;
  if (cancel_on_signal) InterruptCanceller::Watch(stub, rep.job_id());
  auto fin = WatchWithProgress(stub, rep.job_id());
  if (cancel_on_signal) InterruptCanceller::Watch(nullptr, "");
  if (!fin.ok()) return Fail(fin.status());
  return Finish(*fin);
}

std::string ToJsonString(const google::protobuf::Message& m) {
  return lspo::runtime::ProtoToJson(m, lspo::runtime::ProtoJsonPrint::Pretty());
}

void PrintRow(const JobStatus& s) {
  std::printf("%-24s %-13s %5d/%-5d %-10s %s\n", s.job_id().c_str(),
              StateName(s.state()).c_str(), s.step(), s.total_steps(),
              s.has_last_step() ? absl::StrFormat("%.4f", s.last_step().loss()).c_str() : "-",
              s.error().empty() ? s.phase().c_str() : s.error().c_str());
}

absl::StatusOr<lspo::v1::ListJobsReply> ListJobs(lspo::v1::Scheduler::Stub* stub) {
  grpc::ClientContext ctx;
  lspo::v1::ListJobsReply rep;
  RETURN_IF_ERROR(
      lspo::rpc::FromGrpc(stub->ListJobs(&ctx, lspo::v1::ListJobsRequest(), &rep), "scheduler"));
  return rep;
}

absl::StatusOr<JobStatus> GetJob(lspo::v1::Scheduler::Stub* stub, const std::string& job_id) {
  grpc::ClientContext ctx;
  lspo::v1::GetJobRequest req;
  req.set_job_id(job_id);
  JobStatus s;
  RETURN_IF_ERROR(lspo::rpc::FromGrpc(stub->GetJob(&ctx, req, &s), "scheduler"));
  return s;
}

// A job that already ended cannot be cancelled: say so and exit 1.
int Cancel(lspo::v1::Scheduler::Stub* stub, const std::string& job_id) {
  auto before = GetJob(stub, job_id);
  if (!before.ok()) return Fail(before.status());
  if (IsFinished(before->state())) {
    std::fprintf(stderr, "lspctl: job %s already finished (%s): nothing to cancel\n",
                 job_id.c_str(), StateName(before->state()).c_str());
    return 1;
  }
  grpc::ClientContext ctx;
  lspo::v1::CancelJobRequest req;
  req.set_job_id(job_id);
  lspo::v1::CancelJobReply rep;
  auto st = lspo::rpc::FromGrpc(stub->CancelJob(&ctx, req, &rep), "scheduler");
  if (!st.ok()) return Fail(st);
  if (rep.state() == lspo::v1::CANCELLED) {
    std::printf("%s: CANCELLED\n", job_id.c_str());
  } else if (IsFinished(rep.state())) {  // Ended between the two calls.
    std::fprintf(stderr, "lspctl: job %s already finished (%s): nothing to cancel\n",
                 job_id.c_str(), StateName(rep.state()).c_str());
    return 1;
  } else {
    std::printf("%s: %s, cancel requested (it stops after its current step or evaluation "
                "batch)\n",
                job_id.c_str(), StateName(rep.state()).c_str());
  }
  return 0;
}

// grpc.health.v1 Check of the server at `address`; 0 when SERVING.
int Health(const std::shared_ptr<grpc::Channel>& channel, const std::string& address,
           const std::string& service) {
  auto st = lspo::runtime::CheckHealth(channel, service,
                                       absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds)));
  const std::string what = service.empty() ? address : absl::StrCat(address, " ", service);
  if (!st.ok()) {
    std::printf("%s: %s\n", what.c_str(), std::string(st.status().message()).c_str());
    return 1;
  }
  std::printf("%s: %s\n", what.c_str(), lspo::runtime::HealthStatusName(*st));
  // The services log their own at start-up ("CPU BLAS:"); this is the host lspctl runs on.
  std::printf("this host's CPU BLAS: %s\n", lspo::runtime::CpuBlas().Line().c_str());
  return *st == lspo::runtime::HealthStatus::kServing ? 0 : 1;
}

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
  InterruptCanceller::Install();
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
                 "|convert|plan ... (--help)\n");
    return 2;
  }
  const std::string cmd = args[1];
  const std::string arg = args.size() > 2 ? args[2] : "";

  if (cmd == "plan") {
    FLAGS_minloglevel = absl::GetFlag(FLAGS_verbose) ? 0 : 1;
    auto spec = SpecFromFlags();
    if (!spec.ok()) return Fail(spec.status());
    lspo::client::PlanCommand p;
    p.spec = *spec;
    p.device = absl::GetFlag(FLAGS_device);
    p.device_memory_gb = absl::GetFlag(FLAGS_device_memory_gb);
    absl::Status st = lspo::client::RunPlan(p, stdout);
    return st.ok() ? 0 : Fail(st);
  }

  if (cmd == "convert") {
    if (absl::GetFlag(FLAGS_model).empty() || absl::GetFlag(FLAGS_output_dir).empty()) {
      std::fprintf(stderr, "lspctl convert: give --model=FILE.gguf and --output_dir=DIR (a new "
                           "or empty folder)\n");
      return 2;
    }
    FLAGS_minloglevel = absl::GetFlag(FLAGS_verbose) ? 0 : 1;
    lspo::client::ConvertCommand c;
    c.model = absl::GetFlag(FLAGS_model);
    c.output_dir = absl::GetFlag(FLAGS_output_dir);
    c.num_threads = absl::GetFlag(FLAGS_threads);
    absl::Status st = lspo::client::RunConvert(c);
    if (!st.ok()) return Fail(st);
    std::vector<std::string> files;
    std::error_code fs_error;
    for (const auto& e : std::filesystem::directory_iterator(c.output_dir, fs_error)) {
      files.push_back(e.path().filename().string());
    }
    std::sort(files.begin(), files.end());
    std::printf("wrote %s: %s\n", c.output_dir.c_str(), absl::StrJoin(files, ", ").c_str());
    return 0;
  }

  if (cmd == "generate" || cmd == "eval") {
    if (absl::GetFlag(FLAGS_model).empty()) {
      std::fprintf(stderr, "lspctl %s: give --model=DIR|FILE (an HF folder or a GGUF file)\n",
                   cmd.c_str());
      return 2;
    }
    FLAGS_minloglevel = absl::GetFlag(FLAGS_verbose) ? 0 : 1;
    if (cmd == "generate") {
      if (absl::GetFlag(FLAGS_prompt).empty() == absl::GetFlag(FLAGS_chat).empty()) {
        std::fprintf(stderr, "lspctl generate: give exactly one of --prompt=TEXT and "
                             "--chat=FILE.jsonl\n");
        return 2;
      }
      if (!absl::GetFlag(FLAGS_chat_template).empty() && absl::GetFlag(FLAGS_chat).empty()) {
        std::fprintf(stderr, "lspctl generate: --chat_template applies to --chat conversations; "
                             "a --prompt is tokenized as it is\n");
        return 2;
      }
      lspo::client::GenerateCommand g;
      g.model = absl::GetFlag(FLAGS_model);
      g.adapter = absl::GetFlag(FLAGS_adapter);
      g.prompt = absl::GetFlag(FLAGS_prompt);
      g.chat_file = absl::GetFlag(FLAGS_chat);
      g.chat_template = absl::GetFlag(FLAGS_chat_template);
      g.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
      g.temperature = absl::GetFlag(FLAGS_temperature);
      g.top_k = absl::GetFlag(FLAGS_top_k);
      g.top_p = absl::GetFlag(FLAGS_top_p);
      g.seed = absl::GetFlag(FLAGS_seed);
      g.num_threads = absl::GetFlag(FLAGS_threads);
      absl::Status st = lspo::client::RunGenerate(g, stdout, stderr);
      return st.ok() ? 0 : Fail(st);
    }
    const std::string format = absl::GetFlag(FLAGS_format);
    if (absl::GetFlag(FLAGS_data).empty() ||
        (!format.empty() && format != "classification" && format != "text" &&
         format != "alpaca" && format != "chat" && format != "prompt_completion")) {
      std::fprintf(stderr, "lspctl eval: give --data=FILE and, optionally, "
                           "--format=classification|text|alpaca|chat|prompt_completion\n");
      return 2;
    }
    lspo::client::EvalCommand e;
    e.model = absl::GetFlag(FLAGS_model);
    e.adapter = absl::GetFlag(FLAGS_adapter);
    e.data = absl::GetFlag(FLAGS_data);
    e.format = absl::GetFlag(FLAGS_format);
    e.seq_len = absl::GetFlag(FLAGS_seq_len);
    e.max_examples = absl::GetFlag(FLAGS_max_examples);
    e.perplexity_path = absl::GetFlag(FLAGS_perplexity_path);
    e.num_threads = absl::GetFlag(FLAGS_threads);
    e.question = absl::GetFlag(FLAGS_question);
    e.system_prompt = absl::GetFlag(FLAGS_system_prompt);
    e.chat_template = absl::GetFlag(FLAGS_chat_template);
    auto m = lspo::client::RunEval(e);
    if (!m.ok()) return Fail(m.status());
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", ToJsonString(*m).c_str());
    } else {
      const std::string f = lspo::client::EvalFormat(e);
      if (f == "text") {
        std::printf("%d blocks, loss %.6f, perplexity %.4f", m->examples(), m->loss(),
                    std::exp(m->loss()));
      } else if (f != "classification") {
        std::printf("%d examples (%s), answer loss %.6f, answer perplexity %.4f", m->examples(),
                    f.c_str(), m->loss(), std::exp(m->loss()));
      } else {
        std::printf("%d examples, accuracy %.4f, answer loss %.6f", m->examples(),
                    m->accuracy(), m->loss());
      }
      if (m->perplexity() > 0) {
        std::printf(", perplexity of %s %.4f (%lld tokens)", e.perplexity_path.c_str(),
                    m->perplexity(), static_cast<long long>(m->perplexity_tokens()));
      }
      std::printf(" (%.1f s)\n", m->seconds());
    }
    return 0;
  }

  if (cmd == "run") {
    // The progress bar and evaluation lines are the default output; --verbose adds the
    // services' INFO logs (projector fits, per-step timings).
    FLAGS_minloglevel = absl::GetFlag(FLAGS_verbose) ? 0 : 1;
    auto runtime = lspo::client::EmbeddedRuntime::Start();
    if (!runtime.ok()) return Fail(runtime.status());
    auto stub = lspo::v1::Scheduler::NewStub((*runtime)->scheduler_channel());
    return Submit(stub.get(), /*watch=*/true, /*cancel_on_signal=*/true, /*in_process=*/true);
  }

  const std::string address = absl::GetFlag(FLAGS_scheduler);
  auto channel = lspo::runtime::MakeChannel(address, lspo::runtime::ChannelSecurityFromFlags());
  if (!channel.ok()) return Fail(channel.status());
  if (cmd == "health") return Health(*channel, address, arg);
  auto stub = lspo::v1::Scheduler::NewStub(*channel);
  auto need_id = [&]() {
    if (arg.empty()) {
      std::fprintf(stderr, "lspctl %s: give a job id (lspctl list shows them)\n", cmd.c_str());
      return false;
    }
    return true;
  };
  if (cmd == "submit") return Submit(stub.get(), absl::GetFlag(FLAGS_watch));
  if (cmd == "watch") {
    if (!need_id()) return 2;
    auto fin = WatchWithProgress(stub.get(), arg);
    if (!fin.ok()) return Fail(fin.status());
    return Finish(*fin);
  }
  if (cmd == "status") {
    if (!need_id()) return 2;
    auto s = GetJob(stub.get(), arg);
    if (!s.ok()) return Fail(s.status());
    if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", ToJsonString(*s).c_str());
    } else {
      PrintRow(*s);
      std::printf("%s\n", ProgressLine(*s).c_str());
    }
    return 0;
  }
  if (cmd == "cancel") {
    if (!need_id()) return 2;
    return Cancel(stub.get(), arg);
  }
  if (cmd == "list" || cmd == "metrics") {
    auto rep = ListJobs(stub.get());
    if (!rep.ok()) return Fail(rep.status());
    if (cmd == "metrics") {
      std::fputs(lspo::client::JobsToPrometheus(*rep).c_str(), stdout);
    } else if (absl::GetFlag(FLAGS_json)) {
      std::printf("%s\n", ToJsonString(*rep).c_str());
    } else {
      std::printf("%-24s %-13s %11s %-10s %s\n", "JOB", "STATE", "STEP", "LOSS", "PHASE");
      for (const auto& s : rep->jobs()) PrintRow(s);
    }
    return 0;
  }
  std::fprintf(stderr,
               "lspctl: unknown command '%s' (run, submit, status, watch, cancel, list, health, "
               "metrics, generate, eval, convert; --help)\n",
               cmd.c_str());
  return 2;
}
