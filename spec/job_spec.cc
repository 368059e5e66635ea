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

namespace {

// Whether the input model is stored in bf16, by its config.json's "torch_dtype" (or "dtype",
// the name transformers 5 writes): how save_pretrained would keep its dtype. False for every
// other model (GGUF, tiny-random) and for a config that cannot be read (ValidateJobSpec says
// why then).
bool InputDtypeIsBf16(const v1::ModelSpec& model) {
  if (model.format() != v1::MODEL_FORMAT_HF) return false;
  std::ifstream in(model.path() + "/config.json");
  if (!in) return false;
  const nlohmann::json config = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object()) return false;
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto it = config.find(key);
    if (it != config.end() && it->is_string()) return *it == "bfloat16";
  }
  return false;
}

}  // namespace

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
  if (spec->save_dtype() == v1::WEIGHT_DTYPE_UNSPECIFIED) {
    spec->set_save_dtype(InputDtypeIsBf16(*model) ? v1::WEIGHT_DTYPE_BF16 : v1::WEIGHT_DTYPE_FP32);
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
  spec.clear_save_dtype();  // What is written, not what is trained.
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
  if (lsp->refresh_every() == 0) lsp->clear_refresh_every();
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
  // The rounding and the rolling refresh it trained with. A fingerprint leaves out a
  // compensated rounding and a refresh_every of 0 (TrainingFingerprint), and before
  // 2026-12-07 an unset rounding meant compensated: absent reads as those.
  // The other modes' lsp block is not used (nor written out).
  if (!offload::ModeOf(*spec).learned_projectors) return;
  auto* lsp = spec->mutable_lsp();
  if (lsp->apply_rounding() == lspo::v1::APPLY_ROUNDING_UNSPECIFIED) {
    lsp->set_apply_rounding(stored.lsp().apply_rounding() == lspo::v1::APPLY_ROUNDING_UNSPECIFIED
                                ? lspo::v1::APPLY_ROUNDING_COMPENSATED
                                : stored.lsp().apply_rounding());
  }
  if (!lsp->has_refresh_every()) lsp->set_refresh_every(stored.lsp().refresh_every());
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
