#include "gpu_worker/worker_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "third_party/torch/torch_api.h"

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "data/datasets.h"
#include "data/sft.h"
#include "glog/logging.h"
#include "gpu_worker/calibration.h"
#include "gpu_worker/device_offload.h"
#include "gpu_worker/evaluator.h"
#include "gpu_worker/lsp_path.h"
#include "gpu_worker/update_path.h"
#include "gpu_worker/worker_job.h"
#include "gpu_worker/worker_state.h"
#include "lsp/projector.h"
#include "offload/arena_tensors.h"
#include "offload/collective.h"
#include "offload/hf_export.h"
#include "offload/job_assets.h"
#include "offload/memory_plan.h"
#include "offload/spec_paths.h"
#include "offload/torch_call.h"
#include "runtime/clock.h"
#include "runtime/cuda/device_runtime.h"
#include "runtime/file_io.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"
#include "runtime/tfrecord.h"
#include "runtime/util.h"
#include "tbb/global_control.h"

namespace lspo::worker {

using lspo::v1::JobSpec;
using runtime::MonotonicSeconds;

namespace {

void AddEvent(WorkerJob* job, int64_t layer, const char* what, double start, double end) {
  lspo::v1::LayerEvent e;
  e.set_layer(static_cast<int32_t>(layer));
  e.set_what(what);
  e.set_start(start);
  e.set_end(end);
  e.set_actor("worker");
  job->events.push_back(std::move(e));
}

}  // namespace

absl::Status ApplyPending(WorkerJob* job, int64_t layer) {
  const int64_t lo = layer < 0 ? 0 : layer * model::kLinearsPerLayer;
  const int64_t hi = layer < 0 ? static_cast<int64_t>(job->pending_step.size())
                               : lo + model::kLinearsPerLayer;
  const double t0 = MonotonicSeconds(), waited0 = job->wait_seconds;
  bool any = false;
  for (int64_t i = lo; i < hi; ++i) {
    if (job->pending_step[i] == 0) continue;
    any = true;
    RETURN_IF_ERROR(job->path->ApplyUpdate(job, i, job->pending_step[i], job->pending_decay[i]));
    job->pending_step[i] = 0;
  }
  if (any && layer >= 0) {
    const double waited = job->wait_seconds - waited0;
    if (waited > 0) AddEvent(job, layer, "wait", t0, t0 + waited);
    AddEvent(job, layer, "apply", t0 + waited, MonotonicSeconds());
  }
  return absl::OkStatus();
}

std::string NormalizedToken(const model::BpeTokenizer& tok, int64_t id) {
  const int32_t one = static_cast<int32_t>(id);
  return absl::AsciiStrToLower(absl::StripAsciiWhitespace(tok.Decode(absl::MakeConstSpan(&one, 1))));
}

at::Tensor ToTensor(const std::vector<int64_t>& v, int64_t rows, int64_t cols,
                    const at::Device& device) {
  at::Tensor t = at::from_blob(const_cast<int64_t*>(v.data()), {rows, cols},
                               at::TensorOptions().dtype(at::kLong));
  // Device: through pinned memory, asynchronously (a pageable copy would wait for the queue).
  return device.is_cpu() ? t.clone() : t.pin_memory().to(device, /*non_blocking=*/true);
}

model::RowLayout LayoutOf(const data::Batch& batch, const at::Device& device) {
  model::RowLayout layout;
  if (!batch.packed()) return layout;
  layout.positions = ToTensor(batch.positions, batch.batch_size, batch.seq_len, device);
  layout.segment_ids = ToTensor(batch.segment_ids, batch.batch_size, batch.seq_len, device);
  return layout;
}

namespace {

// The proto form of a data summary (proto/metrics.proto DataSummary).
lspo::v1::DataSummary SummaryProto(const std::string& split, const std::string& path,
                                   absl::string_view format, int seq_len,
                                   const data::DataSummary& s) {
  lspo::v1::DataSummary p;
  p.set_split(split);
  p.set_path(path);
  p.set_format(std::string(format));
  p.set_records(s.records);
  p.set_examples(s.examples);
  p.set_tokens(s.tokens);
  p.set_loss_tokens(s.loss_tokens);
  p.set_truncated(s.truncated);
  p.set_skipped(s.skipped);
  p.set_longest(s.longest);
  p.set_seq_len(seq_len);
  p.set_rendered_example(s.rendered_example);
  return p;
}

// Tokenised examples of `path` (the `split`, "train" or "eval") and what loading them did in
// `*summary` (also logged; nothing when null); for classification data also each example's label id (labels
// numbered in order of first appearance) in `*class_of` when non-null.
absl::StatusOr<std::vector<data::TokenizedExample>> LoadExamples(
    const JobSpec& spec, const model::BpeTokenizer& tok, const std::string& split,
    const std::string& path, int max, lspo::v1::DataSummary* summary,
    std::vector<int32_t>* class_of = nullptr) {
  std::vector<data::TokenizedExample> out;
  data::DataSummary counts;
  std::string format_name =
      spec.data().format() == lspo::v1::DATA_FORMAT_CLASSIFICATION ? "classification" : "text";
  if (spec.data().format() == lspo::v1::DATA_FORMAT_CLASSIFICATION) {
    ASSIGN_OR_RETURN(auto rows, data::LoadLabeled(path));
    counts.records = static_cast<int64_t>(rows.size());
    auto tmpl = model::ChatTemplate::ForTokenizer(tok, spec.data().chat_template());
    if (!tmpl.ok()) {
      return absl::Status(tmpl.status().code(),
                          absl::StrCat("classification data: ", tmpl.status().message()));
    }
    std::map<std::string, int32_t> label_ids;
    for (const auto& row : rows) {
      if (max > 0 && static_cast<int>(out.size()) >= max) break;
      if (class_of != nullptr) {
        auto it = label_ids.emplace(row.label, static_cast<int32_t>(label_ids.size())).first;
        class_of->push_back(it->second);
      }
      bool cut = false;
      int64_t full = 0;
      ASSIGN_OR_RETURN(auto ex, data::BuildClassificationChat(tok, *tmpl, row.text, row.label,
                                                              spec.data().question(),
                                                              spec.data().system_prompt(),
                                                              spec.seq_len(), &cut, &full));
      data::CountExample(tok, ex, cut, full, &counts);
      out.push_back(std::move(ex));
    }
  } else if (spec.data().format() == lspo::v1::DATA_FORMAT_ALPACA ||
             spec.data().format() == lspo::v1::DATA_FORMAT_CHAT ||
             spec.data().format() == lspo::v1::DATA_FORMAT_PROMPT_COMPLETION) {
    const data::SftFormat format =
        spec.data().format() == lspo::v1::DATA_FORMAT_ALPACA ? data::SftFormat::kAlpaca
        : spec.data().format() == lspo::v1::DATA_FORMAT_CHAT ? data::SftFormat::kChat
                                                             : data::SftFormat::kPromptCompletion;
    format_name = std::string(data::SftFormatName(format));
    // Plain prompt-completion text needs no template; conversations need one (the records
    // that need it say so).
    auto tmpl = model::ChatTemplate::ForTokenizer(tok, spec.data().chat_template());
    if (!tmpl.ok() && (format != data::SftFormat::kPromptCompletion ||
                       tmpl.status().code() != absl::StatusCode::kFailedPrecondition)) {
      return absl::Status(tmpl.status().code(),
                          absl::StrCat(data::SftFormatName(format), " data: ",
                                       tmpl.status().message()));
    }
    ASSIGN_OR_RETURN(out, data::LoadSftExamples(path, &format, tok, tmpl.ok() ? &*tmpl : nullptr,
                                                spec.seq_len(), max, &counts));
  } else {
    ASSIGN_OR_RETURN(auto blocks, data::PackTextBlocks(tok, path, spec.seq_len(),
                                                       spec.data().max_blocks()));
    counts.records = static_cast<int64_t>(blocks.size());
    for (auto& b : blocks) {
      if (max > 0 && static_cast<int>(out.size()) >= max) break;
      data::TokenizedExample ex;
      ex.labels.assign(b.begin(), b.end());
      ex.input_ids = std::move(b);
      ex.answer_start = 0;
      data::CountExample(tok, ex, false, static_cast<int64_t>(ex.input_ids.size()), &counts);
      out.push_back(std::move(ex));
    }
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("data file '", path,
                                                   "' produced no examples: check its format"));
  }
  counts.examples = static_cast<int64_t>(out.size());
  if (summary != nullptr) {
    LOG(INFO) << "worker: " << split << " "
              << data::FormatDataSummary(path, format_name, spec.seq_len(), counts);
    *summary = SummaryProto(split, path, format_name, spec.seq_len(), counts);
  }
  return out;
}

// The device of a job: CUDA when asked for (and present) or, with the field empty, when
// LibTorch sees one. Errors: kFailedPrecondition (cuda asked, none visible), kInvalidArgument
// (another value).
absl::StatusOr<bool> UseCuda(const JobSpec& spec) {
  if (spec.device() == lspo::v1::DEVICE_CUDA && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        "job spec field device = cuda, but this worker's LibTorch sees no CUDA device: use "
        "device: cpu, or build against a CUDA LibTorch on a GPU host (docs/gpu.md)");
  }
  if (!lspo::v1::Device_IsValid(spec.device())) {
    return absl::InvalidArgumentError(absl::StrCat("job spec field device = ", spec.device(),
                                                   ": use cpu, cuda or leave it empty"));
  }
  return spec.device() == lspo::v1::DEVICE_CUDA ||
         (spec.device() == lspo::v1::DEVICE_UNSPECIFIED && torch::cuda::is_available());
}

// Physical memory of this host (MemTotal of /proc/meminfo), bytes; 0 when unreadable.
int64_t HostMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") return kb * 1024;
  }
  return 0;
}

// The memory check before a job's weights are read (issue 18): the job's memory plan
// (offload/memory_plan.h, from the model's config alone) against the device it runs on: on
// CUDA the cap device_memory_limit_mb, else the GPU's memory less the CUDA context
// (kCudaContextBytes); on the CPU the host's physical memory. LSPO_SKIP_MEMORY_CHECK=1 skips
// it (for a plan that overestimates a job known to fit). Before the check, settings the spec
// left unset are chosen to fit (offload::ChooseFittingDefaults, CUDA only): *spec_in is changed
// and one line per choice appended to *chosen.
// Errors: kResourceExhausted naming the mode's peak, its largest terms, the budget, the largest
// micro-batch (with and without activation checkpointing) and lsp d that fit, and the lspctl
// command that prints the whole plan. A model config or spec the planner cannot read passes
// (the loaders report it, naming the file or field).
absl::Status CheckJobFitsDevice(JobSpec* spec_in, bool cuda, std::vector<std::string>* chosen) {
  if (const char* skip = std::getenv("LSPO_SKIP_MEMORY_CHECK"); skip && std::string(skip) == "1") {
    LOG(WARNING) << "worker: LSPO_SKIP_MEMORY_CHECK=1: the job's memory plan is not checked";
    return absl::OkStatus();
  }
  const JobSpec& spec = *spec_in;
  // A config or a setting the planner cannot use is left to the loaders and the update paths,
  // whose errors name the file or the field.
  absl::StatusOr<model::LlamaConfig> config = offload::LoadJobModelConfig(spec);
  if (!config.ok()) return absl::OkStatus();
  const offload::PlanMode mode = offload::PlanModeOf(spec);
  absl::StatusOr<offload::MemoryPlan> planned = offload::PlanJobMemory(spec, *config, mode, cuda);
  if (!planned.ok()) return absl::OkStatus();
  int64_t budget = 0;
  std::string what;
  if (cuda && spec.device_memory_limit_mb() > 0) {
    budget = static_cast<int64_t>(spec.device_memory_limit_mb()) << 20;
    what = absl::StrCat("the job's device_memory_limit_mb = ", spec.device_memory_limit_mb());
  } else if (cuda) {
    absl::StatusOr<runtime::cuda::MemoryInfo> info = runtime::cuda::GetMemoryInfo();
    if (!info.ok()) {
      LOG(WARNING) << "worker: memory check skipped, the GPU's memory cannot be read: "
                   << info.status().message();
      return absl::OkStatus();
    }
    budget = static_cast<int64_t>(info->total_bytes) - offload::kCudaContextBytes;
    what = absl::StrFormat("this GPU's %.2f GiB less %.2f GiB of CUDA context",
                           info->total_bytes / double(1LL << 30),
                           offload::kCudaContextBytes / double(1LL << 30));
  } else {
    budget = HostMemoryBytes();
    what = "this host's physical memory";
    if (budget <= 0) return absl::OkStatus();
  }
  // Settings the spec left unset, chosen to fit (issue 42): then the plan of the chosen ones.
  absl::StatusOr<std::vector<std::string>> choice =
      offload::ChooseFittingDefaults(spec_in, *config, mode, cuda, budget);
  if (choice.ok() && !choice->empty()) {
    for (const std::string& line : *choice) {
      LOG(INFO) << "worker: " << line;
      chosen->push_back(line);
    }
    planned = offload::PlanJobMemory(spec, *config, mode, cuda);
    if (!planned.ok()) return absl::OkStatus();
  }
  const offload::MemoryPlan& plan = *planned;
  constexpr double kGiB = 1LL << 30;
  const int64_t need = cuda ? plan.device_peak : plan.device_peak + plan.arena;
  LOG(INFO) << absl::StrFormat("worker: memory plan of this %s job: %.2f GiB (%s) of %.2f GiB",
                               offload::PlanModeName(mode), need / kGiB, cuda ? "GPU" : "host",
                               budget / kGiB);
  if (need <= budget) return absl::OkStatus();
  ASSIGN_OR_RETURN(offload::FitAnswer fit, offload::FitOnDevice(spec, *config, mode, cuda, budget));
  std::vector<offload::PlanTerm> terms = plan.device_static;
  terms.push_back(
      {plan.checkpointing ? "activations (checkpointed)" : "activations", plan.activations});
  std::sort(terms.begin(), terms.end(),
            [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  std::vector<std::string> largest;
  for (size_t i = 0; i < terms.size() && i < 3; ++i) {
    largest.push_back(absl::StrFormat("%s %.2f GiB", terms[i].name, terms[i].bytes / kGiB));
  }
  std::string advice = fit.largest_micro_batch > 0
                           ? absl::StrCat("micro_batch_size ", fit.largest_micro_batch, " fits")
                           : "no micro-batch fits at this seq_len";
  if (!spec.activation_checkpointing() && fit.largest_micro_batch_checkpointing > 0) {
    absl::StrAppend(&advice, "; with activation_checkpointing: true micro_batch_size ",
                    fit.largest_micro_batch_checkpointing, " fits");
  }
  if (mode == offload::PlanMode::kLsp && fit.largest_d > 0) {
    absl::StrAppend(&advice, "; lsp.d ", fit.largest_d, " fits at this micro-batch");
  }
  if (fit.fits_with_nearest_rounding) {
    absl::StrAppend(&advice, "; the job fits with lsp.apply_rounding: stochastic or nearest (no residuals)");
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the job will not fit: its memory plan in mode %s needs %.2f GiB of %s memory (%s, ...) "
      "but %s leaves %.2f GiB: %s. `lspctl plan --spec=FILE --device=%s "
      "--device_memory_gb=%.0f` prints the whole plan; LSPO_SKIP_MEMORY_CHECK=1 in the worker's "
      "environment runs it anyway",
      offload::PlanModeName(mode), need / kGiB, cuda ? "GPU" : "host", absl::StrJoin(largest, ", "),
      what, budget / kGiB, advice, cuda ? "cuda" : "cpu", std::ceil(budget / kGiB)));
}

// What every rank of a data-parallel job must share: the spec without the fields a rank may
// set for itself (rank, bind address, timeout, output_dir and resume_from, threads, the device
// memory cap, the job's name), as JSON, so a mismatch can be told field by field. (That the
// ranks resume from the same step is checked at every step instead.)
JobSpec SharedSpec(const JobSpec& spec) {
  JobSpec shared = spec;
  shared.mutable_distributed()->clear_rank();
  shared.mutable_distributed()->clear_bind_address();
  shared.mutable_distributed()->clear_timeout_seconds();
  shared.mutable_distributed()->clear_rendezvous_token_file();  // a path on each rank's host
  shared.clear_output_dir();
  shared.clear_resume_from();
  shared.clear_num_threads();
  shared.clear_device_memory_limit_mb();
  shared.clear_name();
  return shared;
}

// "the job spec differs: modified: lsp.d: 64 -> 128" for two SharedSpec JSONs.
std::string ExplainSpecMismatch(const std::string& rank0, const std::string& other) {
  JobSpec a, b;
  if (!runtime::ProtoFromJson(rank0, &a, "rank 0's spec").ok() ||
      !runtime::ProtoFromJson(other, &b, "the rank's spec").ok()) {
    return "the job specs differ (one could not be read back)";
  }
  return absl::StrCat("the job spec differs (rank 0 -> this rank): ",
                      runtime::ProtoDifferences(a, b, 600));
}

// distributed.timeout_seconds with its default (0 = 300 s): the bound on joining the group and
// on every collective.
int RankTimeoutSeconds(const lspo::v1::DistributedSpec& d) {
  return d.timeout_seconds() > 0 ? d.timeout_seconds() : 300;
}

// Joins the job's group of ranks (docs/distributed.md). Errors: offload::Collective::Join's,
// and kInvalidArgument for a malformed distributed.rendezvous.
absl::StatusOr<std::unique_ptr<offload::Collective>> JoinGroup(const JobSpec& spec) {
  const lspo::v1::DistributedSpec& d = spec.distributed();
  offload::CollectiveOptions o;
  o.rank = d.rank();
  o.world_size = d.world_size();
  ASSIGN_OR_RETURN(runtime::HostPort at,
                   runtime::ParseHostPort(d.rendezvous().empty() ? "127.0.0.1:29500"
                                                                 : d.rendezvous(),
                                          "job spec field distributed.rendezvous"));
  o.host = at.host;
  o.port = at.port;
  if (!d.bind_address().empty()) o.bind_address = d.bind_address();
  o.secret_file = d.rendezvous_token_file();
  o.allow_remote = d.allow_remote();
  o.timeout = absl::Seconds(RankTimeoutSeconds(d));
  o.fingerprint = runtime::ProtoToJson(SharedSpec(spec));
  o.explain_mismatch = ExplainSpecMismatch;
  if (!spec.output_dir().empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    std::error_code ec;
    o.exclusive = absl::StrCat("the output directory ", host, ":",
                               std::filesystem::absolute(spec.output_dir(), ec).lexically_normal().string());
  }
  return offload::Collective::Join(o);
}

// CRC-32C of the model's weights as loaded: every tensor's name, dtype, shape and its first,
// middle and last 4 KiB (a different model or checkpoint differs there; reading every byte of
// a 7B model would take seconds per rank).
uint32_t ModelChecksum(const model::LlamaModel& model) {
  uint32_t crc = 0;
  for (const auto& [name, tensor] : model.NamedTensors()) {
    const std::string meta = absl::StrCat(name, ":", c10::toString(tensor.scalar_type()), "(",
                                          absl::StrJoin(tensor.sizes(), ","), ")");
    crc = runtime::Crc32cExtend(crc, meta);
    crc = offload::Crc32cExtendTensor(crc, tensor, /*sample_bytes=*/4096);
  }
  return crc;
}

// CRC-32C of the tokenized training examples (ids and labels, in file order).
uint32_t TrainDataChecksum(const WorkerJob& job) {
  uint32_t crc = 0;
  for (const data::TokenizedExample& e : job.train) {
    crc = runtime::Crc32cExtend(
        crc, absl::string_view(reinterpret_cast<const char*>(e.input_ids.data()),
                               e.input_ids.size() * sizeof(int32_t)));
    crc = runtime::Crc32cExtend(
        crc, absl::string_view(reinterpret_cast<const char*>(e.labels.data()),
                               e.labels.size() * sizeof(int32_t)));
  }
  return crc;
}

// Data parallel: every rank loaded the same model weights and training data (the spec names
// the same paths; the files behind them may still differ between hosts). Errors:
// kFailedPrecondition naming the rank, its host and the spec field; the collective's errors.
absl::Status CheckRanksLoadedTheSame(const WorkerJob& job) {
  offload::Collective* group = job.collective.get();
  const struct {
    uint32_t crc;
    const char* what;
    std::string field;
  } checks[] = {
      {ModelChecksum(*job.model), "model weights",
       absl::StrCat("model.path '", job.spec.model().path(), "'")},
      {TrainDataChecksum(job), "tokenized training data",
       absl::StrCat("data.train_path '", job.spec.data().train_path(), "'")},
  };
  for (const auto& c : checks) {
    ASSIGN_OR_RETURN(std::vector<int64_t> all, group->AllGather(c.crc));
    for (size_t r = 1; r < all.size(); ++r) {
      if (all[r] != all[0]) {
        return absl::FailedPreconditionError(absl::StrCat(
            "distributed: rank ", r, " (", group->labels()[r], ") loaded other ", c.what,
            " than rank 0 (", group->labels()[0], ") from ", c.field,
            ": give every rank the same files (compare them with sha256sum)"));
      }
    }
  }
  return absl::OkStatus();
}

// The tokenizer, the model and the data of `job->spec`. Errors: those of the readers, naming
// the file.
absl::Status LoadAssets(WorkerJob* job) {
  const JobSpec& spec = job->spec;
  ASSIGN_OR_RETURN(auto tok, offload::LoadJobTokenizer(spec));
  job->tokenizer = std::make_unique<model::BpeTokenizer>(std::move(tok));
  ASSIGN_OR_RETURN(auto m, offload::LoadJobModel(spec));
  job->model = std::make_unique<model::LlamaModel>(std::move(m));
  RETURN_IF_ERROR(offload::CheckTokenizerFitsModel(*job->tokenizer, job->model->config(), spec));
  if (spec.seq_len() > job->model->config().max_position_embeddings) {
    LOG(WARNING) << "seq_len " << spec.seq_len() << " exceeds the model's "
                 << "max_position_embeddings " << job->model->config().max_position_embeddings
                 << " (" << spec.model().path()
                 << "): RoPE extrapolates past the trained context";
  }
  ASSIGN_OR_RETURN(job->train, LoadExamples(spec, *job->tokenizer, "train",
                                            spec.data().train_path(),
                                            spec.data().max_train_examples(), &job->train_data,
                                            &job->train_class));
  if (spec.data().packing()) {
    // Several examples per row (data/datasets.h PackExamples); the rows are what the epoch
    // order shuffles and the calibration draws from.
    job->train = data::PackExamples(job->train, spec.seq_len());
    job->train_data.set_packed_rows(static_cast<int64_t>(job->train.size()));
    job->train_class.clear();
  }
  if (!spec.data().eval_path().empty()) {
    ASSIGN_OR_RETURN(job->eval, LoadExamples(spec, *job->tokenizer, "eval",
                                             spec.data().eval_path(),
                                             spec.data().max_eval_examples(), &job->eval_data));
  }
  if (spec.eval().metric() == lspo::v1::EVAL_METRIC_GENERATIVE && !job->eval.empty()) {
    // Generation is scored against the whole answer, not the one cut to seq_len: the
    // evaluation examples again, untruncated.
    JobSpec whole = spec;
    whole.set_seq_len(std::numeric_limits<int32_t>::max());
    int max = spec.data().max_eval_examples();
    if (spec.eval().max_generate_examples() > 0 &&
        (max <= 0 || spec.eval().max_generate_examples() < max)) {
      max = spec.eval().max_generate_examples();
    }
    ASSIGN_OR_RETURN(job->generate, LoadExamples(whole, *job->tokenizer, "generate",
                                                 spec.data().eval_path(), max, nullptr));
  }
  if (!spec.data().perplexity_path().empty()) {
    ASSIGN_OR_RETURN(job->ppl_blocks,
                     data::PackTextBlocks(*job->tokenizer, spec.data().perplexity_path(),
                                          spec.seq_len(),
                                          spec.data().perplexity_blocks() > 0
                                              ? spec.data().perplexity_blocks()
                                              : 32));
  }
  return absl::OkStatus();
}

// The layer hooks: a layer's pending update lands just before its forward (overlap
// schedule), and every layer's forward / backward goes into the step's timeline (and, on
// CUDA, the transfer engine's stream order).
// kCancelled when the scheduler abandoned the running step (WorkerJob::stop_step): the layer
// hooks stop the pass at layer `l`'s boundary.
absl::Status CheckStop(const WorkerJob* job, int64_t l, const char* where) {
  const uint32_t stop = job->stop_step->load(std::memory_order_acquire);
  if (stop == 0 || stop != job->step) return absl::OkStatus();
  return absl::CancelledError(absl::StrCat("step ", job->step, " stopped ", where, " layer ", l,
                                           ": the scheduler abandoned it (AbortStep: a cancel "
                                           "or a failed peer)"));
}

void InstallLayerHooks(WorkerJob* job) {
  job->model->SetLayerHooks(
      [job](int64_t l) -> absl::Status {
        RETURN_IF_ERROR(CheckStop(job, l, "before the forward of"));
        RETURN_IF_ERROR(ApplyPending(job, l));
        job->layer_t0 = MonotonicSeconds();
        if (job->offload) job->offload->MarkComputeBegin(l, "forward");
        return absl::OkStatus();
      },
      [job](int64_t l) -> absl::Status {
        AddEvent(job, l, "forward", job->layer_t0, MonotonicSeconds());
        if (job->offload) job->offload->MarkComputeEnd(l, "forward");
        return absl::OkStatus();
      },
      [job](int64_t l) -> absl::Status {
        RETURN_IF_ERROR(CheckStop(job, l, "after the backward of"));
        const double now = MonotonicSeconds();
        AddEvent(job, l, "backward", job->layer_t0, now);
        job->layer_t0 = now;
        if (job->offload) {
          // Layer l's backward ends here and layer l - 1's begins (device stream order).
          job->offload->MarkComputeEnd(l, "backward");
          if (l > 0) job->offload->MarkComputeBegin(l - 1, "backward");
        }
        return absl::OkStatus();
      });
}

// A rank > 0 waits at the first collective of a step for rank 0, which evaluates alone after
// the evaluation steps (scheduler/job_runner.cc AfterStep: every eval_every steps, and before
// step 1 unless skip_initial_eval): when that wait failed, `st` gains that likely cause and
// its fix. Other statuses are returned as they are.
absl::Status AfterRankZerosEvaluation(const WorkerJob& job, int step, absl::Status st) {
  const JobSpec& spec = job.spec;
  const bool evaluates = !job.eval.empty() || !spec.data().perplexity_path().empty();
  const bool after_eval = step == 1 ? !spec.skip_initial_eval()
                                    : spec.eval_every() > 0 && (step - 1) % spec.eval_every() == 0;
  if (job.collective == nullptr || job.collective->rank() == 0 || !evaluates || !after_eval) {
    return st;
  }
  const int timeout = RankTimeoutSeconds(spec.distributed());
  return absl::Status(
      st.code(),
      absl::StrCat(st.message(), " [rank 0 evaluates alone before step ", step,
                   " while the other ranks wait here: if its evaluation takes longer than "
                   "distributed.timeout_seconds (",
                   timeout,
                   " s), raise that timeout or evaluate less (eval_every, "
                   "data.max_eval_examples, data.perplexity_blocks)]"));
}

// Step `step`'s micro-batches (grad_accum of micro_batch_size examples each, in the epoch's
// shuffled or class-balanced order); adds their loss tokens to *total, their input tokens
// (padding included) to *input_tokens and their padding to *padding_tokens.
std::vector<data::Batch> StepBatches(WorkerJob* job, int step, int64_t* total,
                                     int64_t* input_tokens, int64_t* padding_tokens) {
  const JobSpec& spec = job->spec;
  const bool balanced = spec.data().balance_classes() && !job->train_class.empty();
  // Epoch length: every example once, or (balanced) classes x largest class size.
  const int64_t n = balanced ? static_cast<int64_t>(
                                   data::BalancedOrder(job->train_class, spec.seed(), 0).size())
                             : static_cast<int64_t>(job->train.size());
  const int64_t mb = spec.micro_batch_size(), accum = spec.grad_accum();
  const int64_t world = job->collective ? job->collective->world_size() : 1;
  const int64_t rank = job->collective ? job->collective->rank() : 0;
  std::vector<data::Batch> batches;
  for (int64_t a = 0; a < accum; ++a) {
    std::vector<const data::TokenizedExample*> rows;
    for (int64_t b = 0; b < mb; ++b) {
      // Data parallel: rank r takes examples r*mb .. r*mb+mb-1 of each world*mb block, so W
      // ranks at micro-batch mb see what one rank sees at W*mb (docs/distributed.md).
      const int64_t g = ((step - 1) * accum + a) * mb * world + rank * mb + b;
      const int64_t epoch = g / n;
      if (epoch != job->order_epoch) {
        job->order = balanced ? data::BalancedOrder(job->train_class, spec.seed(), epoch)
                              : data::ShuffledOrder(n, spec.seed(), epoch);
        job->order_epoch = epoch;
      }
      rows.push_back(&job->train[job->order[g % n]]);
    }
    batches.push_back(data::MakeBatch(rows, job->tokenizer->pad_id()));
    *total += batches.back().num_loss_tokens;
    *input_tokens += batches.back().batch_size * batches.back().seq_len;
    *padding_tokens += batches.back().padding_tokens;
  }
  return batches;
}

// Forward and backward of every micro-batch of step `step` (the loss of each scaled by its
// share of the step's `total` loss tokens, so the gradients are the step's token mean). Under
// an offloaded overlap plan the last micro-batch's backward publishes the gradients as they
// form. Sets reply->nonfinite (returning OK) on a non-finite loss or gradient; otherwise the
// metrics loss, tokens, forward_seconds, backward_seconds. Errors: a failed layer hook's.
absl::Status RunMicroBatches(WorkerJob* job, const std::vector<data::Batch>& batches,
                             int64_t total, int step, const lspo::v1::StepPlan& plan,
                             lspo::v1::TrainStepReply* reply) {
  auto& model = *job->model;
  const int64_t num_layers = model.config().num_layers;
  // The last micro-batch that carries loss tokens publishes (overlap schedule).
  int64_t last = -1;
  for (size_t k = 0; k < batches.size(); ++k) {
    if (batches[k].num_loss_tokens > 0) last = static_cast<int64_t>(k);
  }
  // Data parallel under the overlap schedule: the publishing backward's gradients are summed
  // across the ranks as they form (UpdatePath::BeginRankSum). Every rank must take part in
  // those all-reduces, so a rank that will not run that backward (a non-finite loss, no loss
  // token) sends NaN instead, and every rank skips the step.
  offload::Collective* group = job->collective.get();
  const bool rank_sum =
      job->path->offloaded() && plan.overlap() && group != nullptr && group->world_size() > 1;
  struct DropReducer {  // An error return abandons the sum (the other ranks then time out).
    WorkerJob* job;
    ~DropReducer() { job->reducer.reset(); }
  } drop_reducer{job};
  auto skip_with_the_ranks = [&]() -> absl::Status {
    if (rank_sum) {
      RETURN_IF_ERROR(job->path->BeginRankSum(job, group, static_cast<uint32_t>(step)));
      RETURN_IF_ERROR(job->path->EndRankSum(job));
    }
    reply->set_nonfinite(true);
    return absl::OkStatus();
  };
  if (last < 0 && rank_sum) return skip_with_the_ranks();
  double loss_sum = 0, fwd = 0, bwd = 0;
  // CUDA: the losses are summed on the device and read once after the last backward (a
  // per-micro-batch .item() would stall the host until each forward finished). A non-finite
  // loss then shows up as non-finite gradients, caught on their host copies.
  at::Tensor device_loss_sum;
  for (int64_t k = 0; k < static_cast<int64_t>(batches.size()); ++k) {
    const auto& b = batches[k];
    const int64_t targets = b.num_loss_tokens;
    if (targets == 0) continue;
    auto t0 = std::chrono::steady_clock::now();
    at::Tensor loss = model.CausalLmLoss(ToTensor(b.input_ids, b.batch_size, b.seq_len, job->device),
                                         ToTensor(b.labels, b.batch_size, b.seq_len, job->device),
                                         LayoutOf(b, job->device));
    // A failed layer hook (e.g. a pending update that timed out) keeps its status code.
    RETURN_IF_ERROR(model.HookStatus());
    fwd += runtime::SecondsSince(t0);
    if (job->cuda) {
      at::Tensor weighted = loss.detach().to(at::kDouble) * static_cast<double>(targets);
      device_loss_sum = device_loss_sum.defined() ? device_loss_sum + weighted : weighted;
    } else {
      const double lv = loss.item<double>();
      if (!std::isfinite(lv)) return skip_with_the_ranks();
      loss_sum += lv * targets;
    }
    if (job->path->offloaded() && plan.overlap() && k == last) {
      job->publish_step = static_cast<uint32_t>(step);
      if (rank_sum) {
        RETURN_IF_ERROR(job->path->BeginRankSum(job, group, static_cast<uint32_t>(step)));
      }
    }
    t0 = std::chrono::steady_clock::now();
    job->layer_t0 = MonotonicSeconds();
    double scale = static_cast<double>(targets) / total;
    if (job->fault_nonfinite_grad_steps.count(step)) {
      scale = std::numeric_limits<double>::quiet_NaN();  // Fault injection (tests).
    }
    if (job->offload) job->offload->MarkComputeBegin(num_layers - 1, "backward");
    (loss * scale).backward();
    RETURN_IF_ERROR(model.HookStatus());
    if (job->publish_step > 0 && rank_sum) RETURN_IF_ERROR(job->path->EndRankSum(job));
    if (job->offload) {
      job->offload->MarkComputeEnd(0, "backward");
      // The step's gradients have been enqueued for offload: wait until every one has
      // landed and been checked (the host needs the verdict before applying anything).
      if (job->publish_step > 0) job->offload->Drain();
    }
    bwd += runtime::SecondsSince(t0);
    if (job->publish_step > 0 && num_layers > 0) {
      // Layer 0's input needs no gradient, so no hook marked its end: the backward did.
      bool have0 = false;
      for (const auto& e : job->events) have0 |= e.what() == "backward" && e.layer() == 0;
      if (!have0) AddEvent(job, 0, "backward", job->layer_t0, MonotonicSeconds());
    }
    job->publish_step = 0;
    if (job->publish_failed) {
      reply->set_nonfinite(true);
      return absl::OkStatus();
    }
  }
  if (device_loss_sum.defined()) {
    loss_sum = device_loss_sum.item<double>();  // One host synchronisation per step.
  }
  if (job->fault_nonfinite_loss_steps.count(step)) {
    loss_sum = std::numeric_limits<double>::quiet_NaN();  // Fault injection (tests).
  }
  if (!std::isfinite(loss_sum)) {
    // CUDA (or the fault): the loss is read after the last backward, when the gradients are
    // published and an overlapped optimizer has taken the step; the missing verdict makes it
    // undo that step (TrainStep aborts the flags).
    reply->set_nonfinite(true);
    return absl::OkStatus();
  }
  auto* metrics = reply->mutable_metrics();
  metrics->set_loss(total > 0 ? loss_sum / total : 0.0);
  metrics->set_tokens(total);
  metrics->set_forward_seconds(fwd);
  metrics->set_backward_seconds(bwd);
  return absl::OkStatus();
}

// The step's offload events and, on CUDA, its transfers and device memory, into the reply.
// Errors: the transfer engine's.
absl::Status RecordStepEnd(WorkerJob* job, lspo::v1::StepMetrics* metrics) {
  for (int64_t l = 0; l < static_cast<int64_t>(job->offload_done.size()); ++l) {
    if (job->offload_done[l] > 0) {
      AddEvent(job, l, "offload", job->offload_done[l] - job->offload_secs[l],
               job->offload_done[l]);
    }
  }
  if (job->offload) {
    std::vector<lspo::v1::LayerEvent> gpu_events;
    ASSIGN_OR_RETURN(StepTransfers tr, job->offload->EndStep(&gpu_events));
    auto& phases = *metrics->mutable_device_phase_seconds();
    for (auto& e : gpu_events) {
      if (e.actor() == "gpu") phases[e.what()] += e.end() - e.start();
      job->events.push_back(std::move(e));
    }
    metrics->set_d2h_bytes(tr.d2h_bytes);
    metrics->set_d2h_seconds(tr.d2h_seconds);
    metrics->set_h2d_bytes(tr.h2d_bytes);
    metrics->set_h2d_seconds(tr.h2d_seconds);
  } else if (job->cuda) {
    torch::cuda::synchronize();  // Native mode: the step ends when the device is done.
  }
  if (job->cuda) {
    metrics->set_gpu_memory_used_bytes(DeviceOffload::GpuMemoryUsedBytes());
    metrics->set_gpu_peak_allocated_bytes(DeviceOffload::GpuPeakAllocatedBytes());
  }
  return absl::OkStatus();
}

}  // namespace

WorkerCore::WorkerCore() = default;
WorkerCore::WorkerCore(WorkerOptions options)
    : roots_(std::move(options.allowed_roots), "worker", "lsp_gpu_worker") {}
WorkerCore::~WorkerCore() = default;

absl::StatusOr<WorkerJob*> WorkerCore::Find(const std::string& job_id) {
  if (job_ == nullptr || job_->id != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' is not loaded on this worker (LoadJob first)"));
  }
  return job_.get();
}

absl::StatusOr<lspo::v1::LoadJobReply> WorkerCore::LoadJob(
    const std::string& job_id, const JobSpec& requested,
    const std::vector<int>* resume_candidates) {
  // The roots first, before anything is opened or looked for (and before a stale job goes):
  // an existence check would tell a client which files exist outside them.
  RETURN_IF_ERROR(offload::CheckJobSpecPaths(requested, roots_));
  // The spec this worker runs: the requested one with the settings it chose where it left
  // them unset (CheckJobFitsDevice).
  JobSpec spec = requested;
  std::vector<std::string> chosen;
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr) {
    if (job_->id == job_id) {
      return absl::FailedPreconditionError(absl::StrCat("job '", job_id, "' already loaded"));
    }
    LOG(WARNING) << "worker: replacing stale job " << job_->id << " with " << job_id;
    aborter_.Detach();
    job_.reset();
  }
  auto t0 = std::chrono::steady_clock::now();
  at::set_num_threads(spec.num_threads());
  ASSIGN_OR_RETURN(const bool use_cuda, UseCuda(spec));
  if (!use_cuda && spec.device_memory_limit_mb() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec field device_memory_limit_mb = ", spec.device_memory_limit_mb(),
        " caps a CUDA worker's device memory, but this job runs on the CPU: remove the field, "
        "or run with device: cuda on a GPU host"));
  }
  RETURN_IF_ERROR(CheckJobFitsDevice(&spec, use_cuda, &chosen));
  // Unset and not chosen (the CPU, data parallel, an unreadable config, the check skipped).
  if (spec.micro_batch_size() < 1) spec.set_micro_batch_size(offload::kDefaultMicroBatchSize);
  auto job = std::make_unique<WorkerJob>();
  if (spec.distributed().world_size() > 1) {
    // A CUDA worker's collectives run over Gloo too, on host copies (offload/collective.h):
    // in lsp and zero what is summed goes to the host for the CPU optimizer anyway.
    ASSIGN_OR_RETURN(job->collective, JoinGroup(spec));
  }
  job->tbb_threads = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, std::max(1, spec.num_threads()));
  job->id = job_id;
  job->spec = spec;
  if (const char* f = std::getenv("LSPO_FAULT_NONFINITE_GRAD_STEPS")) {
    // "3,4": at steps 3 and 4; "3@1": at step 3 on rank 1 only (data-parallel tests);
    // "3:5": at step 3, linear 5's gradient only.
    const int rank = spec.distributed().world_size() > 1 ? spec.distributed().rank() : 0;
    for (absl::string_view part : absl::StrSplit(f, ',', absl::SkipEmpty())) {
      std::pair<absl::string_view, absl::string_view> at = absl::StrSplit(part, '@');
      std::pair<absl::string_view, absl::string_view> which = absl::StrSplit(at.first, ':');
      int k = 0, r = rank;
      int64_t linear = -1;
      if (absl::SimpleAtoi(which.first, &k) &&
          (which.second.empty() || absl::SimpleAtoi(which.second, &linear)) &&
          (at.second.empty() || absl::SimpleAtoi(at.second, &r)) && r == rank) {
        if (linear >= 0) {
          job->fault_nonfinite_linear.insert({k, linear});
        } else {
          job->fault_nonfinite_grad_steps.insert(k);
        }
      }
    }
    LOG(WARNING) << "worker: fault injection: non-finite gradients at steps " << f;
  }
  if (const char* f = std::getenv("LSPO_FAULT_NONFINITE_LOSS_STEPS")) {
    for (absl::string_view part : absl::StrSplit(f, ',', absl::SkipEmpty())) {
      int k = 0;
      if (absl::SimpleAtoi(part, &k)) job->fault_nonfinite_loss_steps.insert(k);
    }
    LOG(WARNING) << "worker: fault injection: a non-finite loss after the backward at steps "
                 << f;
  }
  ASSIGN_OR_RETURN(job->path, MakeUpdatePath(spec));
  job->classification = spec.data().format() == lspo::v1::DATA_FORMAT_CLASSIFICATION;
  RETURN_IF_ERROR(LoadAssets(job.get()));
  int agreed_resume_step = 0;
  if (job->collective != nullptr && job->collective->world_size() > 1) {
    RETURN_IF_ERROR(CheckRanksLoadedTheSame(*job));
    if (resume_candidates != nullptr) {
      // resume_from: latest (issue 43): one checkpoint for every rank, the newest all hold.
      ASSIGN_OR_RETURN(agreed_resume_step,
                       offload::AgreeOnNewestCommonStep(*job->collective, *resume_candidates));
    }
  } else if (resume_candidates != nullptr && !resume_candidates->empty()) {
    agreed_resume_step = *std::max_element(resume_candidates->begin(), resume_candidates->end());
  }
  auto& model = *job->model;
  // bf16 weights by default on the GPU (issue 6), fp32 on the CPU (docs/known-failures.md).
  // lsp with compensated rounding into bf16 weights starts from the residuals of the fp32
  // weights (LspPath::InitCompensation), taken before the storage dtype is lowered.
  std::vector<at::Tensor> residuals;
  if (spec.weight_dtype() == lspo::v1::WEIGHT_DTYPE_BF16 ||
      (use_cuda && spec.weight_dtype() == lspo::v1::WEIGHT_DTYPE_UNSPECIFIED)) {
    const bool lsp_mode =
        spec.mode() == lspo::v1::MODE_LSP || spec.mode() == lspo::v1::MODE_UNSPECIFIED;
    const bool galore_offload = spec.mode() == lspo::v1::MODE_GALORE && spec.galore().offload();
    if ((lsp_mode && offload::KeepsApplyResidual(spec)) ||
        galore_offload) {
      RETURN_IF_ERROR(offload::TorchCall("compensation residuals", [&]() -> absl::Status {
        at::NoGradGuard no_grad;
        for (int64_t i = 0; i < model.num_linears(); ++i) {
          const at::Tensor w = model.LinearWeight(i).detach().to(at::kFloat);  // (m, n)
          residuals.push_back((w - w.to(at::kBFloat16).to(at::kFloat)).to(at::kBFloat16));
        }
        return absl::OkStatus();
      }));
    }
    RETURN_IF_ERROR(model.SetLinearStorageDtype(at::kBFloat16));
  }
  if (!use_cuda) {
    // Undo a previous CUDA job's TF32 setting (process-wide): CPU jobs keep exact fp32.
    at::globalContext().setFloat32MatmulPrecision("highest");
  } else {
    job->device = at::Device(at::kCUDA, 0);
    job->cuda = true;
    // fp32 compute (the model upcasts bf16 weights) on TF32 tensor cores, for every mode alike.
    at::globalContext().setFloat32MatmulPrecision("high");
    // Process-wide, set by any CUDA job that names it (lsp kernels; docs/gpu.md).
    if (spec.lsp().kernels() != lspo::v1::CUDA_KERNELS_UNSPECIFIED) {
      lsp::internal::SetCudaKernels(spec.lsp().kernels() == lspo::v1::CUDA_KERNELS_CUSTOM);
    }
    // Before the first device allocation of this job; 0 lifts a previous job's cap.
    RETURN_IF_ERROR(DeviceOffload::SetGpuMemoryLimit(
        static_cast<int64_t>(spec.device_memory_limit_mb()) << 20));
    RETURN_IF_ERROR(model.To(job->device));
  }
  model.SetActivationCheckpointing(spec.activation_checkpointing());
  for (int64_t i = 0; i < model.num_linears(); ++i) {
    const at::Tensor& w = model.LinearWeight(i);
    job->linears.push_back(
        {static_cast<int32_t>(i), model.LinearName(i), w.size(0), w.size(1)});
  }
  lspo::v1::LoadJobReply reply;
  RETURN_IF_ERROR(job->path->Setup(job.get(), &reply));
  const int64_t trainable = job->path->TrainableParameters(*job);
  reply.set_optimizer_state_bytes(job->path->OptimizerStateBytes(*job));
  reply.set_offload_bytes_per_step(job->path->OffloadBytesPerStep(*job));
  if (!residuals.empty()) {
    ASSIGN_OR_RETURN(LspPath * lsp_path, LspPathOf(job.get(), "compensated apply"));
    RETURN_IF_ERROR(offload::TorchCall("compensation residuals", [&]() -> absl::Status {
      return lsp_path->InitCompensation(job.get(), std::move(residuals));
    }));
  }
  job->pending_step.assign(job->linears.size(), 0);
  job->pending_decay.assign(job->linears.size(), 1.0);
  job->offload_done.assign(model.config().num_layers, 0.0);
  job->offload_secs.assign(model.config().num_layers, 0.0);
  InstallLayerHooks(job.get());
  // Examples, also when packed (train_data.packed_rows counts the rows).
  reply.set_train_examples(spec.data().packing() ? job->train_data.examples()
                                                 : static_cast<int64_t>(job->train.size()));
  reply.set_eval_examples(job->eval.size());
  *reply.mutable_train_data() = job->train_data;
  if (!job->eval.empty()) *reply.mutable_eval_data() = job->eval_data;
  reply.set_trainable_parameters(trainable);
  reply.set_device(job->device.str());
  reply.set_activation_checkpointing(spec.activation_checkpointing());
  reply.set_micro_batch_size(spec.micro_batch_size());
  for (const std::string& line : chosen) reply.add_chosen_settings(line);
  reply.set_agreed_resume_step(agreed_resume_step);
  reply.set_seconds(runtime::SecondsSince(t0));
  LOG(INFO) << "worker: loaded job " << job_id << " (mode " << job->path->name() << "): "
            << job->train.size()
            << (spec.data().packing() ? " packed train rows / " : " train / ")
            << job->eval.size() << " eval examples, "
            << trainable << " trainable parameters in " << job->linears.size() << " matrices";
  aborter_.Attach(job_id, job->flags, job->stop_step);
  job_ = std::move(job);
  return reply;
}

absl::StatusOr<lspo::v1::FitProjectorsReply> WorkerCore::FitProjectors(
    const std::string& job_id, int step) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  return RunProjectorCheck(job, step);
}

absl::StatusOr<lspo::v1::TrainStepReply> WorkerCore::TrainStep(
    const std::string& job_id, int step, double lr, const lspo::v1::StepPlan& requested) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  const lspo::v1::StepPlan& plan = requested;
  // Published for UnloadJob, which may abandon this step while we wait (see the header).
  busy_step_.store(step);
  struct ClearStep {
    std::atomic<int>* step;
    ~ClearStep() { step->store(0); }
  } clear_step{&busy_step_};
  RETURN_IF_ERROR(job->path->CheckReady(*job));
  if (step < 1) return absl::InvalidArgumentError("TrainStep: step is 1-based");
  auto t_step = std::chrono::steady_clock::now();
  auto& model = *job->model;
  const bool offloaded = job->path->offloaded();
  const int64_t num_layers = model.config().num_layers;
  const int split = std::clamp<int>(plan.split_layer(), 0, static_cast<int>(num_layers));
  lspo::v1::TrainStepReply reply;
  auto* metrics = reply.mutable_metrics();
  metrics->set_step(step);
  metrics->set_lr(lr);
  metrics->set_split_layer(plan.overlap() ? split : 0);
  job->events.clear();
  job->wait_seconds = 0;
  job->offload_seconds = 0;
  job->rank_sum_wait_seconds = 0;
  job->rank_sum_hidden_seconds = 0;
  job->publish_step = 0;
  job->publish_failed = false;
  std::fill(job->offload_done.begin(), job->offload_done.end(), 0.0);
  std::fill(job->offload_secs.begin(), job->offload_secs.end(), 0.0);
  if (job->offload) job->offload->BeginStep();
  if (!job->peak_reset) {
    // gpu_peak_allocated_bytes and worker_peak_rss_bytes then measure the training steps, not
    // the loading and the projector fit (the memory plan's subject, offload/memory_plan.h).
    if (job->cuda) DeviceOffload::ResetGpuPeak();
    runtime::ResetPeakRss();
    job->peak_reset = true;
  }
  // The optimizer attached the arena before any step: drop its name so that a crash from
  // here on leaves nothing in /dev/shm (lsp mode already did so at the first fit).
  if (offloaded) job->arena.Unlink();
  absl::Status st = offload::TorchCall("train step", [&]() -> absl::Status {
    model.ClearHookStatus();
    int64_t total = 0, input_tokens = 0, padding_tokens = 0;
    const std::vector<data::Batch> batches =
        StepBatches(job, step, &total, &input_tokens, &padding_tokens);
    offload::Collective* group = job->collective.get();
    const int64_t group_bytes0 = group != nullptr ? group->all_reduce_bytes() : 0;
    const double group_secs0 = group != nullptr ? group->all_reduce_seconds() : 0;
    if (group != nullptr) {
      // The ranks train the same step (a rank resumed from another checkpoint than the others
      // would silently train other weights).
      // And they run one schedule: the serial one sums all gradients in one all-reduce, the
      // overlapped one bucket by bucket inside the backward.
      absl::StatusOr<std::vector<int64_t>> gathered =
          group->AllGather(2 * int64_t{step} + (plan.overlap() ? 1 : 0));
      if (!gathered.ok()) return AfterRankZerosEvaluation(*job, step, gathered.status());
      const std::vector<int64_t>& steps = *gathered;
      for (size_t r = 1; r < steps.size(); ++r) {
        if (steps[r] / 2 != steps[0] / 2) {
          return absl::FailedPreconditionError(absl::StrCat(
              "distributed: rank ", r, " (", group->labels()[r], ") trains step ", steps[r] / 2,
              " while rank 0 (", group->labels()[0], ") trains step ", steps[0] / 2,
              ": resume every rank from a checkpoint of the same step (each rank's "
              "output_dir/checkpoints/step-NNNNNNNN)"));
        }
        if (steps[r] != steps[0]) {
          auto name = [](int64_t v) { return v % 2 ? "overlap" : "serial"; };
          return absl::InternalError(absl::StrCat(
              "distributed: at step ", step, " rank ", r, " (", group->labels()[r],
              ") was planned the ", name(steps[r]), " schedule and rank 0 (", group->labels()[0],
              ") the ", name(steps[0]),
              " one; every rank must run one schedule (report this: the schedulers of a "
              "job's ranks plan alike)"));
        }
      }
      // Every rank scales its loss by its tokens over the global count (token-mean loss).
      at::Tensor t = at::full({1}, total, at::kLong);
      RETURN_IF_ERROR(group->AllReduceSum(t));
      total = t.item<int64_t>();
    }
    job->step = static_cast<uint32_t>(step);
    job->path->ZeroGrads(job);
    RETURN_IF_ERROR(RunMicroBatches(job, batches, total, step, plan, &reply));
    if (group != nullptr) {
      // The ranks agree on skipping a non-finite step (a rank that skips alone would leave the
      // others waiting in the gradient all-reduce), and on the step's loss: each rank's is its
      // share of the global token mean.
      at::Tensor agree = at::zeros({2}, at::kDouble);
      agree[0] = reply.nonfinite() ? 1.0 : 0.0;
      agree[1] = reply.nonfinite() ? 0.0 : reply.metrics().loss();
      RETURN_IF_ERROR(group->AllReduceSum(agree));
      reply.set_nonfinite(agree[0].item<double>() > 0);
      metrics->set_loss(agree[1].item<double>());
    }
    if (reply.nonfinite()) return absl::OkStatus();
    if (offloaded && plan.overlap()) {
      // The verdict (issue 43): the loss and every gradient are finite, on every rank. The
      // overlapped optimizer took the step while the backward ran, keeping what it needs to
      // undo it until now; a skipped step instead aborts the flags (below), and it undoes.
      job->flags.PublishVerdict(static_cast<uint32_t>(step));
    }
    StepContext ctx;
    ctx.collective = group;
    ctx.step = static_cast<uint32_t>(step);
    ctx.lr = lr;
    ctx.overlap = plan.overlap();
    ctx.split_layer = split;
    RETURN_IF_ERROR(job->path->FinishStep(job, ctx, &reply));
    if (group != nullptr) {
      metrics->set_all_reduce_bytes(group->all_reduce_bytes() - group_bytes0);
      const double secs = group->all_reduce_seconds() - group_secs0;
      metrics->set_all_reduce_seconds(secs);
      metrics->set_all_reduce_exposed_seconds(
          std::max(0.0, secs - job->rank_sum_hidden_seconds + job->rank_sum_wait_seconds));
    }
    if (reply.nonfinite()) return absl::OkStatus();
    RETURN_IF_ERROR(RecordStepEnd(job, metrics));
    const double secs = runtime::SecondsSince(t_step);
    metrics->set_step_seconds(secs);
    metrics->set_tokens_per_second(secs > 0 ? input_tokens / secs : 0);
    metrics->set_input_tokens(input_tokens);
    metrics->set_padding_tokens(padding_tokens);
    metrics->set_wait_seconds(job->wait_seconds);
    metrics->set_offload_seconds(job->offload_seconds);
    return absl::OkStatus();
  });
  if (!st.ok()) {
    // A pass stopped at a layer boundary (LayerPassStopped) reports the hook's kCancelled.
    if (absl::Status hs = model.HookStatus(); absl::IsCancelled(hs)) st = hs;
  }
  job->publish_step = 0;
  if (offloaded && plan.overlap() && (!st.ok() || reply.nonfinite())) {
    // The optimizer may be waiting for this step's gradients: release it.
    job->flags.Abort(static_cast<uint32_t>(step));
    std::fill(job->pending_step.begin(), job->pending_step.end(), 0);
  }
  if (!st.ok()) return st;
  // Through the end of this step (VmHWM was reset when the first step began).
  metrics->set_worker_peak_rss_bytes(runtime::PeakRssBytes());
  for (auto& e : job->events) *reply.add_events() = std::move(e);
  job->events.clear();
  return reply;
}

absl::StatusOr<lspo::v1::ApplyReply> WorkerCore::ApplyUpdates(
    const std::string& job_id, int step, const lspo::v1::ApplyRequest& request) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  // Published for UnloadJob, which may abandon this step while we wait (see the header).
  busy_step_.store(step);
  struct ClearStep {
    std::atomic<int>* step;
    ~ClearStep() { step->store(0); }
  } clear_step{&busy_step_};
  if (!job->path->offloaded()) {
    return absl::FailedPreconditionError("ApplyUpdates needs MODE_LSP or MODE_ZERO");
  }
  auto t0 = std::chrono::steady_clock::now();
  for (const auto& task : request.tasks()) {
    if (task.index() < 0 || task.index() >= job->layout.linears_size()) {
      return absl::InvalidArgumentError(absl::StrCat("ApplyUpdates: linear index ",
                                                     task.index(), " out of range"));
    }
  }
  // Check every step first so that a bad one leaves all weights untouched.
  for (const auto& task : request.tasks()) {
    const int i = task.index();
    if (job->flags.step_seq(i) < static_cast<uint32_t>(step)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ApplyUpdates: the optimizer has not written step ", step, " of ",
          job->linears[i].name, " (Update first)"));
    }
    RETURN_IF_ERROR(job->path->CheckUpdate(job, i, static_cast<uint32_t>(step)));
  }
  const double decay = job->path->WorkerDecay(job->spec, request.lr());
  lspo::v1::ApplyReply reply;
  absl::Status st = offload::TorchCall("apply", [&]() -> absl::Status {
    for (const auto& task : request.tasks()) {
      const double t1 = MonotonicSeconds();
      RETURN_IF_ERROR(job->path->ApplyUpdate(job, task.index(), static_cast<uint32_t>(step), decay));
      auto* e = reply.add_events();
      e->set_layer(task.index() / model::kLinearsPerLayer);
      e->set_what("apply");
      e->set_start(t1);
      e->set_end(MonotonicSeconds());
      e->set_actor("worker");
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::LayerWeightsReply> WorkerCore::ImportLayerWeights(
    const std::string& job_id, int layer, bool measure_only) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  RETURN_IF_ERROR(LspPathOf(job, "ImportLayerWeights").status());
  const int64_t num_layers = job->model->config().num_layers;
  if (layer < 0 || layer >= num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("ImportLayerWeights: layer ", layer,
                                                   " is not in [0, ", num_layers, ")"));
  }
  lspo::v1::LayerWeightsReply reply;
  RETURN_IF_ERROR(offload::TorchCall("import layer weights", [&]() -> absl::Status {
    RETURN_IF_ERROR(ApplyPending(job, -1));
    ASSIGN_OR_RETURN(at::Tensor staging, offload::ArenaF32(job->arena, job->layout.staging()));
    at::NoGradGuard no_grad;
    int64_t offset = 0;
    ASSIGN_OR_RETURN(LspPath * lsp_path, LspPathOf(job, "ImportLayerWeights"));
    double max_change = 0, max_drift = 0, max_ulps = 0;
    for (int64_t k = 0; k < model::kLinearsPerLayer; ++k) {
      const int64_t i = layer * model::kLinearsPerLayer + k;
      at::Tensor& w = job->model->LinearWeight(i);
      at::Tensor src = staging.narrow(0, offset, w.numel()).view(w.sizes()).to(w.device());
      offset += w.numel();
      max_change = std::max(max_change, (w.to(at::kFloat) - src).abs().max().item<double>());
      max_drift = std::max(max_drift, (w.to(at::kFloat) - src.to(w.scalar_type()).to(at::kFloat))
                                          .abs()
                                          .max()
                                          .item<double>());
      max_ulps = std::max(max_ulps, lsp::MaxDriftUlps(w, src));
      if (!measure_only) lsp_path->RefreshFromMaster(job, i, src);
    }
    reply.set_max_abs_change(max_change);
    reply.set_max_abs_drift(max_drift);
    reply.set_max_drift_ulps(max_ulps);
    return absl::OkStatus();
  }));
  return reply;
}

absl::StatusOr<lspo::v1::EvalMetrics> WorkerCore::Evaluate(const std::string& job_id, int step,
                                                           const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  return EvaluateJob(job, step, cancelled);
}

absl::StatusOr<lspo::v1::SaveReply> WorkerCore::SaveArtifacts(const std::string& job_id,
                                                             const std::string& dir) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "SaveArtifacts", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(offload::TorchCall("flush updates", [&] { return ApplyPending(job, -1); }));
  // generation_config.json: the input folder's (sampling defaults, eos list) when it had one,
  // else the special ids of the config. Offloaded modes: the scheduler writes the optimizer's
  // master weights instead of the worker's copy.
  const std::string gen_source = job->spec.model().format() == lspo::v1::MODEL_FORMAT_HF
                                     ? job->spec.model().path() + "/generation_config.json"
                                     : "";
  std::vector<std::string> files;
  RETURN_IF_ERROR(offload::TorchCall("save artifacts", [&]() -> absl::Status {
    offload::NamedTensors weights;
    if (!job->path->offloaded()) weights = job->path->ExportedTensors(job);
    ASSIGN_OR_RETURN(files, offload::WriteHfModelFolder(
                                job->model->config(), *job->tokenizer, gen_source,
                                job->path->offloaded() ? nullptr : &weights, dir));
    ASSIGN_OR_RETURN(std::vector<std::string> own, job->path->WriteArtifacts(job, dir));
    files.insert(files.end(), own.begin(), own.end());
    return absl::OkStatus();
  }));
  lspo::v1::SaveReply reply;
  for (const std::string& f : files) reply.add_files(f);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}


absl::StatusOr<lspo::v1::StateReply> WorkerCore::SaveState(const std::string& job_id,
                                                           const std::string& dir, int step) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "SaveState", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  return SaveWorkerState(job, dir, step);
}

absl::StatusOr<lspo::v1::StateReply> WorkerCore::LoadState(const std::string& job_id,
                                                           const std::string& dir, int step) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "LoadState", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  return LoadWorkerState(job, dir, step);
}

absl::Status WorkerCore::AbortStep(const std::string& job_id, int step) {
  return aborter_.Abort(job_id, step, "worker");
}

absl::Status WorkerCore::UnloadJob(const std::string& job_id) {
  // A TrainStep / ApplyUpdates waiting for updates holds mu_: abandon its step first (a
  // no-op for another job's id or when none waits).
  if (const int step = busy_step_.load(); step > 0) {
    (void)aborter_.Abort(job_id, step, "worker");
  }
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr && job_->id == job_id) {
    aborter_.Detach();
    job_.reset();
  }
  return absl::OkStatus();
}

}  // namespace lspo::worker
