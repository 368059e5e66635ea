#include "offload/job_assets.h"

#include <memory>

#include "baselines/lora.h"

#include "absl/strings/str_cat.h"
#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "model/llama_config.h"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"

namespace lspo::offload {
namespace {

absl::Status Prefix(const absl::Status& s, absl::string_view what, const std::string& path) {
  return absl::Status(s.code(), absl::StrCat(what, " '", path, "': ", s.message()));
}

}  // namespace

absl::StatusOr<model::BpeTokenizer> LoadJobTokenizer(const lspo::v1::JobSpec& spec) {
  const std::string& path =
      spec.model().tokenizer_path().empty() ? spec.model().path() : spec.model().tokenizer_path();
  if (runtime::IsDirectory(path)) {
    auto tok = model::BpeTokenizer::FromHfFolder(path);
    if (!tok.ok()) return Prefix(tok.status(), "tokenizer of the model folder", path);
    return tok;
  }
  auto file = model::GgufFile::Open(path);
  if (!file.ok()) return Prefix(file.status(), "tokenizer file", path);
  auto tok = model::BpeTokenizer::FromGguf(*file);
  if (!tok.ok()) return Prefix(tok.status(), "tokenizer in", path);
  return tok;
}

absl::StatusOr<model::LlamaConfig> RandomLlamaConfig(const lspo::v1::LlamaShape& shape,
                                                     int64_t vocab_size) {
  model::LlamaConfig c = model::TinyLlamaConfig(vocab_size);
  if (shape.hidden_size() == 0) return c;
  c.hidden_size = shape.hidden_size();
  c.intermediate_size = shape.intermediate_size();
  c.num_layers = shape.num_hidden_layers();
  c.num_heads = shape.num_attention_heads();
  c.num_kv_heads = shape.num_key_value_heads();
  c.head_dim = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  c.max_position_embeddings = 2048;
  absl::Status st = c.Validate();
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec field model.random_shape is invalid: ", st.message(),
        ". Fix: give positive sizes with num_attention_heads dividing hidden_size (even "
        "head_dim) and num_key_value_heads dividing num_attention_heads"));
  }
  return c;
}

namespace {

// The base model of `spec` (LoadJobModel without the adapter).
absl::StatusOr<model::LlamaModel> LoadBaseModel(const lspo::v1::JobSpec& spec) {
  const auto& m = spec.model();
  if (m.format() == lspo::v1::MODEL_FORMAT_GGUF) {
    auto file = model::GgufFile::Open(m.path());
    if (!file.ok()) return Prefix(file.status(), "model file", m.path());
    auto model = model::LlamaModel::FromGguf(*file);
    if (!model.ok()) return Prefix(model.status(), "model file", m.path());
    return model;
  }
  if (m.format() == lspo::v1::MODEL_FORMAT_HF) {
    auto ckpt = model::HfCheckpoint::Open(m.path());
    if (!ckpt.ok()) return ckpt.status();  // messages name the folder and file
    return model::LlamaModel::FromHfCheckpoint(*ckpt);
  }
  if (m.format() == lspo::v1::MODEL_FORMAT_TINY_RANDOM) {
    auto tok = LoadJobTokenizer(spec);
    if (!tok.ok()) return tok.status();
    ASSIGN_OR_RETURN(model::LlamaConfig config,
                     RandomLlamaConfig(m.random_shape(), tok->vocab_size()));
    return model::LlamaModel::RandomInit(config, m.init_seed());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("job spec field model.format = ", static_cast<int>(m.format()),
                   ": use hf, gguf or tiny-random"));
}

}  // namespace

absl::StatusOr<model::LlamaConfig> LoadJobModelConfig(const lspo::v1::JobSpec& spec) {
  const auto& m = spec.model();
  if (m.format() == lspo::v1::MODEL_FORMAT_GGUF) {
    auto file = model::GgufFile::Open(m.path());
    if (!file.ok()) return Prefix(file.status(), "model file", m.path());
    auto config = model::LlamaConfigFromGguf(*file);
    if (!config.ok()) return Prefix(config.status(), "model file", m.path());
    return config;
  }
  if (m.format() == lspo::v1::MODEL_FORMAT_HF) {
    const std::string path = m.path() + "/config.json";
    ASSIGN_OR_RETURN(std::string text, runtime::ReadFileToString(path, "model config"));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::DataLossError(absl::StrCat("model config '", path,
                                              "' is not valid JSON; re-save the model folder with "
                                              "save_pretrained"));
    }
    return model::LlamaConfigFromHfJson(j, path);
  }
  if (m.format() == lspo::v1::MODEL_FORMAT_TINY_RANDOM) {
    ASSIGN_OR_RETURN(model::BpeTokenizer tok, LoadJobTokenizer(spec));
    return RandomLlamaConfig(m.random_shape(), tok.vocab_size());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("job spec field model.format = ", static_cast<int>(m.format()),
                   ": use hf, gguf or tiny-random"));
}

absl::StatusOr<model::LlamaModel> LoadJobModel(const lspo::v1::JobSpec& spec) {
  ASSIGN_OR_RETURN(model::LlamaModel model, LoadBaseModel(spec));
  const std::string& adapter_path = spec.model().adapter_path();
  if (adapter_path.empty()) return model;
  absl::StatusOr<std::shared_ptr<baselines::LoraAdapter>> adapter =
      baselines::ReadPeftAdapter(adapter_path, model);
  if (!adapter.ok()) {
    return absl::Status(adapter.status().code(), absl::StrCat("job spec field model.adapter_path: ",
                                                              adapter.status().message()));
  }
  at::NoGradGuard no_grad;
  for (int64_t i = 0; i < model.num_linears(); ++i) {
    if (!(*adapter)->targets(i)) continue;
    at::Tensor& w = model.LinearWeight(i);  // (m, n) fp32, as loaded
    w.copy_((*adapter)->MergedWeight(i, w));
  }
  return model;
}

absl::Status CheckTokenizerFitsModel(const model::BpeTokenizer& tokenizer,
                                     const model::LlamaConfig& config,
                                     const lspo::v1::JobSpec& spec) {
  if (tokenizer.vocab_size() <= config.vocab_size) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "the tokenizer of '", spec.model().tokenizer_path(), "' has ", tokenizer.vocab_size(),
      " ids but the model '", spec.model().path(), "' has vocab_size ", config.vocab_size,
      " embedding rows; they do not belong together (use the tokenizer files saved with "
      "the model)"));
}

}  // namespace lspo::offload
