#include "spec/job_spec.h"

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "offload/spec_paths.h"
#include "offload/training_mode.h"
#include "runtime/allowed_roots.h"
#include "runtime/file_io.h"
#include "runtime/hf_cache.h"
#include "runtime/proto_json.h"
#include "runtime/record_keys.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"
#include "spec/spec_names.h"
#include "yaml-cpp/yaml.h"

namespace lspo::spec {
namespace {

namespace v1 = lspo::v1;

using lspo::v1::JobSpec;

bool Readable(const std::string& path) { return access(path.c_str(), R_OK) == 0; }

// data.format from the keys of the first record of a .json / .jsonl file (proto/job_spec.proto
// DataFormat); classification when the file is of another kind, unreadable or matches none
// (the worker's reader then names the problem).
v1::DataFormat DetectDataFormat(const std::string& path) {
  if (!absl::EndsWith(path, ".jsonl") && !absl::EndsWith(path, ".json")) {
    return v1::DATA_FORMAT_CLASSIFICATION;
  }
  std::ifstream in(path, std::ios::binary);
  // The first record: the first element of a top-level array, or the first non-blank line
  // (read whole, however long).
  nlohmann::json first;
  std::string line;
  while (std::getline(in, line) && line.find_first_not_of(" \t\r") == std::string::npos) {
  }
  const size_t start = line.find_first_not_of(" \t\r");
  if (start == std::string::npos) return v1::DATA_FORMAT_CLASSIFICATION;
  if (line[start] == '[') {
    std::ifstream whole(path, std::ios::binary);
    first = nlohmann::json::parse(whole, nullptr, /*allow_exceptions=*/false);
    if (first.is_array() && !first.empty()) first = first[0];
  } else {
    first = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  }
  // Not parseable (invalid UTF-8, a broken line): go by the key names in the raw text, so that
  // the format's own reader reports the problem with its line and byte offset.
  const absl::string_view name =
      first.is_discarded() ? runtime::SftFormatOfKeys([&](const char* key) {
        return line.find(absl::StrCat("\"", key, "\"")) != std::string::npos;
      })
      : first.is_object()
          ? runtime::SftFormatOfKeys([&](const char* key) { return first.contains(key); })
          : absl::string_view();
  v1::DataFormat format = v1::DATA_FORMAT_CLASSIFICATION;
  if (!name.empty()) {
    v1::DataFormat_Parse(absl::StrCat("DATA_FORMAT_", absl::AsciiStrToUpper(name)), &format);
  }
  return format;
}

// The spec in `json` (a tree) with its aliases and `overrides` applied and its keys checked
// (spec_names.h), read by protobuf's JSON mapping.
absl::StatusOr<JobSpec> FromJsonTree(nlohmann::json json, absl::string_view source,
                                     const std::vector<std::string>& overrides) {
  RETURN_IF_ERROR(NormalizeSpecJson(overrides, source, &json));
  std::string text;
  try {
    text = json.dump();
  } catch (const nlohmann::json::exception& e) {
    // nlohmann refuses strings that are not valid UTF-8 (type_error 316); found by
    // fuzz/job_spec_fuzzer.cc (fuzz/regressions/job_spec).
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec ", source, " holds text that is not valid UTF-8: save the file as UTF-8"));
  }
  // Closed sets accept their short names ("lsp", "overlap", "tiny-random") and the enum names.
  JobSpec spec;
  absl::Status st = runtime::ProtoFromJson(text, &spec, absl::StrCat("job spec ", source));
  if (!st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(st.message(),
                     ". See examples/*.yaml and proto/job_spec.proto (message JobSpec) for the "
                     "fields; mode is ",
                     offload::ModeNames(), " (or the enum names, MODE_LSP ...)."));
  }
  return spec;
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpecJson(absl::string_view json, absl::string_view source,
                                         const std::vector<std::string>& overrides) {
  // A key twice in one object: nlohmann keeps the last value; refused instead (one of the two
  // values would be lost without a word).
  std::vector<std::set<std::string>> open;  // the keys of each object being read
  std::string twice;
  const nlohmann::json::parser_callback_t keys = [&](int, nlohmann::json::parse_event_t event,
                                                     nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) open.emplace_back();
    if (event == Event::object_end && !open.empty()) open.pop_back();
    if (event == Event::key && !open.empty() && twice.empty() &&
        !open.back().insert(parsed.get<std::string>()).second) {
      twice = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json tree = nlohmann::json::parse(json.begin(), json.end(), keys,
                                              /*allow_exceptions=*/false);
  if (!tree.is_discarded() && !twice.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("job spec ", source, ": the key '",
                                                   twice.size() > 80 ? twice.substr(0, 80) : twice,
                                                   "' appears twice in one object; keep one"));
  }
  if (tree.is_discarded()) {
    // protobuf's parser names the line and column of the error.
    JobSpec spec;
    absl::Status st = runtime::ProtoFromJson(json, &spec, absl::StrCat("job spec ", source));
    return absl::InvalidArgumentError(
        st.ok() ? absl::StrCat("job spec ", source, " is not valid JSON") : st.message());
  }
  return FromJsonTree(std::move(tree), source, overrides);
}

absl::StatusOr<JobSpec> ParseJobSpecYaml(absl::string_view yaml, absl::string_view source,
                                         const std::vector<std::string>& overrides) {
  nlohmann::json json;
  try {
    YAML::Node root = YAML::Load(std::string(yaml));
    if (!root.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat("job spec ", source, ": expected a YAML mapping at the top level"));
    }
    json = YamlToJson(root);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec ", source, " is not valid YAML: ", e.what()));
  }
  return FromJsonTree(std::move(json), source, overrides);
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path,
                                        const std::vector<std::string>& overrides) {
  ASSIGN_OR_RETURN(std::string text, runtime::ReadFileToString(path, "job spec file"));
  if (absl::EndsWith(path, ".json")) return ParseJobSpecJson(text, path, overrides);
  if (absl::EndsWith(path, ".yaml") || absl::EndsWith(path, ".yml")) {
    return ParseJobSpecYaml(text, path, overrides);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("job spec file '", path, "': unknown extension, use .json, .yaml or .yml"));
}

std::string JobSpecToJson(const JobSpec& spec) {
  return runtime::ProtoToJson(spec, runtime::ProtoJsonPrint::Pretty());
}

void ResolveDefaults(JobSpec* spec) {
  if (spec->name().empty()) spec->set_name("job");
  offload::NormalizeMode(spec);
  auto* model = spec->mutable_model();
  // A model id ("org/name") that is no path here: its snapshot in the local Hugging Face cache
  // (runtime/hf_cache.h). Left as it is when the cache lacks it: ValidateJobSpec says why.
  for (std::string* path : {model->mutable_path(), model->mutable_tokenizer_path()}) {
    std::error_code ec;
    if (runtime::LooksLikeModelId(*path) && !std::filesystem::exists(*path, ec)) {
      if (absl::StatusOr<std::string> dir = runtime::ResolveHfCacheModel(*path); dir.ok()) {
        *path = *std::move(dir);
      }
    }
  }
  if (model->format() == v1::MODEL_FORMAT_UNSPECIFIED) {
    model->set_format(runtime::IsDirectory(model->path()) ? v1::MODEL_FORMAT_HF
                                                          : v1::MODEL_FORMAT_GGUF);
  }
  if (model->init_seed() == 0) model->set_init_seed(spec->seed());
  if (model->tokenizer_path().empty()) model->set_tokenizer_path(model->path());
  auto* data = spec->mutable_data();
  if (data->format() == v1::DATA_FORMAT_UNSPECIFIED) {
    data->set_format(DetectDataFormat(data->train_path()));
  }
  if (data->question().empty()) data->set_question("Is this message spam or ham?");
  auto* lsp = spec->mutable_lsp();
  if (lsp->d() == 0 && lsp->d_ratio() == 0) lsp->set_d(128);
  if (lsp->r() == 0) lsp->set_r(4);
  if (lsp->alpha() == 0) lsp->set_alpha(0.8);
  if (lsp->fit_iters() == 0) lsp->set_fit_iters(40);
  if (lsp->fit_lr() == 0) lsp->set_fit_lr(0.05);
  if (lsp->calibration_examples() == 0) lsp->set_calibration_examples(64);
  if (lsp->master_refresh() == v1::MASTER_REFRESH_UNSPECIFIED) {
    lsp->set_master_refresh(v1::MASTER_REFRESH_REFIT);
  }
  if (spec->schedule() == v1::STEP_SCHEDULE_UNSPECIFIED) {
    spec->set_schedule(v1::STEP_SCHEDULE_OVERLAP);
  }
  // An unset device is resolved by the worker (cuda when it sees a device); so is the dtype
  // then (bf16 on the GPU, fp32 on the CPU).
  if (spec->weight_dtype() == v1::WEIGHT_DTYPE_UNSPECIFIED &&
      spec->device() != v1::DEVICE_UNSPECIFIED) {
    spec->set_weight_dtype(spec->device() == v1::DEVICE_CUDA ? v1::WEIGHT_DTYPE_BF16
                                                             : v1::WEIGHT_DTYPE_FP32);
  }
  // The mode's own block (lora: PEFT's defaults; galore: GaLore's), training_mode.h.
  if (const offload::ModeDescriptor& m = offload::ModeOf(*spec); m.resolve_defaults != nullptr) {
    m.resolve_defaults(spec);
  }
  auto* optim = spec->mutable_optim();
  if (optim->lr() == 0) optim->set_lr(1e-4);
  if (optim->beta1() == 0) optim->set_beta1(0.9);
  if (optim->beta2() == 0) optim->set_beta2(0.999);
  if (optim->eps() == 0) optim->set_eps(1e-8);
  if (optim->schedule() == v1::LR_SCHEDULE_UNSPECIFIED) {
    optim->set_schedule(v1::LR_SCHEDULE_CONSTANT);
  }
  // micro_batch_size stays unset where a CUDA worker may choose it (issue 42; LoadJob says
  // which it took); elsewhere 8, as before.
  if (spec->has_micro_batch_size() && spec->micro_batch_size() == 0) {
    spec->clear_micro_batch_size();
  }
  if (!spec->has_micro_batch_size() &&
      (spec->device() == v1::DEVICE_CPU || spec->distributed().world_size() > 1)) {
    spec->set_micro_batch_size(8);
  }
  if (spec->grad_accum() == 0) spec->set_grad_accum(1);
  if (spec->seq_len() == 0) spec->set_seq_len(128);
  if (spec->keep_checkpoints() == 0) spec->set_keep_checkpoints(2);
  if (spec->num_threads() == 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    spec->set_num_threads(n > 0 ? static_cast<int>(n) : 1);
  }
}

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
static absl::Status ValidateData(const JobSpec& spec, bool check_files) {
  const auto& data = spec.data();
  if (data.format() == v1::DATA_FORMAT_UNSPECIFIED || !v1::DataFormat_IsValid(data.format())) {
    return Bad("data.format", runtime::EnumShortName(data.format()),
               "use classification, text, alpaca, chat or prompt_completion");
  }
  if (data.train_path().empty()) {
    return Bad("data.train_path", "\"\"", "give a training data file");
  }
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

absl::Status CheckPathsUnderRoots(const lspo::v1::JobSpec& spec,
                                  const std::vector<std::string>& roots) {
  // The field list and the resolution are shared with the worker and the optimizer, which
  // check the same spec again at LoadJob.
  return offload::CheckJobSpecPaths(spec,
                                    runtime::AllowedRoots(roots, "scheduler", "lsp_scheduler"));
}

std::string TrainingFingerprint(lspo::v1::JobSpec spec) {
  // A spec of mode galore with galore.offload (before MODE_GALORE_OFFLOAD) is the same training.
  offload::NormalizeMode(&spec);
  // Fields that do not change the training trajectory (bookkeeping, evaluation, threads,
  // schedule: serial and overlap give bitwise-identical weights).
  spec.clear_name();
  spec.clear_steps();
  spec.clear_epochs();  // How long, like steps (a resumed job may train longer).
  spec.clear_output_dir();
  spec.clear_resume_from();
  spec.clear_overwrite_output_dir();
  spec.clear_checkpoint_every();
  spec.clear_keep_checkpoints();
  spec.clear_eval_every();
  spec.clear_eval();
  spec.clear_skip_initial_eval();
  spec.clear_skip_checkpoint();
  spec.clear_num_threads();
  spec.clear_schedule();
  spec.clear_device();
  spec.clear_device_memory_limit_mb();
  // Recomputing a layer gives the values it kept, and a CUDA worker may turn it on by itself
  // (issue 42): not part of the training. Cleared also so that an explicit `false` (present
  // since the field became optional) equals the unset field of an older checkpoint.
  spec.clear_activation_checkpointing();
  // Where and as which rank each process of a data-parallel job runs does not change the
  // training (every rank holds the same state); the world size does (the batch is W times the
  // micro-batches of one rank). One rank is written as no distributed block.
  const int world_size = spec.distributed().world_size();
  spec.clear_distributed();
  if (world_size > 1) spec.mutable_distributed()->set_world_size(world_size);
  spec.mutable_data()->clear_eval_path();
  spec.mutable_data()->clear_max_eval_examples();
  spec.mutable_data()->clear_perplexity_path();
  spec.mutable_data()->clear_perplexity_blocks();
  // A default written out is the same training as the field left unset (and as a
  // fingerprint written before the field existed); lsp.narrow is not used with d_ratio.
  auto* lsp = spec.mutable_lsp();
  if (lsp->narrow() == lspo::v1::NARROW_RULE_ONE_SIDED || lsp->d_ratio() != 0) {
    lsp->clear_narrow();
  }
  if (lsp->apply_rounding() == lspo::v1::APPLY_ROUNDING_COMPENSATED) lsp->clear_apply_rounding();
  if (lsp->compression() == lspo::v1::COMPRESSION_SPARSE) lsp->clear_compression();
  return runtime::ProtoToJson(spec);
}

int StepsForEpochs(const JobSpec& spec, int64_t train_rows) {
  const int64_t world = std::max(1, spec.distributed().world_size());
  const int64_t batch = std::max<int64_t>(1, spec.micro_batch_size()) * world;
  const int64_t batches = (std::max<int64_t>(0, train_rows) + batch - 1) / batch;
  const int64_t per_epoch = std::max<int64_t>(1, batches / std::max(1, spec.grad_accum()));
  const double steps = std::ceil(spec.epochs() * static_cast<double>(per_epoch));
  return static_cast<int>(std::clamp(steps, 1.0, 2147483647.0));
}

void TakeChosenSettingsFrom(const std::string& fingerprint, lspo::v1::JobSpec* spec) {
  lspo::v1::JobSpec stored;
  if (!runtime::ProtoFromJson(fingerprint, &stored, "training_fingerprint").ok()) return;
  if (!spec->has_micro_batch_size() && stored.micro_batch_size() > 0) {
    spec->set_micro_batch_size(stored.micro_batch_size());
  }
}

bool SameTraining(const std::string& fingerprint, const lspo::v1::JobSpec& spec) {
  lspo::v1::JobSpec stored;
  if (!runtime::ProtoFromJson(fingerprint, &stored, "training_fingerprint").ok()) return false;
  return TrainingFingerprint(stored) == TrainingFingerprint(spec);
}

std::string TrainingDifferences(const std::string& fingerprint, const lspo::v1::JobSpec& spec) {
  lspo::v1::JobSpec stored, a, b;
  if (!runtime::ProtoFromJson(fingerprint, &stored, "training_fingerprint").ok()) {
    return "the fingerprint cannot be read";
  }
  if (!runtime::ProtoFromJson(TrainingFingerprint(stored), &a, "training_fingerprint").ok() ||
      !runtime::ProtoFromJson(TrainingFingerprint(spec), &b, "training_fingerprint").ok()) {
    return "the fingerprint cannot be read";
  }
  return runtime::ProtoDifferences(a, b, 1000);
}

}  // namespace lspo::spec
