#include "gpu_worker/job_assets.h"

#include "absl/strings/str_cat.h"
#include "model/gguf.h"
#include "model/llama_config.h"

namespace lspo::worker {
namespace {

absl::Status Prefix(const absl::Status& s, absl::string_view what, const std::string& path) {
  return absl::Status(s.code(), absl::StrCat(what, " '", path, "': ", s.message()));
}

}  // namespace

absl::StatusOr<model::BpeTokenizer> LoadJobTokenizer(const lspo::v1::JobSpec& spec) {
  const std::string& path = spec.model().tokenizer_path().empty()
                                ? spec.model().path()
                                : spec.model().tokenizer_path();
  auto file = model::GgufFile::Open(path);
  if (!file.ok()) return Prefix(file.status(), "tokenizer file", path);
  auto tok = model::BpeTokenizer::FromGguf(*file);
  if (!tok.ok()) return Prefix(tok.status(), "tokenizer in", path);
  return tok;
}

absl::StatusOr<model::LlamaModel> LoadJobModel(const lspo::v1::JobSpec& spec) {
  const auto& m = spec.model();
  if (m.format() == "gguf") {
    auto file = model::GgufFile::Open(m.path());
    if (!file.ok()) return Prefix(file.status(), "model file", m.path());
    auto model = model::LlamaModel::FromGguf(*file);
    if (!model.ok()) return Prefix(model.status(), "model file", m.path());
    return model;
  }
  if (m.format() == "tiny-random") {
    auto tok = LoadJobTokenizer(spec);
    if (!tok.ok()) return tok.status();
    model::LlamaConfig config = model::TinyLlamaConfig(tok->vocab_size());
    return model::LlamaModel::RandomInit(config, m.init_seed());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "job spec field model.format = ", m.format(), ": use \"gguf\" or \"tiny-random\""));
}

}  // namespace lspo::worker
