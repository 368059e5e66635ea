// WorkerCore::LoadJob's parts (job_loading.h).
#include "gpu_worker/job_loading.h"

#include <algorithm>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "data/datasets.h"
#include "data/sft.h"
#include "glog/logging.h"
#include "gpu_worker/device_offload.h"
#include "lsp/projector.h"
#include "offload/job_assets.h"
#include "offload/torch_call.h"
#include "offload/training_mode.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

using lspo::v1::JobSpec;

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
// `*summary` (also logged; nothing when null); for classification data also each example's label id
// (labels numbered in order of first appearance) in `*class_of` when non-null.
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
      ASSIGN_OR_RETURN(auto ex, data::BuildClassificationChat(
                                    tok, *tmpl, row.text, row.label, spec.data().question(),
                                    spec.data().system_prompt(), spec.seq_len(), &cut, &full));
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
      return absl::Status(tmpl.status().code(), absl::StrCat(data::SftFormatName(format),
                                                             " data: ", tmpl.status().message()));
    }
    ASSIGN_OR_RETURN(out, data::LoadSftExamples(path, &format, tok, tmpl.ok() ? &*tmpl : nullptr,
                                                spec.seq_len(), max, &counts));
  } else {
    ASSIGN_OR_RETURN(auto blocks,
                     data::PackTextBlocks(tok, path, spec.seq_len(), spec.data().max_blocks()));
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
    return absl::InvalidArgumentError(
        absl::StrCat("data file '", path, "' produced no examples: check its format"));
  }
  counts.examples = static_cast<int64_t>(out.size());
  if (summary != nullptr) {
    LOG(INFO) << "worker: " << split << " "
              << data::FormatDataSummary(path, format_name, spec.seq_len(), counts);
    *summary = SummaryProto(split, path, format_name, spec.seq_len(), counts);
  }
  return out;
}

}  // namespace

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

absl::Status LoadAssets(WorkerJob* job) {
  const JobSpec& spec = job->spec;
  ASSIGN_OR_RETURN(auto tok, offload::LoadJobTokenizer(spec));
  job->data.tokenizer = std::make_unique<model::BpeTokenizer>(std::move(tok));
  ASSIGN_OR_RETURN(auto m, offload::LoadJobModel(spec));
  job->model = std::make_unique<model::LlamaModel>(std::move(m));
  RETURN_IF_ERROR(
      offload::CheckTokenizerFitsModel(*job->data.tokenizer, job->model->config(), spec));
  if (spec.seq_len() > job->model->config().max_position_embeddings) {
    LOG(WARNING) << "seq_len " << spec.seq_len() << " exceeds the model's "
                 << "max_position_embeddings " << job->model->config().max_position_embeddings
                 << " (" << spec.model().path() << "): RoPE extrapolates past the trained context";
  }
  ASSIGN_OR_RETURN(job->data.train,
                   LoadExamples(spec, *job->data.tokenizer, "train", spec.data().train_path(),
                                spec.data().max_train_examples(), &job->data.train_summary,
                                &job->data.train_class));
  if (spec.data().packing()) {
    // Several examples per row (data/datasets.h PackExamples); the rows are what the epoch
    // order shuffles and the calibration draws from.
    job->data.train = data::PackExamples(job->data.train, spec.seq_len());
    job->data.train_summary.set_packed_rows(static_cast<int64_t>(job->data.train.size()));
    job->data.train_class.clear();
  }
  if (!spec.data().eval_path().empty()) {
    ASSIGN_OR_RETURN(job->data.eval,
                     LoadExamples(spec, *job->data.tokenizer, "eval", spec.data().eval_path(),
                                  spec.data().max_eval_examples(), &job->data.eval_summary));
  }
  if (spec.eval().metric() == lspo::v1::EVAL_METRIC_GENERATIVE && !job->data.eval.empty()) {
    // Generation is scored against the whole answer, not the one cut to seq_len: the
    // evaluation examples again, untruncated.
    JobSpec whole = spec;
    whole.set_seq_len(std::numeric_limits<int32_t>::max());
    int max = spec.data().max_eval_examples();
    if (spec.eval().max_generate_examples() > 0 &&
        (max <= 0 || spec.eval().max_generate_examples() < max)) {
      max = spec.eval().max_generate_examples();
    }
    ASSIGN_OR_RETURN(job->data.generate, LoadExamples(whole, *job->data.tokenizer, "generate",
                                                      spec.data().eval_path(), max, nullptr));
  }
  if (!spec.data().perplexity_path().empty()) {
    ASSIGN_OR_RETURN(
        job->data.ppl_blocks,
        data::PackTextBlocks(
            *job->data.tokenizer, spec.data().perplexity_path(), spec.seq_len(),
            spec.data().perplexity_blocks() > 0 ? spec.data().perplexity_blocks() : 32));
  }
  return absl::OkStatus();
}

void SetFaults(const WorkerFaults& faults, WorkerJob* job) {
  const JobSpec& spec = job->spec;
  if (const std::string& f = faults.nonfinite_grad_steps; !f.empty()) {
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
          job->faults.nonfinite_linear.insert({k, linear});
        } else {
          job->faults.nonfinite_grad_steps.insert(k);
        }
      }
    }
    LOG(WARNING) << "worker: fault injection: non-finite gradients at steps " << f;
  }
  if (const std::string& f = faults.nonfinite_loss_steps; !f.empty()) {
    for (absl::string_view part : absl::StrSplit(f, ',', absl::SkipEmpty())) {
      int k = 0;
      if (absl::SimpleAtoi(part, &k)) job->faults.nonfinite_loss_steps.insert(k);
    }
    LOG(WARNING) << "worker: fault injection: a non-finite loss after the backward at steps " << f;
  }
}

absl::StatusOr<std::vector<at::Tensor>> PlaceModel(WorkerJob* job, bool use_cuda) {
  const JobSpec& spec = job->spec;
  auto& model = *job->model;
  std::vector<at::Tensor> residuals;  // per linear (m, n) bf16, CPU
  if (offload::SixteenBitWorkerWeights(spec, use_cuda)) {
    if (offload::ModeOf(spec).keeps_residual(spec)) {
      RETURN_IF_ERROR(offload::TorchCall("compensation residuals", [&]() -> absl::Status {
        at::NoGradGuard no_grad;
        for (int64_t i = 0; i < model.num_linears(); ++i) {
          const at::Tensor w = model.LinearWeight(i).detach().to(at::kFloat);  // (m, n) fp32
          residuals.push_back((w - w.to(at::kBFloat16).to(at::kFloat)).to(at::kBFloat16));
        }
        return absl::OkStatus();
      }));
    }
    RETURN_IF_ERROR(model.SetLinearStorageDtype(at::kBFloat16));
    // On a GPU the frozen embedding, head and norms too (fp32 masters stay on the host with
    // the optimizer or in the input file); the CPU keeps them fp32, whose bf16 GEMMs are slow.
    if (use_cuda) RETURN_IF_ERROR(model.SetFrozenStorageDtype(at::kBFloat16));
  }
  if (!use_cuda) {
    // Undo a previous CUDA job's TF32 setting (process-wide): CPU jobs keep exact fp32.
    at::globalContext().setFloat32MatmulPrecision("highest");
  } else {
    job->device = at::Device(at::kCUDA, 0);
    job->cuda = true;
    // fp32 compute (the model upcasts bf16 weights) on TF32 tensor cores, for every mode alike.
    at::globalContext().setFloat32MatmulPrecision("high");
    // Before the first device allocation of this job; 0 lifts a previous job's cap.
    RETURN_IF_ERROR(DeviceOffload::SetGpuMemoryLimit(
        static_cast<int64_t>(spec.device_memory_limit_mb()) << 20));
    RETURN_IF_ERROR(model.To(job->device));
  }
  model.SetActivationCheckpointing(spec.activation_checkpointing());
  for (int64_t i = 0; i < model.num_linears(); ++i) {
    const at::Tensor& w = model.LinearWeight(i);  // (m, n) as stored
    job->linears.push_back({static_cast<int32_t>(i), model.LinearName(i), w.size(0), w.size(1)});
  }
  return residuals;
}

}  // namespace lspo::worker
