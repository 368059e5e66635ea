// lspctl's commands on a model without a job (lspctl_commands.h): plan, convert, generate,
// eval (client/model_tools.h does the work; this file reads the flags and prints).
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

bool IsModelCommand(const std::string& cmd) {
  return cmd == "plan" || cmd == "convert" || cmd == "export" || cmd == "generate" || cmd == "eval";
}

namespace {

// lspctl plan: the memory plan of the spec from the flags.
int RunPlanCommand() {
  FLAGS_minloglevel = absl::GetFlag(FLAGS_verbose) ? 0 : 1;
  // A bad spec or flag is exit status 2, as for run and submit; other failures 1.
  auto spec = SpecFromFlags();
  if (!spec.ok()) {
    Fail(spec.status());
    return 2;
  }
  lspo::client::PlanCommand p;
  p.spec = *spec;
  p.device = absl::GetFlag(FLAGS_device);
  const double gb = absl::GetFlag(FLAGS_device_memory_gb);
  const double gib = absl::GetFlag(FLAGS_device_memory_gib);
  if (gb != 0 && gib != 0 && gb != gib) {
    std::fprintf(stderr,
                 "lspctl plan: --device_memory_gb=%g and --device_memory_gib=%g disagree (both "
                 "are GiB); give one\n",
                 gb, gib);
    return 2;
  }
  p.device_memory_gb = gib != 0 ? gib : gb;
  absl::Status st = lspo::client::RunPlan(p, stdout);
  if (st.ok()) return 0;
  Fail(st);
  return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// lspctl export: an HF folder written as a GGUF file.
int RunExportCommand() {
  FLAGS_minloglevel = absl::GetFlag(FLAGS_verbose) ? 0 : 1;
  lspo::client::ExportCommand x;
  x.model = absl::GetFlag(FLAGS_model);
  x.format = absl::GetFlag(FLAGS_format);
  x.outtype = absl::GetFlag(FLAGS_outtype);
  x.outfile = absl::GetFlag(FLAGS_outfile);
  auto r = lspo::client::RunExport(x);
  if (!r.ok()) {
    Fail(r.status());
    return r.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  for (const std::string& note : r->notes) std::printf("note: %s\n", note.c_str());
  std::printf("wrote %s: %lld tensors, matrices %s, tokenizer pre %s, %.1f MiB\n", r->path.c_str(),
              static_cast<long long>(r->num_tensors),
              std::string(lspo::model::GgmlTypeName(r->matrix_type)).c_str(),
              r->tokenizer_pre.c_str(), static_cast<double>(r->file_bytes) / (1024.0 * 1024.0));
  return 0;
}

}  // namespace

int RunModelCommand(const std::string& cmd) {
  if (cmd == "plan") return RunPlanCommand();

  if (cmd == "convert") {
    if (absl::GetFlag(FLAGS_model).empty() || absl::GetFlag(FLAGS_output_dir).empty()) {
      std::fprintf(stderr,
                   "lspctl convert: give --model=FILE.gguf and --output_dir=DIR (a new "
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

  if (cmd == "export") return RunExportCommand();

  if (cmd == "generate" || cmd == "eval") {
    if (absl::GetFlag(FLAGS_model).empty()) {
      std::fprintf(stderr, "lspctl %s: give --model=DIR|FILE (an HF folder or a GGUF file)\n",
                   cmd.c_str());
      return 2;
    }
    FLAGS_minloglevel = absl::GetFlag(FLAGS_verbose) ? 0 : 1;
    if (cmd == "generate") {
      if (absl::GetFlag(FLAGS_prompt).empty() == absl::GetFlag(FLAGS_chat).empty()) {
        std::fprintf(stderr,
                     "lspctl generate: give exactly one of --prompt=TEXT and "
                     "--chat=FILE.jsonl\n");
        return 2;
      }
      if (!absl::GetFlag(FLAGS_chat_template).empty() && absl::GetFlag(FLAGS_chat).empty()) {
        std::fprintf(stderr,
                     "lspctl generate: --chat_template applies to --chat conversations; "
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
        (!format.empty() && format != "classification" && format != "text" && format != "alpaca" &&
         format != "chat" && format != "prompt_completion")) {
      std::fprintf(stderr,
                   "lspctl eval: give --data=FILE and, optionally, "
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
        std::printf("%d examples, accuracy %.4f, answer loss %.6f", m->examples(), m->accuracy(),
                    m->loss());
      }
      if (m->perplexity() > 0) {
        std::printf(", perplexity of %s %.4f (%lld tokens)", e.perplexity_path.c_str(),
                    m->perplexity(), static_cast<long long>(m->perplexity_tokens()));
      }
      std::printf(" (%.1f s)\n", m->seconds());
    }
    return 0;
  }
  return 2;
}

}  // namespace lspo::lspctl
