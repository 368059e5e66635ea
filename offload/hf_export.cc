#include "offload/hf_export.h"

#include "absl/strings/str_cat.h"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"

namespace lspo::offload {

absl::Status WriteModelSafetensors(const NamedTensors& tensors, const std::string& path,
                                   at::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    return absl::InvalidArgumentError(absl::StrCat("model file ", path, ": cannot write ",
                                                   c10::toString(dtype), "; use fp32 or bf16"));
  }
  NamedTensors out;
  out.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    // Through fp32, so that bf16 is the fp32 value rounded once (nearest even).
    out.emplace_back(name, t.detach().cpu().to(at::kFloat).to(dtype));
  }
  return WriteTensorFile(path, out, {{"format", "pt"}});
}

at::ScalarType SaveDtypeOf(const lspo::v1::JobSpec& spec) {
  return spec.save_dtype() == lspo::v1::WEIGHT_DTYPE_BF16 ? at::kBFloat16 : at::kFloat;
}

absl::StatusOr<std::vector<std::string>> WriteHfModelFolder(
    const model::LlamaConfig& config, const model::BpeTokenizer& tokenizer,
    const std::string& generation_config_source, const NamedTensors* weights,
    const std::string& dir, at::ScalarType dtype) {
  if (runtime::IsRegularFile(dir)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model folder '", dir, "' is a file; give a directory path"));
  }
  RETURN_IF_ERROR(runtime::MakeDirs(dir));
  std::vector<std::string> files;
  const std::string config_path = dir + "/config.json";
  RETURN_IF_ERROR(runtime::WriteFileAtomically(
      config_path,
      config.ToHfConfigJson(dtype == at::kBFloat16 ? "bfloat16" : "float32").dump(2) + "\n"));
  files.push_back(config_path);

  const std::string gen_path = dir + "/generation_config.json";
  std::string gen_text;
  if (!generation_config_source.empty() && runtime::IsRegularFile(generation_config_source)) {
    ASSIGN_OR_RETURN(gen_text,
                     runtime::ReadFileToString(generation_config_source, "generation_config.json"));
  } else {
    gen_text = config.ToHfGenerationConfigJson().dump(2) + "\n";
  }
  RETURN_IF_ERROR(runtime::WriteFileAtomically(gen_path, gen_text));
  files.push_back(gen_path);

  RETURN_IF_ERROR(tokenizer.WriteHfFiles(dir));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                        "chat_template.jinja"}) {
    const std::string path = absl::StrCat(dir, "/", f);
    if (runtime::IsRegularFile(path)) files.push_back(path);
  }

  if (weights != nullptr) {
    const std::string path = dir + "/model.safetensors";
    RETURN_IF_ERROR(WriteModelSafetensors(*weights, path, dtype));
    files.push_back(path);
  }
  return files;
}

}  // namespace lspo::offload
