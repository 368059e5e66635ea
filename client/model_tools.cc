#include "client/model_tools.h"

#include <unistd.h>

#include "third_party/torch/torch_api.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "gpu_worker/worker_core.h"
#include "model/generate.h"
#include "model/hf_checkpoint.h"
#include "model/llama.h"
#include "nlohmann/json.hpp"
#include "offload/hf_export.h"
#include "offload/job_assets.h"
#include "offload/memory_plan.h"
#include "offload/torch_call.h"
#include "offload/training_mode.h"
#include "proto/job_spec.pb.h"
#include "runtime/file_io.h"
#include "runtime/hf_cache.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"
#include "runtime/utf8.h"
#include "spec/job_spec.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace lspo::client {
namespace {

// A job spec that names `model` (format detected from the path) and nothing else trained.
lspo::v1::JobSpec ModelSpec(const std::string& model, int32_t num_threads) {
  lspo::v1::JobSpec spec;
  spec.mutable_model()->set_path(model);
  spec.set_num_threads(num_threads);
  // No optimizer service: the worker alone (the native mode's descriptor).
  spec.set_mode((*offload::ModeByName("native"))->mode);
  spec.set_steps(1);
  spec.set_skip_checkpoint(true);
  return spec;
}

absl::StatusOr<model::ChatMessage> Message(const nlohmann::json& m, const std::string& where) {
  if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
      !m["content"].is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected a message {\"role\": \"user\", \"content\": \"...\"}; got ",
                     m.dump().substr(0, 120)));
  }
  const std::string role = m["role"].get<std::string>();
  if (role != "system" && role != "user" && role != "assistant") {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": role \"", role,
                     "\"; supported roles: system, user, assistant (as in "
                     "training data, docs/data.md)"));
  }
  return model::ChatMessage{role, m["content"].get<std::string>()};
}

// `model` as given, or, for a model id ("org/name") that names nothing here, its snapshot folder
// in the local Hugging Face cache (runtime/hf_cache.h). Errors: the cache's (kNotFound naming
// the cache folder and the fix, kFailedPrecondition), prefixed with --model.
absl::StatusOr<std::string> ResolveModelArg(const std::string& model) {
  std::error_code ec;
  if (!runtime::LooksLikeModelId(model) || std::filesystem::exists(model, ec)) return model;
  absl::StatusOr<std::string> dir = runtime::ResolveHfCacheModel(model);
  if (!dir.ok()) {
    return absl::Status(dir.status().code(), absl::StrCat("--model: ", dir.status().message()));
  }
  return *dir;
}

// --model must be an HF folder (with config.json) or a .gguf file; says which fix applies.
absl::Status CheckModelPath(const std::string& path) {
  if (runtime::IsDirectory(path)) {
    if (model::IsHfModelFolder(path)) return absl::OkStatus();
    if (runtime::IsRegularFile(path + "/adapter_config.json")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--model '", path,
          "' is a PEFT adapter folder, not a model: give the base model as "
          "--model and this folder as --adapter (or, for a lora job's output, the output "
          "folder itself, which holds the merged model)"));
    }
    return absl::NotFoundError(
        absl::StrCat("--model '", path,
                     "' is a folder without config.json: not a Hugging Face model "
                     "folder (give the folder save_pretrained or a job wrote)"));
  }
  if (!runtime::IsRegularFile(path)) {
    return absl::NotFoundError(absl::StrCat("--model '", path, "' does not exist"));
  }
  if (!absl::EndsWith(path, ".gguf")) {
    const std::string parent = path.substr(0, path.find_last_of('/') + 1);
    return absl::InvalidArgumentError(absl::StrCat(
        "--model '", path, "' is a file but not a .gguf; give a GGUF file or the model folder",
        parent.empty() ? "" : absl::StrCat(" (e.g. --model=", parent, ")")));
  }
  return absl::OkStatus();
}

// Applies --threads: 0 = all cores; more than the cores is capped (oversubscription only
// slows LibTorch down). kInvalidArgument when negative.
absl::Status SetThreads(int32_t threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--threads=", threads, ": give 0 (all cores) or a positive count"));
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (threads > 0) at::set_num_threads(std::min(threads, cores));
  return absl::OkStatus();
}

// Conversations of a chat file (see GenerateCommand::chat_file).
absl::StatusOr<std::vector<std::vector<model::ChatMessage>>> ReadChats(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, runtime::ReadFileToString(path, "--chat file"));
  std::vector<std::vector<model::ChatMessage>> chats;
  std::vector<model::ChatMessage> single;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::string where = absl::StrCat(path, ":", line_no);
    if (size_t bad = 0; !runtime::IsValidUtf8(line, &bad)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": invalid UTF-8 at byte ", bad + 1,
                                                     " of the line; the file must be UTF-8"));
    }
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not valid JSON"));
    }
    if (j.is_object() && j.contains("messages")) {
      if (!j["messages"].is_array() || j["messages"].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": \"messages\" must be a non-empty list of messages"));
      }
      std::vector<model::ChatMessage> chat;
      for (const auto& m : j["messages"]) {
        ASSIGN_OR_RETURN(model::ChatMessage msg, Message(m, where));
        chat.push_back(std::move(msg));
      }
      chats.push_back(std::move(chat));
    } else {
      ASSIGN_OR_RETURN(model::ChatMessage msg, Message(j, where));
      single.push_back(std::move(msg));
    }
  }
  if (!single.empty() && !chats.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": mixes {\"messages\": [...]} lines with bare message lines; use one form"));
  }
  if (!single.empty()) chats.push_back(std::move(single));
  if (chats.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no conversation"));
  return chats;
}

// Extra stop ids: the tokenizer's eos and generation_config.json's eos list.
std::vector<int64_t> ExtraStops(const std::string& model_path, const model::BpeTokenizer& tok) {
  std::vector<int64_t> extra = {tok.eos_id()};
  auto ckpt_gen = runtime::IsDirectory(model_path)
                      ? runtime::ReadFileToString(model_path + "/generation_config.json")
                      : absl::StatusOr<std::string>(absl::NotFoundError(""));
  if (ckpt_gen.ok()) {
    // A generation_config.json that does not parse adds no stop ids.
    absl::StatusOr<std::vector<int64_t>> eos =
        model::GenerationConfigEosIds(*ckpt_gen, model_path + "/generation_config.json");
    if (eos.ok()) extra.insert(extra.end(), eos->begin(), eos->end());
  }
  return extra;
}

// True when the file at `path` starts with the GGUF magic.
bool HasGgufMagic(const std::string& path) {
  char magic[4] = {0};
  std::ifstream in(path, std::ios::binary);
  return in.read(magic, sizeof(magic)) && std::string(magic, sizeof(magic)) == "GGUF";
}

// --output_dir of convert: absent, or an empty folder; anything else is refused with the fix.
absl::Status CheckNewOutputDir(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(dir, ec);
  if (!std::filesystem::exists(st)) return absl::OkStatus();
  if (!std::filesystem::is_directory(st)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output_dir '", dir, "' exists and is a file; give a new folder path"));
  }
  if (!std::filesystem::is_empty(dir, ec) || ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--output_dir '", dir,
                     "' exists and is not empty; convert does not overwrite: give a "
                     "new folder (or remove this one first)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunGenerate(const GenerateCommand& given, std::FILE* out, std::FILE* err) {
  GenerateCommand cmd = given;
  ASSIGN_OR_RETURN(cmd.model, ResolveModelArg(given.model));
  if (cmd.prompt.empty() == cmd.chat_file.empty()) {
    return absl::InvalidArgumentError(
        "lspctl generate: give exactly one of --prompt=TEXT and --chat=FILE.jsonl");
  }
  RETURN_IF_ERROR(SetThreads(cmd.num_threads));
  RETURN_IF_ERROR(CheckModelPath(cmd.model));
  std::vector<std::vector<model::ChatMessage>> chats;
  if (!cmd.chat_file.empty()) {
    ASSIGN_OR_RETURN(chats, ReadChats(cmd.chat_file));
  }
  lspo::v1::JobSpec spec = ModelSpec(cmd.model, cmd.num_threads);
  spec.mutable_model()->set_adapter_path(cmd.adapter);
  spec::ResolveDefaults(&spec);
  ASSIGN_OR_RETURN(model::BpeTokenizer tok, offload::LoadJobTokenizer(spec));
  ASSIGN_OR_RETURN(model::LlamaModel m, offload::LoadJobModel(spec));
  RETURN_IF_ERROR(offload::CheckTokenizerFitsModel(tok, m.config(), spec));
  std::vector<std::vector<int32_t>> prompts;
  if (!cmd.prompt.empty()) {
    std::vector<int32_t> ids;
    if (tok.adds_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
    std::vector<int32_t> body = tok.Encode(cmd.prompt);
    ids.insert(ids.end(), body.begin(), body.end());
    prompts.push_back(std::move(ids));
  } else {
    auto tmpl = model::ChatTemplate::ForTokenizer(tok, cmd.chat_template);
    if (!tmpl.ok()) {
      return absl::Status(tmpl.status().code(),
                          absl::StrCat("model '", cmd.model, "': ", tmpl.status().message()));
    }
    for (size_t i = 0; i < chats.size(); ++i) {
      auto text = tmpl->Render(chats[i], /*add_generation_prompt=*/true);
      if (!text.ok()) {
        return absl::Status(
            text.status().code(),
            absl::StrCat(cmd.chat_file, ": conversation ", i + 1, ": ", text.status().message()));
      }
      if (text->text.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(cmd.chat_file, ": conversation ", i + 1,
                         ": the chat template renders it as empty "
                         "text; check the template (--chat_template or the model's)"));
      }
      prompts.push_back(tok.Encode(text->text));
    }
  }
  // Past the trained context RoPE extrapolates and the prompt's attention grows as T^2:
  // refuse rather than produce garbage or exhaust memory.
  const int64_t limit = m.config().max_position_embeddings;
  for (const auto& p : prompts) {
    const int64_t total = static_cast<int64_t>(p.size()) + cmd.max_new_tokens;
    if (total > limit) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the prompt (", p.size(), " tokens) plus --max_new_tokens=", cmd.max_new_tokens, " is ",
          total, " positions, more than the model's max_position_embeddings ", limit, " (",
          cmd.model, " config); shorten the prompt or lower --max_new_tokens"));
    }
  }
  model::GenerationOptions options;
  options.max_new_tokens = cmd.max_new_tokens;
  options.temperature = cmd.temperature;
  options.top_k = cmd.top_k;
  options.top_p = cmd.top_p;
  options.seed = cmd.seed;
  options.stop_ids = model::StopIds(m.config(), ExtraStops(cmd.model, tok));
  for (size_t i = 0; i < prompts.size(); ++i) {
    if (prompts.size() > 1) std::fprintf(out, "%s--- reply %zu\n", i > 0 ? "\n" : "", i + 1);
    std::vector<int32_t> generated;
    size_t printed = 0;
    auto stream = [&](int32_t id) {
      generated.push_back(id);
      // Decoding the whole reply each time keeps multi-byte characters and SentencePiece
      // spacing right; the stop token itself is not printed.
      if (std::find(options.stop_ids.begin(), options.stop_ids.end(), id) !=
          options.stop_ids.end()) {
        return;
      }
      const std::string text = tok.Decode(generated);
      if (text.size() > printed) {
        std::fwrite(text.data() + printed, 1, text.size() - printed, out);
        std::fflush(out);
        printed = text.size();
      }
    };
    ASSIGN_OR_RETURN(model::GenerationResult r, model::Generate(m, prompts[i], options, stream));
    std::fprintf(out, "\n");
    std::fprintf(err, "[%zu tokens, %.1f tokens/s, prompt %zu tokens in %.2f s, %s]\n",
                 r.tokens.size(), r.tokens_per_second(), prompts[i].size(), r.prefill_seconds,
                 r.stopped ? "stopped at eos" : "reached max_new_tokens");
  }
  return absl::OkStatus();
}

std::string EvalFormat(const EvalCommand& cmd) {
  if (!cmd.format.empty()) return cmd.format;
  if (absl::EndsWith(cmd.data, ".tsv")) return "classification";
  if (absl::EndsWith(cmd.data, ".jsonl") || absl::EndsWith(cmd.data, ".json")) {
    lspo::v1::JobSpec probe;
    probe.mutable_data()->set_train_path(cmd.data);
    spec::ResolveDefaults(&probe);  // detected from the keys of the first record
    return runtime::EnumShortName(probe.data().format());
  }
  return "text";
}

absl::StatusOr<lspo::v1::EvalMetrics> RunEval(const EvalCommand& given) {
  EvalCommand cmd = given;
  ASSIGN_OR_RETURN(cmd.model, ResolveModelArg(given.model));
  RETURN_IF_ERROR(SetThreads(cmd.num_threads));
  RETURN_IF_ERROR(CheckModelPath(cmd.model));
  if (cmd.data.empty()) return absl::InvalidArgumentError("lspctl eval: give --data=FILE");
  if (!runtime::IsRegularFile(cmd.data)) {
    return absl::NotFoundError(absl::StrCat("--data '", cmd.data, "' is not a readable file"));
  }
  if (!cmd.perplexity_path.empty() && !runtime::IsRegularFile(cmd.perplexity_path)) {
    return absl::NotFoundError(
        absl::StrCat("--perplexity_path '", cmd.perplexity_path, "' is not a readable file"));
  }
  lspo::v1::JobSpec spec = ModelSpec(cmd.model, cmd.num_threads);
  spec.mutable_model()->set_adapter_path(cmd.adapter);
  auto* data = spec.mutable_data();
  data->set_train_path(cmd.data);
  data->set_eval_path(cmd.data);
  data->set_max_train_examples(1);
  data->set_max_eval_examples(cmd.max_examples);
  data->set_perplexity_path(cmd.perplexity_path);
  data->set_question(cmd.question);
  data->set_system_prompt(cmd.system_prompt);
  data->set_chat_template(cmd.chat_template);
  const std::string format = EvalFormat(cmd);
  static const std::pair<const char*, lspo::v1::DataFormat> kFormats[] = {
      {"classification", lspo::v1::DATA_FORMAT_CLASSIFICATION},
      {"text", lspo::v1::DATA_FORMAT_TEXT},
      {"alpaca", lspo::v1::DATA_FORMAT_ALPACA},
      {"chat", lspo::v1::DATA_FORMAT_CHAT},
      {"prompt_completion", lspo::v1::DATA_FORMAT_PROMPT_COMPLETION}};
  auto known = std::find_if(std::begin(kFormats), std::end(kFormats),
                            [&](const auto& f) { return format == f.first; });
  if (known == std::end(kFormats)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lspctl eval: --format=", format,
                     " is not a data format; use classification, text, "
                     "alpaca, chat or prompt_completion"));
  }
  data->set_format(known->second);
  spec.set_seq_len(cmd.seq_len);
  spec::ResolveDefaults(&spec);
  RETURN_IF_ERROR(spec::ValidateJobSpec(spec));
  worker::WorkerCore core;
  RETURN_IF_ERROR(core.LoadJob("eval", spec).status());
  auto metrics = core.Evaluate("eval", 0);
  core.UnloadJob("eval").IgnoreError();
  return metrics;
}

absl::Status RunConvert(const ConvertCommand& cmd) {
  if (cmd.model.empty()) {
    return absl::InvalidArgumentError("lspctl convert: give --model=FILE.gguf");
  }
  if (cmd.output_dir.empty()) {
    return absl::InvalidArgumentError(
        "lspctl convert: give --output_dir=DIR (a new or empty folder)");
  }
  RETURN_IF_ERROR(SetThreads(cmd.num_threads));
  if (runtime::IsDirectory(cmd.model)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model '", cmd.model,
                     "' is a folder; convert reads a GGUF file (a Hugging Face model "
                     "folder needs no conversion: give it as --model or model.path)"));
  }
  if (!runtime::IsRegularFile(cmd.model)) {
    return absl::NotFoundError(absl::StrCat("--model '", cmd.model, "' does not exist"));
  }
  if (!HasGgufMagic(cmd.model)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model '", cmd.model,
                     "' is not a GGUF file (it does not start with \"GGUF\"); give "
                     "a llama.cpp GGUF model file"));
  }
  RETURN_IF_ERROR(CheckNewOutputDir(cmd.output_dir));
  lspo::v1::JobSpec spec = ModelSpec(cmd.model, cmd.num_threads);
  spec.mutable_model()->set_format(lspo::v1::MODEL_FORMAT_GGUF);
  ASSIGN_OR_RETURN(model::BpeTokenizer tok, offload::LoadJobTokenizer(spec));
  ASSIGN_OR_RETURN(model::LlamaModel m, offload::LoadJobModel(spec));
  RETURN_IF_ERROR(offload::CheckTokenizerFitsModel(tok, m.config(), spec));

  // Written under a temporary name beside the destination, then renamed into place (rename(2)
  // replaces an empty folder), so the destination is either absent/empty or complete.
  std::string dest = cmd.output_dir;
  while (dest.size() > 1 && dest.back() == '/') dest.pop_back();
  const std::string tmp = absl::StrCat(dest, ".convert-tmp-", ::getpid());
  std::error_code ec;
  std::filesystem::remove_all(tmp, ec);
  const offload::NamedTensors weights = m.NamedTensors();
  absl::Status st = offload::TorchCall("convert", [&]() -> absl::Status {
    return offload::WriteHfModelFolder(m.config(), tok, /*generation_config_source=*/"", &weights,
                                       tmp)
        .status();
  });
  if (st.ok() && std::rename(tmp.c_str(), dest.c_str()) != 0) {
    st = runtime::FileErrnoStatus("rename", tmp + " -> " + dest, errno);
  }
  if (!st.ok()) {
    std::filesystem::remove_all(tmp, ec);
    return st;
  }
  const std::string parent = std::filesystem::path(dest).parent_path().string();
  return runtime::FsyncDir(parent.empty() ? "." : parent);
}

absl::StatusOr<offload::GgufExportResult> RunExport(const ExportCommand& given) {
  if (given.model.empty()) {
    return absl::InvalidArgumentError(
        "lspctl export: give --model=DIR (an HF model folder, e.g. a job's output_dir)");
  }
  if (!given.format.empty() && absl::AsciiStrToLower(given.format) != "gguf") {
    return absl::InvalidArgumentError(absl::StrCat(
        "lspctl export: --format=", given.format,
        " is not exported; --format=gguf writes a GGUF (a job's output_dir already is a "
        "Hugging Face folder, and --adapter folders are PEFT's)"));
  }
  ASSIGN_OR_RETURN(offload::GgufOutType type,
                   offload::ParseGgufOutType(given.outtype.empty() ? "auto" : given.outtype));
  ASSIGN_OR_RETURN(std::string model, ResolveModelArg(given.model));
  if (runtime::IsRegularFile(model)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--model '", model,
                     "' is a file; export reads a Hugging Face model folder (a GGUF "
                     "needs no export; `lspctl convert` turns one into a folder)"));
  }
  if (!runtime::IsDirectory(model)) {
    return absl::NotFoundError(absl::StrCat("--model '", model, "' does not exist"));
  }
  RETURN_IF_ERROR(CheckModelPath(model));
  return offload::ExportGguf(model, given.outfile, type);
}

absl::Status RunPlan(const PlanCommand& cmd, std::FILE* out) {
  lspo::v1::JobSpec spec = cmd.spec;
  if (cmd.device_memory_gb < 0 || !std::isfinite(cmd.device_memory_gb)) {
    return absl::InvalidArgumentError(absl::StrCat("--device_memory_gb=", cmd.device_memory_gb,
                                                   " must be a size in GiB, e.g. 4 or 24"));
  }
  if (!cmd.device.empty()) {
    if (cmd.device != "cpu" && cmd.device != "cuda") {
      return absl::InvalidArgumentError(
          absl::StrCat("--device=", cmd.device, " is not a device: use cpu or cuda"));
    }
    // The weights' dtype then follows the device planned for, unless the spec names one.
    spec.set_device(cmd.device == "cpu" ? lspo::v1::DEVICE_CPU : lspo::v1::DEVICE_CUDA);
  }
  const bool assumed_cuda = spec.device() == lspo::v1::DEVICE_UNSPECIFIED;
  spec::ResolveDefaults(&spec);
  // The checks a run makes first (but the data files'): a spec a run would refuse gets no plan.
  RETURN_IF_ERROR(spec::ValidateJobSpec(spec, /*check_data_files=*/false));
  const bool cuda = spec.device() != lspo::v1::DEVICE_CPU;
  ASSIGN_OR_RETURN(model::LlamaConfig config, offload::LoadJobModelConfig(spec));
  const lspo::v1::TrainingMode own = offload::ModeOf(spec).mode;
  std::vector<offload::MemoryPlan> plans;
  std::vector<std::string> left_out;
  for (const offload::ModeDescriptor& m : offload::AllModes()) {
    const lspo::v1::TrainingMode mode = m.mode;
    absl::StatusOr<offload::MemoryPlan> plan = offload::PlanJobMemory(spec, config, mode, cuda);
    if (plan.ok()) {
      plans.push_back(*plan);
    } else if (mode == own) {
      return plan.status();
    } else {
      left_out.push_back(absl::StrCat(m.name, ": ", plan.status().message()));
    }
  }
  const std::string title = absl::StrFormat(
      "memory plan of %s (%d layers, hidden %d, %d heads / %d kv heads, intermediate %d, vocab "
      "%d; %.1f M parameters, %.1f M in %d trained matrices)\n"
      "micro-batch %d x seq_len %d = %d tokens, grad_accum %d, activation checkpointing %s, "
      "worker on %s%s (%s trained weights); * = the job's mode",
      spec.model().path().empty() ? "a random model" : spec.model().path(), config.num_layers,
      config.hidden_size, config.num_heads, config.num_kv_heads, config.intermediate_size,
      config.vocab_size, config.NumParameters() / 1e6, plans[0].trained_parameters / 1e6,
      plans[0].trained_matrices, offload::MicroBatchOf(spec), spec.seq_len(),
      offload::MicroBatchOf(spec) * spec.seq_len(), spec.grad_accum(),
      spec.activation_checkpointing() ? "on" : "off", cuda ? "cuda" : "cpu",
      assumed_cuda ? " (the spec names no device: --device=cpu plans for the CPU)" : "",
      plans.empty() || plans[0].weight_bytes == 4 ? "fp32" : "bf16");
  std::fprintf(out, "%s", offload::FormatPlans(title, plans, own).c_str());
  for (const auto& l : left_out) std::fprintf(out, "not planned: %s\n", l.c_str());
  if (cmd.device_memory_gb <= 0) return absl::OkStatus();

  const int64_t card = static_cast<int64_t>(cmd.device_memory_gb * (1LL << 30));
  int64_t budget = cuda ? card - offload::kCudaContextBytes : card;
  std::string budget_note =
      cuda ? absl::StrFormat("%.2f GiB for LibTorch's allocator after %.2f GiB of CUDA context",
                             budget / double(1LL << 30),
                             offload::kCudaContextBytes / double(1LL << 30))
           : absl::StrFormat("%.2f GiB", budget / double(1LL << 30));
  if (cuda && spec.device_memory_limit_mb() > 0 &&
      (static_cast<int64_t>(spec.device_memory_limit_mb()) << 20) < budget) {
    budget = static_cast<int64_t>(spec.device_memory_limit_mb()) << 20;
    budget_note =
        absl::StrCat("the job's device_memory_limit_mb = ", spec.device_memory_limit_mb());
  }
  if (budget <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--device_memory_gb=%g leaves nothing for the job after %.2f GiB of CUDA context: give "
        "the card's memory, e.g. 4 or 24",
        cmd.device_memory_gb, offload::kCudaContextBytes / double(1LL << 30)));
  }
  std::fprintf(out, "\non a %.2f GiB %s (%s):\n", cmd.device_memory_gb, cuda ? "GPU" : "host",
               budget_note.c_str());
  for (const auto& plan : plans) {
    ASSIGN_OR_RETURN(offload::FitAnswer a,
                     offload::FitOnDevice(spec, config, plan.mode, cuda, budget));
    std::string line = absl::StrFormat(
        "  %-15s %s: peak %.2f GiB",
        absl::StrCat(offload::DescriptorOf(plan.mode).name, plan.mode == own ? " *" : ""),
        a.fits ? "fits" : "does not fit", plan.device_peak / double(1LL << 30));
    auto batches = [](int32_t mb) {
      return mb >= offload::kMaxPlannedMicroBatch ? absl::StrCat(">= ", mb) : absl::StrCat(mb);
    };
    const bool ckpt = spec.activation_checkpointing();
    if (a.largest_micro_batch > 0) {
      absl::StrAppend(&line, "; largest micro-batch ", batches(a.largest_micro_batch),
                      " at seq_len ", spec.seq_len());
      if (!ckpt) {
        absl::StrAppend(&line, " (", batches(a.largest_micro_batch_checkpointing),
                        " with activation checkpointing)");
      }
    } else if (!ckpt && a.largest_micro_batch_checkpointing > 0) {
      absl::StrAppend(&line, "; only with activation checkpointing (micro-batch <= ",
                      batches(a.largest_micro_batch_checkpointing), ")");
    } else {
      absl::StrAppend(&line, "; not even micro-batch 1",
                      ckpt ? "" : ", with or without activation checkpointing");
    }
    if (offload::DescriptorOf(plan.mode).learned_projectors) {  // lsp's d and rounding
      absl::StrAppend(&line, a.largest_d > 0 ? absl::StrCat("; largest lsp.d ", a.largest_d)
                                             : std::string("; no lsp.d fits"));
      if (a.fits_with_nearest_rounding) {
        absl::StrAppend(&line, "; fits with lsp.apply_rounding: stochastic or nearest");
      }
    }
    std::fprintf(out, "%s\n", line.c_str());
  }
  // What a CUDA worker chooses for the job's unset settings on this budget (issue 42).
  lspo::v1::JobSpec chosen = spec;
  ASSIGN_OR_RETURN(std::vector<std::string> choice,
                   offload::ChooseFittingDefaults(&chosen, config, own, cuda, budget));
  for (const std::string& line : choice) {
    std::fprintf(out, "the worker would choose: %s\n", line.c_str());
  }
  return absl::OkStatus();
}

}  // namespace lspo::client
