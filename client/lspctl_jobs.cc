// lspctl's job commands (lspctl_commands.h): submit, watch, status, cancel, list, metrics,
// health against a scheduler, and `run` in embedded mode (the overview: lspctl.cc).
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

namespace lspo::lspctl {
namespace {

using lspo::v1::JobStatus;

}  // namespace

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "lspctl: %s\n", std::string(status.message()).c_str());
  return 1;
}

namespace {

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
  // A job given in epochs counts its steps once the data is read: "?" until then.
  std::string line =
      absl::StrFormat("[%s] step %d/%s", bar, s.step(),
                      s.total_steps() > 0 ? absl::StrCat(s.total_steps()) : std::string("?"));
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
    std::printf(
        "    exact match %.4f, tag precision %.4f, recall %.4f, F1 %.4f over %d "
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
  std::printf(
      "\n  %s data %s (%s): %lld example%s of %lld record%s, %lld tokens, %lld loss "
      "tokens, %lld truncated to %d, %lld skipped, longest %lld\n",
      d.split().c_str(), d.path().c_str(), d.format().c_str(), static_cast<long long>(d.examples()),
      d.examples() == 1 ? "" : "s", static_cast<long long>(d.records()),
      d.records() == 1 ? "" : "s", static_cast<long long>(d.tokens()),
      static_cast<long long>(d.loss_tokens()), static_cast<long long>(d.truncated()), d.seq_len(),
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
    if (!s.device().empty() && s.device() != last.device()) {
      std::printf("%straining on %s\n", tty ? "\r\033[K" : "", s.device().c_str());
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
    const bool adapter =
        access((s.output_dir() + "/adapter/adapter_config.json").c_str(), R_OK) == 0;
    std::printf(
        "output: %s (report.html, summary.json, metrics.jsonl, events.out.tfevents.* "
        "for tensorboard --logdir, model.safetensors, config.json, tokenizer.json%s)\n",
        s.output_dir().c_str(), adapter ? ", adapter/ for PEFT" : "");
  } else if (IsFinished(s.state()) && !s.output_dir().empty()) {
    // A failed or cancelled job has no model, but its report and logs up to the end.
    std::printf("output: %s (report.html with the outcome, metrics.jsonl up to the end)\n",
                s.output_dir().c_str());
  }
  return s.state() == lspo::v1::SUCCEEDED ? 0 : 1;
}

}  // namespace

namespace {
std::vector<std::string>& SpecOverrides() {
  static auto* overrides = new std::vector<std::string>();
  return *overrides;
}
}  // namespace

void SetSpecOverrides(std::vector<std::string> overrides) {
  SpecOverrides() = std::move(overrides);
}

absl::StatusOr<lspo::v1::JobSpec> SpecFromFlags() {
  const std::string path = absl::GetFlag(FLAGS_spec);
  if (path.empty()) {
    return absl::InvalidArgumentError("--spec=FILE is required (see examples/)");
  }
  auto spec = lspo::spec::LoadJobSpecFile(path, SpecOverrides());
  if (!spec.ok()) return spec.status();
  if (absl::GetFlag(FLAGS_steps) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps=", absl::GetFlag(FLAGS_steps), " must be >= 1 (0 keeps the spec)"));
  }
  if (absl::GetFlag(FLAGS_steps) > 0) {
    spec->set_steps(absl::GetFlag(FLAGS_steps));
    spec->clear_epochs();  // The command line's length replaces the spec's.
  }
  // Case and a MODE_ prefix do not matter (--mode=GALORE, --mode=MODE_ZERO), nor - vs _.
  if (const std::string mode = absl::GetFlag(FLAGS_mode); !mode.empty()) {
    absl::StatusOr<const lspo::offload::ModeDescriptor*> m = lspo::offload::ModeByName(mode);
    if (!m.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--mode=", mode, " is not a mode: use ", lspo::offload::ModeNames()));
    }
    // The spec's settings of another mode would be refused with the new mode: the flag says
    // which mode to run, so they are dropped (with a note), as the lsp section is unused.
    for (const std::string& block : lspo::offload::DropOtherModesSettings(**m, &*spec)) {
      std::fprintf(stderr, "lspctl: --mode=%s: the spec's %s settings are not used\n", mode.c_str(),
                   block.c_str());
    }
    spec->set_mode((*m)->mode);
    if (spec->has_galore()) spec->mutable_galore()->clear_offload();  // the mode says it
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
  if (absl::GetFlag(FLAGS_rank) >= 0)
    spec->mutable_distributed()->set_rank(absl::GetFlag(FLAGS_rank));
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

int PrintSpec() {
  absl::StatusOr<lspo::v1::JobSpec> spec = SpecFromFlags();
  if (!spec.ok()) {
    std::fprintf(stderr, "lspctl: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  std::printf("%s\n", lspo::spec::JobSpecToJson(*spec).c_str());
  return 0;
}

namespace {

// The run header: the job's mode, schedule and settings; with `in_process` (lspctl run, where
// this process trains) also the CPU BLAS and its kernel set (runtime/cpu_blas.h), with its
// warning if a generic kernel set runs on an AVX2-or-better CPU.
void PrintChoice(const lspo::v1::JobSpec& in, bool in_process) {
  lspo::v1::JobSpec spec = in;
  lspo::spec::ResolveDefaults(&spec);
  const lspo::offload::ModeDescriptor& mode = lspo::offload::ModeOf(spec);
  const bool on_worker = !mode.offloaded();
  // The mode's own settings.
  const std::string method = mode.describe != nullptr ? mode.describe(spec) + ", " : "";
  std::printf(
      "LSP-Offload job '%s': mode %s (%s), %s%s, micro-batch %s x %d "
      "accum, seq_len %d, lr %g (%s, warm-up %s), %d threads\n",
      spec.name().c_str(), std::string(mode.name).c_str(),
      on_worker ? "no offload"
                : absl::StrCat(lspo::runtime::EnumShortName(spec.schedule()), " schedule",
                               spec.distributed().world_size() > 1 ? ", data parallel" : "")
                      .c_str(),
      method.c_str(),
      (spec.epochs() > 0
           ? absl::StrCat(spec.epochs(), " epochs (steps counted once the data is read)")
           : absl::StrCat("steps=", spec.steps()))
          .c_str(),
      spec.has_micro_batch_size() ? absl::StrCat(spec.micro_batch_size()).c_str()
                                  : "auto (8 on the CPU; a GPU worker takes the largest that fits)",
      spec.grad_accum(), spec.seq_len(), spec.optim().lr(),
      lspo::runtime::EnumShortName(spec.optim().schedule()).c_str(),
      (spec.optim().warmup_ratio() > 0 ? absl::StrCat(spec.optim().warmup_ratio(), " of the steps")
                                       : absl::StrCat(spec.optim().warmup_steps()))
          .c_str(),
      spec.num_threads());
  if (spec.distributed().world_size() > 1) {
    const auto& d = spec.distributed();
    std::printf("  data parallel: rank %d of %d, rendezvous %s, %d examples per step\n", d.rank(),
                d.world_size(), d.rendezvous().empty() ? "127.0.0.1:29500" : d.rendezvous().c_str(),
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
  if (spec.ok() && in_process) {
    // lspctl run: the checks the scheduler makes, before the run header (a remote scheduler
    // makes them itself: the spec's paths are its).
    lspo::v1::JobSpec resolved = *spec;
    lspo::spec::ResolveDefaults(&resolved);
    if (absl::Status valid = lspo::spec::ValidateJobSpec(resolved); !valid.ok()) spec = valid;
  }
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

}  // namespace

std::string ToJsonString(const google::protobuf::Message& m) {
  return lspo::runtime::ProtoToJson(m, lspo::runtime::ProtoJsonPrint::Pretty());
}

namespace {

void PrintRow(const JobStatus& s) {
  std::printf("%-24s %-13s %5d/%-5d %-10s %s\n", s.job_id().c_str(), StateName(s.state()).c_str(),
              s.step(), s.total_steps(),
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
    std::printf(
        "%s: %s, cancel requested (it stops after its current step or evaluation "
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

}  // namespace

void InstallInterruptHandling() { InterruptCanceller::Install(); }

int RunEmbedded() {
  // The progress bar and evaluation lines are the default output; --verbose adds the
  // services' INFO logs (projector fits, per-step timings).
  FLAGS_minloglevel = absl::GetFlag(FLAGS_verbose) ? 0 : 1;
  lspo::worker::WorkerOptions worker;
  worker.skip_memory_check = absl::GetFlag(FLAGS_skip_memory_check);
  auto runtime = lspo::client::EmbeddedRuntime::Start({}, std::move(worker));
  if (!runtime.ok()) return Fail(runtime.status());
  auto stub = lspo::v1::Scheduler::NewStub((*runtime)->scheduler_channel());
  return Submit(stub.get(), /*watch=*/true, /*cancel_on_signal=*/true, /*in_process=*/true);
}

int RunJobCommand(const std::string& cmd, const std::string& arg) {
  // health checks any service: --address names it (--scheduler still works, as before).
  const std::string address = cmd == "health" && !absl::GetFlag(FLAGS_address).empty()
                                  ? absl::GetFlag(FLAGS_address)
                                  : absl::GetFlag(FLAGS_scheduler);
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
               "metrics, generate, eval, convert, export, plan, spec; --help)\n",
               cmd.c_str());
  return 2;
}

}  // namespace lspo::lspctl
