// The checks of a job spec with defaults resolved (job_spec.h ValidateJobSpec): value ranges,
// known formats and modes, and the files the spec names.
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "offload/training_mode.h"
#include "runtime/file_io.h"
#include "runtime/hf_cache.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"
#include "spec/job_spec.h"

namespace lspo::spec {
namespace {

namespace v1 = lspo::v1;

using lspo::v1::JobSpec;

bool Readable(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

}  // namespace

// The distributed block (docs/distributed.md). Errors: kInvalidArgument naming the field.
static absl::Status ValidateDistributed(const JobSpec& spec) {
  const v1::DistributedSpec& d = spec.distributed();
  auto bad = [](absl::string_view field, auto value, absl::string_view fix) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec field distributed.", field, " = ", value, " is invalid: ", fix));
  };
  if (d.world_size() < 0) return bad("world_size", d.world_size(), "use 1 or more ranks");
  if (d.world_size() > 4096) {
    return bad("world_size", d.world_size(), "a job has at most 4096 ranks");
  }
  if (d.world_size() <= 1) {
    if (d.rank() != 0) {
      return bad("rank", d.rank(), "a job of one rank has rank 0; set distributed.world_size");
    }
    return absl::OkStatus();
  }
  if (d.rank() < 0 || d.rank() >= d.world_size()) {
    return bad("rank", d.rank(),
               absl::StrCat("use 0 .. ", d.world_size() - 1, " (lspctl run --rank=R)"));
  }
  if (!d.rendezvous().empty()) {
    RETURN_IF_ERROR(
        runtime::ParseHostPort(d.rendezvous(), "job spec field distributed.rendezvous").status());
  }
  if (d.allow_remote() && d.rendezvous_token_file().empty()) {
    return bad("allow_remote", "true",
               "a rendezvous that other hosts can reach needs distributed.rendezvous_token_file "
               "(a file holding the job's token, mode 0600, on every rank; lspctl run "
               "--rendezvous_token_file=FILE)");
  }
  if (d.timeout_seconds() < 0) {
    return bad("timeout_seconds", d.timeout_seconds(), "use 0 (= 300) or a positive bound");
  }
  if (const offload::ModeDescriptor& m = offload::ModeOf(spec); !m.data_parallel) {
    std::vector<std::string> parallel;
    for (const offload::ModeDescriptor& p : offload::AllModes()) {
      if (p.data_parallel) parallel.emplace_back(p.name);
    }
    return bad("world_size", d.world_size(),
               absl::StrCat("data parallelism runs modes ", absl::StrJoin(parallel, ", "),
                            "; mode ", m.name,
                            " does not (GaLore-Offload projects each rank's "
                            "gradient before anything is summed). Use another mode or "
                            "world_size 1"));
  }
  return absl::OkStatus();
}

// "job spec field FIELD = VALUE is invalid: FIX" (kInvalidArgument).
template <typename V>
static absl::Status Bad(absl::string_view field, const V& value, absl::string_view fix) {
  return absl::InvalidArgumentError(
      absl::StrCat("job spec field ", field, " = ", value, " is invalid: ", fix));
}

// The bookkeeping: checkpoints, data parallelism, evaluation, packing, resume_from.
static absl::Status ValidateRun(const JobSpec& spec, bool check_files) {
  if (spec.checkpoint_every() < 0) {
    return Bad("checkpoint_every", spec.checkpoint_every(),
               "use 0 (no training checkpoints) or a positive number of steps");
  }
  RETURN_IF_ERROR(ValidateDistributed(spec));
  if (spec.max_nonfinite_steps() < 0) {
    return Bad("max_nonfinite_steps", spec.max_nonfinite_steps(),
               "use 0 (the scheduler's default) or a positive count");
  }
  if (!v1::EvalMetric_IsValid(spec.eval().metric())) {
    return Bad("eval.metric", spec.eval().metric(), "use loss or generative");
  }
  if (spec.eval().max_new_tokens() < 0 || spec.eval().max_new_tokens() > 4096) {
    return Bad("eval.max_new_tokens", spec.eval().max_new_tokens(),
               "use 0 (= 64) or a count of tokens up to 4096");
  }
  if (spec.eval().max_generate_examples() < 0) {
    return Bad("eval.max_generate_examples", spec.eval().max_generate_examples(),
               "use 0 (every evaluation example) or a positive count");
  }
  if (spec.eval().metric() == v1::EVAL_METRIC_GENERATIVE && spec.data().eval_path().empty()) {
    return Bad("eval.metric", "generative",
               "it generates answers for data.eval_path's examples; set data.eval_path");
  }
  if (spec.eval().metric() == v1::EVAL_METRIC_GENERATIVE &&
      spec.data().format() == v1::DATA_FORMAT_TEXT) {
    return Bad("eval.metric", "generative",
               "text data has no answers to generate; use data.format alpaca, chat, "
               "prompt_completion or classification, or eval.metric loss");
  }
  if (spec.data().packing() && spec.data().format() == v1::DATA_FORMAT_TEXT) {
    return Bad("data.packing", "true",
               "text data is already cut into seq_len-token blocks with no padding; remove "
               "data.packing");
  }
  if (spec.data().packing() && spec.data().balance_classes()) {
    return Bad("data.packing", "true",
               "data.balance_classes orders single examples by class and a packed row mixes "
               "classes; use one of the two");
  }
  if (spec.save_dtype() != v1::WEIGHT_DTYPE_FP32 && spec.save_dtype() != v1::WEIGHT_DTYPE_BF16) {
    return Bad("save_dtype", runtime::EnumShortName(spec.save_dtype()),
               "use fp32 or bf16 (unset: the input model's dtype)");
  }
  if (spec.keep_checkpoints() < 1) {
    return Bad("keep_checkpoints", spec.keep_checkpoints(), "keep at least 1 checkpoint");
  }
  if (check_files && !spec.resume_from().empty() && spec.resume_from() != "latest" &&
      access((spec.resume_from() + "/trainer_state.json").c_str(), R_OK) != 0) {
    return absl::NotFoundError(
        absl::StrCat("job spec field resume_from: '", spec.resume_from(),
                     "' is not a checkpoint directory (no trainer_state.json); give "
                     "<output_dir>/checkpoints/step-NNNNNNNN or \"latest\""));
  }
  return absl::OkStatus();
}

// model: its format and the files it names.
static absl::Status ValidateModel(const JobSpec& spec) {
  const auto& model = spec.model();
  // A model id ResolveDefaults could not find in the Hugging Face cache: the cache's reason.
  for (const auto& [field, path] :
       {std::pair<const char*, const std::string&>{"model.path", model.path()},
        {"model.tokenizer_path", model.tokenizer_path()}}) {
    std::error_code ec;
    if (runtime::LooksLikeModelId(path) && !std::filesystem::exists(path, ec)) {
      if (absl::StatusOr<std::string> dir = runtime::ResolveHfCacheModel(path); !dir.ok()) {
        return absl::Status(dir.status().code(),
                            absl::StrCat("job spec field ", field, ": ", dir.status().message()));
      }
    }
  }
  if (model.format() != v1::MODEL_FORMAT_GGUF && model.format() != v1::MODEL_FORMAT_TINY_RANDOM &&
      model.format() != v1::MODEL_FORMAT_HF) {
    return Bad("model.format", runtime::EnumShortName(model.format()),
               "use hf, gguf or tiny-random");
  }
  const bool hf = model.format() == v1::MODEL_FORMAT_HF;
  if (hf) {
    if (model.path().empty()) {
      return Bad("model.path", "\"\"",
                 "give a Hugging Face model folder (config.json + *.safetensors)");
    }
    if (!runtime::IsDirectory(model.path())) {
      return absl::NotFoundError(absl::StrCat(
          "job spec field model.path: '", model.path(),
          "' is not a directory, but model.format is hf; give the model folder (the one with "
          "config.json), or set model.format to gguf for a .gguf file"));
    }
    if (!Readable(model.path() + "/config.json")) {
      return absl::NotFoundError(
          absl::StrCat("job spec field model.path: folder '", model.path(),
                       "' has no readable config.json; it is not a Hugging Face model folder"));
    }
  }
  const bool has_model_path = model.format() != v1::MODEL_FORMAT_TINY_RANDOM;  // gguf, hf
  if (model.format() != v1::MODEL_FORMAT_TINY_RANDOM && model.random_shape().hidden_size() != 0) {
    return Bad("model.random_shape.hidden_size", model.random_shape().hidden_size(),
               "a random shape only applies to model.format \"tiny-random\"; remove it");
  }
  if (has_model_path && model.path().empty()) {
    return Bad("model.path", "\"\"",
               "give a GGUF file (scripts/setup fetches one) or a Hugging Face model folder");
  }
  const std::string& model_file = has_model_path ? model.path() : model.tokenizer_path();
  if (model_file.empty()) {
    return Bad("model.tokenizer_path", "\"\"",
               "tiny-random models take their tokenizer from a GGUF file or an HF folder: set "
               "model.path or "
               "model.tokenizer_path");
  }
  if (!Readable(model_file)) {
    const char* field = has_model_path ? "model.path" : "model.tokenizer_path";
    return absl::NotFoundError(absl::StrCat(
        "job spec field ", field, ": file '", model_file,
        "' does not exist or is not readable (relative paths resolve against the scheduler's "
        "working directory; for lspctl run, the directory you run it from). Run scripts/setup "
        "to fetch the model, or fix the path"));
  }
  return absl::OkStatus();
}

// data: its format and the files it names.
// Parquet / Arrow files and saved Hugging Face datasets (a save_to_disk folder) are the common
// forms of data people have; a job reads JSONL / JSON / TSV / text. Refused by name with the
// one-line conversion (the Python client's lspo.to_jsonl, docs/python.md) rather than read as
// text.
static absl::Status RefuseDatasetFile(absl::string_view field, const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  const bool columnar = absl::EndsWith(path, ".parquet") || absl::EndsWith(path, ".arrow");
  const bool saved = Readable(path + "/dataset_info.json") || Readable(path + "/state.json");
  if (!columnar && !saved) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "job spec field ", field, ": '", path, "' is ",
      columnar ? "a parquet / Arrow file" : "a saved Hugging Face dataset (save_to_disk)",
      "; a job reads JSONL, JSON, TSV or text: convert it once with the Python client, e.g. "
      "python -c \"import lspo; lspo.to_jsonl(",
      columnar ? absl::StrCat("'", path, "'")
               : absl::StrCat("__import__('datasets').load_from_disk('", path, "')"),
      ", 'train.jsonl')\" (docs/python.md; a parquet with none of the recognised columns is "
      "refused there, naming them)"));
}

static absl::Status ValidateData(const JobSpec& spec, bool check_files) {
  const auto& data = spec.data();
  if (data.format() == v1::DATA_FORMAT_UNSPECIFIED || !v1::DataFormat_IsValid(data.format())) {
    return Bad("data.format", runtime::EnumShortName(data.format()),
               "use classification, text, alpaca, chat or prompt_completion");
  }
  if (data.train_path().empty()) {
    return Bad("data.train_path", "\"\"", "give a training data file");
  }
  RETURN_IF_ERROR(RefuseDatasetFile("data.train_path", data.train_path()));
  RETURN_IF_ERROR(RefuseDatasetFile("data.eval_path", data.eval_path()));
  if (check_files && !Readable(data.train_path())) {
    return absl::NotFoundError(absl::StrCat("job spec field data.train_path: file '",
                                            data.train_path(),
                                            "' does not exist or is not readable (relative "
                                            "paths resolve against the scheduler's working "
                                            "directory)"));
  }
  if (check_files && !data.eval_path().empty() && !Readable(data.eval_path())) {
    return absl::NotFoundError(absl::StrCat("job spec field data.eval_path: file '",
                                            data.eval_path(),
                                            "' does not exist or is not readable"));
  }
  if (const std::string& a = spec.model().adapter_path();
      check_files && !a.empty() && !Readable(a + "/adapter_config.json")) {
    return absl::NotFoundError(
        absl::StrCat("job spec field model.adapter_path: '", a,
                     "' has no readable adapter_config.json; give "
                     "a PEFT LoRA adapter folder (a lora job writes one as <output_dir>/adapter)"));
  }
  if (check_files && !data.perplexity_path().empty() && !Readable(data.perplexity_path())) {
    return absl::NotFoundError(absl::StrCat("job spec field data.perplexity_path: file '",
                                            data.perplexity_path(),
                                            "' does not exist or is not readable"));
  }
  if (const std::string& t = data.chat_template();
      check_files && !t.empty() && t.find("{{") == std::string::npos &&
      t.find("{%") == std::string::npos && !Readable(t)) {
    return absl::NotFoundError(
        absl::StrCat("job spec field data.chat_template: '", t,
                     "' is neither Jinja text (no {{ or {%) nor "
                     "a readable file; give the template itself or the path of a .jinja file"));
  }
  if (data.perplexity_blocks() < 0) {
    return Bad("data.perplexity_blocks", data.perplexity_blocks(), "must be >= 0");
  }
  return absl::OkStatus();
}

// The schedule, the weights' dtype and lsp's settings.
static absl::Status ValidateLsp(const JobSpec& spec) {
  if (spec.schedule() != v1::STEP_SCHEDULE_SERIAL && spec.schedule() != v1::STEP_SCHEDULE_OVERLAP) {
    return Bad("schedule", runtime::EnumShortName(spec.schedule()), "use overlap or serial");
  }
  if (spec.weight_dtype() != v1::WEIGHT_DTYPE_FP32 &&
      spec.weight_dtype() != v1::WEIGHT_DTYPE_BF16 &&
      !(spec.weight_dtype() == v1::WEIGHT_DTYPE_UNSPECIFIED &&
        spec.device() == v1::DEVICE_UNSPECIFIED)) {
    return Bad("weight_dtype", runtime::EnumShortName(spec.weight_dtype()), "use fp32 or bf16");
  }
  const auto& lsp = spec.lsp();
  if (lsp.d_ratio() != 0) {
    if (!(std::isfinite(lsp.d_ratio()) && lsp.d_ratio() > 0 && lsp.d_ratio() < 1)) {
      return Bad("lsp.d_ratio", lsp.d_ratio(),
                 "must lie in (0, 1): d of each matrix as a fraction of its smaller side "
                 "(the paper uses about 0.5)");
    }
    if (lsp.d() != 0) {
      return Bad("lsp.d", lsp.d(),
                 "set either lsp.d (an absolute subspace size) or lsp.d_ratio, not both");
    }
    if (lsp.r() < 1) return Bad("lsp.r", lsp.r(), "r must be >= 1");
  } else {
    if (lsp.d() < 1) return Bad("lsp.d", lsp.d(), "d must be >= 1");
    if (lsp.r() < 1 || lsp.r() > lsp.d()) {
      return Bad("lsp.r", lsp.r(), absl::StrCat("r must satisfy 1 <= r <= d = ", lsp.d()));
    }
  }
  if (!v1::NarrowRule_IsValid(lsp.narrow())) {
    return Bad("lsp.narrow", static_cast<int>(lsp.narrow()), "use one-sided, half or full");
  }
  if (!v1::ApplyRounding_IsValid(lsp.apply_rounding())) {
    return Bad("lsp.apply_rounding", static_cast<int>(lsp.apply_rounding()),
               "use compensated, nearest or stochastic");
  }
  if (lsp.alpha() <= 0) return Bad("lsp.alpha", lsp.alpha(), "alpha must be > 0");
  if (lsp.check_freq() < 0) return Bad("lsp.check_freq", lsp.check_freq(), "must be >= 0");
  if (lsp.calibration_examples() < 1) {
    return Bad("lsp.calibration_examples", lsp.calibration_examples(), "must be >= 1");
  }
  if (lsp.calibration_layers_per_pass() < 0) {
    return Bad("lsp.calibration_layers_per_pass", lsp.calibration_layers_per_pass(),
               "must be >= 0 (0 = all layers in one pass)");
  }
  if (lsp.calibration_memory_mb() < 0) {
    return Bad("lsp.calibration_memory_mb", lsp.calibration_memory_mb(), "must be >= 0");
  }
  if (!(lsp.beta() >= 0)) return Bad("lsp.beta", lsp.beta(), "must be >= 0");
  if (!(lsp.fit_stop() >= 0)) return Bad("lsp.fit_stop", lsp.fit_stop(), "must be >= 0");
  if (lsp.master_refresh() != v1::MASTER_REFRESH_REFIT &&
      lsp.master_refresh() != v1::MASTER_REFRESH_NEVER) {
    return Bad("lsp.master_refresh", runtime::EnumShortName(lsp.master_refresh()),
               "use refit or never");
  }
  if (lsp.refresh_every() < 0) {
    return Bad(
        "lsp.refresh_every", lsp.refresh_every(),
        "must be >= 0 (steps between re-roundings of each weight from the master; 0 = none)");
  }
  if (lsp.refresh_every() > 0 && lsp.master_refresh() == v1::MASTER_REFRESH_NEVER) {
    return Bad("lsp.refresh_every", lsp.refresh_every(),
               "lsp.master_refresh: never asks for no refresh at all: drop one of the two");
  }
  if (!v1::Compression_IsValid(lsp.compression())) {
    return Bad("lsp.compression", static_cast<int>(lsp.compression()),
               "use sparse, dense or leave it empty");
  }
  if (!v1::CudaKernels_IsValid(lsp.kernels())) {
    return Bad("lsp.kernels", lsp.kernels(), "use aten, custom or leave it empty");
  }
  return absl::OkStatus();
}

// The step's shape, the optimizer's settings, the device and the threads.
static absl::Status ValidateTraining(const JobSpec& spec) {
  if (!(spec.epochs() >= 0) || spec.epochs() > 1e6) {
    return Bad("epochs", spec.epochs(), "use 0 (steps decides) or a number of passes up to 1e6");
  }
  if (spec.epochs() > 0 && spec.steps() != 0) {
    return Bad("steps", spec.steps(),
               absl::StrCat("the spec also sets epochs = ", spec.epochs(),
                            "; keep one (max_steps / steps or num_train_epochs / epochs)"));
  }
  if (spec.epochs() == 0 && spec.steps() < 1) {
    return Bad("steps", spec.steps(),
               "run at least 1 step: set steps (max_steps) >= 1, or epochs (num_train_epochs) > 0");
  }
  if (spec.has_micro_batch_size() && spec.micro_batch_size() < 1) {
    return Bad("micro_batch_size", spec.micro_batch_size(),
               "must be >= 1 (or left unset: a CUDA worker chooses the largest that fits)");
  }
  if (spec.grad_accum() < 1) return Bad("grad_accum", spec.grad_accum(), "must be >= 1");
  if (spec.seq_len() < 8 || spec.seq_len() > 8192) {
    return Bad("seq_len", spec.seq_len(), "use 8 <= seq_len <= 8192");
  }
  const auto& optim = spec.optim();
  if (!(optim.lr() > 0) || optim.lr() > 1) return Bad("optim.lr", optim.lr(), "use 0 < lr <= 1");
  if (optim.beta1() < 0 || optim.beta1() >= 1) return Bad("optim.beta1", optim.beta1(), "[0,1)");
  if (optim.beta2() < 0 || optim.beta2() >= 1) return Bad("optim.beta2", optim.beta2(), "[0,1)");
  if (optim.warmup_steps() < 0) return Bad("optim.warmup_steps", optim.warmup_steps(), ">= 0");
  if (!(optim.warmup_ratio() >= 0) || optim.warmup_ratio() > 1) {
    return Bad("optim.warmup_ratio", optim.warmup_ratio(), "use a fraction of the steps in [0, 1]");
  }
  if (optim.warmup_ratio() > 0 && optim.warmup_steps() > 0) {
    return Bad("optim.warmup_ratio", optim.warmup_ratio(),
               absl::StrCat("the spec also sets optim.warmup_steps = ", optim.warmup_steps(),
                            "; keep one"));
  }
  if (optim.schedule() != v1::LR_SCHEDULE_CONSTANT && optim.schedule() != v1::LR_SCHEDULE_COSINE &&
      optim.schedule() != v1::LR_SCHEDULE_LINEAR) {
    return Bad("optim.schedule", runtime::EnumShortName(optim.schedule()),
               "use constant, cosine or linear");
  }
  if (!(optim.weight_decay() >= 0) || optim.weight_decay() * optim.lr() >= 1) {
    return Bad("optim.weight_decay", optim.weight_decay(), "use 0 <= weight_decay < 1 / lr");
  }
  if (!(optim.max_grad_norm() >= 0)) {
    return Bad("optim.max_grad_norm", optim.max_grad_norm(), "use 0 (off) or a positive norm");
  }
  if (!v1::Device_IsValid(spec.device())) {
    return Bad("device", spec.device(), "use cpu, cuda or leave it empty");
  }
  if (spec.num_threads() < 1 || spec.num_threads() > 1024) {
    return Bad("num_threads", spec.num_threads(), "use 1..1024");
  }
  return absl::OkStatus();
}

absl::Status ValidateJobSpec(const JobSpec& spec, bool check_data_files) {
  RETURN_IF_ERROR(ValidateRun(spec, check_data_files));
  RETURN_IF_ERROR(ValidateModel(spec));
  RETURN_IF_ERROR(ValidateData(spec, check_data_files));
  // The mode, its own settings and the blocks of other modes (training_mode.h).
  RETURN_IF_ERROR(offload::CheckModeSettings(spec));
  RETURN_IF_ERROR(ValidateLsp(spec));
  return ValidateTraining(spec);
}

}  // namespace lspo::spec
