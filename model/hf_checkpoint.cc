#include "model/hf_checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/file_io.h"
#include "runtime/json_text.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

// Parses `text`, the content of the JSON file `path` (`what` names its kind); kDataLoss
// (naming the file) when it is not valid JSON.
absl::StatusOr<nlohmann::json> ParseJsonText(absl::string_view text, const std::string& path,
                                             absl::string_view what) {
  nlohmann::json j =
      nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::DataLossError(absl::StrCat(what, " '", path,
                                            "' is not valid JSON; re-save the model folder "
                                            "with save_pretrained"));
  }
  return j;
}

// Parses the JSON file `path`; kDataLoss (naming it) when it is not valid JSON.
absl::StatusOr<nlohmann::json> ReadJson(const std::string& path, absl::string_view what) {
  ASSIGN_OR_RETURN(std::string text, runtime::ReadFileToString(path, what));
  return ParseJsonText(text, path, what);
}

absl::Status Prefixed(const absl::Status& s, const std::string& path) {
  return absl::Status(s.code(), absl::StrCat("weight file '", path, "': ", s.message()));
}

}  // namespace

absl::StatusOr<SafetensorsIndex> ParseSafetensorsIndex(absl::string_view text,
                                                       const std::string& index_path) {
  ASSIGN_OR_RETURN(nlohmann::json index, ParseJsonText(text, index_path, "safetensors index"));
  SafetensorsIndex out;
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::DataLossError(absl::StrCat("safetensors index '", index_path,
                                            "' has no \"weight_map\" object mapping tensor "
                                            "names to shard files"));
  }
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().empty() ||
        file.get<std::string>().find('/') != std::string::npos) {
      return absl::DataLossError(absl::StrCat("safetensors index '", index_path, "': weight_map[\"",
                                              name, "\"] is ", runtime::JsonForMessage(file),
                                              "; expected a shard file name in the folder"));
    }
    out.weight_map[name] = file.get<std::string>();
    if (std::find(out.shards.begin(), out.shards.end(), file.get<std::string>()) ==
        out.shards.end()) {
      out.shards.push_back(file.get<std::string>());
    }
  }
  std::sort(out.shards.begin(), out.shards.end());
  return out;
}

absl::StatusOr<std::vector<int64_t>> GenerationConfigEosIds(absl::string_view text,
                                                            const std::string& path) {
  ASSIGN_OR_RETURN(nlohmann::json g, ParseJsonText(text, path, "generation_config.json"));
  if (!g.is_object()) {
    return absl::DataLossError(absl::StrCat("generation_config.json '", path, "' is a ",
                                            g.type_name(), ", not a JSON object"));
  }
  std::vector<int64_t> ids;
  auto add = [&ids](const nlohmann::json& id) {
    if (id.is_number_unsigned()) {
      if (id.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
        ids.push_back(static_cast<int64_t>(id.get<uint64_t>()));
      }
    } else if (id.is_number_integer() && id.get<int64_t>() >= 0) {
      ids.push_back(id.get<int64_t>());
    }
  };
  const auto e = g.find("eos_token_id");
  if (e == g.end()) return ids;
  if (e->is_array()) {
    for (const auto& id : *e) add(id);
  } else {
    add(*e);
  }
  return ids;
}

bool IsHfModelFolder(const std::string& path) {
  return runtime::IsDirectory(path) && runtime::IsRegularFile(path + "/config.json");
}

absl::StatusOr<HfCheckpoint> HfCheckpoint::Open(const std::string& dir) {
  if (!runtime::IsDirectory(dir)) {
    return absl::NotFoundError(absl::StrCat("HF model folder '", dir,
                                            "' is not a directory; give the folder that "
                                            "holds config.json and the .safetensors files"));
  }
  HfCheckpoint c;
  c.dir_ = dir;
  const std::string config_path = dir + "/config.json";
  if (!runtime::IsRegularFile(config_path)) {
    return absl::NotFoundError(absl::StrCat("HF model folder '", dir,
                                            "' has no config.json; it is not a model folder "
                                            "saved by transformers' save_pretrained"));
  }
  ASSIGN_OR_RETURN(c.config_, ReadJson(config_path, "config.json"));
  const std::string gen_path = dir + "/generation_config.json";
  if (runtime::IsRegularFile(gen_path)) {
    ASSIGN_OR_RETURN(c.generation_config_, ReadJson(gen_path, "generation_config.json"));
  }

  // Weight files: model.safetensors, else the shards of the index.
  std::vector<std::string> shard_names;
  std::map<std::string, std::string> weight_map;  // from the index; empty for one file
  const std::string single = dir + "/model.safetensors";
  const std::string index_path = dir + "/model.safetensors.index.json";
  if (runtime::IsRegularFile(single)) {
    shard_names.push_back("model.safetensors");
  } else if (runtime::IsRegularFile(index_path)) {
    ASSIGN_OR_RETURN(std::string text, runtime::ReadFileToString(index_path, "safetensors index"));
    ASSIGN_OR_RETURN(SafetensorsIndex index, ParseSafetensorsIndex(text, index_path));
    weight_map = std::move(index.weight_map);
    shard_names = std::move(index.shards);
  } else {
    std::string hint;
    if (runtime::IsRegularFile(dir + "/pytorch_model.bin") ||
        runtime::IsRegularFile(dir + "/pytorch_model.bin.index.json")) {
      hint =
          " (it has pytorch_model.bin weights: re-save them with "
          "save_pretrained(..., safe_serialization=True))";
    }
    return absl::NotFoundError(absl::StrCat("HF model folder '", dir,
                                            "' has neither model.safetensors nor "
                                            "model.safetensors.index.json",
                                            hint));
  }

  for (const std::string& shard : shard_names) {
    const std::string path = dir + "/" + shard;
    if (!runtime::IsRegularFile(path)) {
      return absl::NotFoundError(absl::StrCat(
          "safetensors index '", index_path, "' names shard '", shard,
          "', which is not in the folder; copy the missing shard or re-save the model"));
    }
    auto file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      // A structurally broken file (truncated, bad header) is data loss whatever the reader
      // called it; other codes (unsupported dtype) pass through.
      const absl::StatusCode code = file.status().code() == absl::StatusCode::kUnimplemented
                                        ? absl::StatusCode::kUnimplemented
                                        : absl::StatusCode::kDataLoss;
      return Prefixed(absl::Status(code, file.status().message()), path);
    }
    const size_t idx = c.files_.size();
    for (const std::string& name : file->names()) {
      auto [it, inserted] = c.file_of_.emplace(name, idx);
      if (!inserted) {
        return absl::DataLossError(absl::StrCat("tensor '", name, "' appears in both '",
                                                c.file_paths_[it->second], "' and '", path,
                                                "'; the shards belong to different saves"));
      }
    }
    c.files_.push_back(std::make_unique<SafetensorsFile>(std::move(*file)));
    c.file_paths_.push_back(path);
  }
  for (const auto& [name, shard] : weight_map) {
    auto it = c.file_of_.find(name);
    if (it == c.file_of_.end() || c.file_paths_[it->second] != dir + "/" + shard) {
      return absl::DataLossError(absl::StrCat(
          "safetensors index '", index_path, "' says tensor '", name, "' is in '", shard, "', but ",
          it == c.file_of_.end() ? std::string("no shard holds it")
                                 : absl::StrCat("it is in '", c.file_paths_[it->second], "'"),
          "; the index and the shards are from different saves"));
    }
  }
  return c;
}

std::vector<std::string> HfCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(file_of_.size());
  for (const auto& [name, idx] : file_of_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

const SafetensorsTensorInfo* HfCheckpoint::Find(absl::string_view name) const {
  auto it = file_of_.find(name);
  return it == file_of_.end() ? nullptr : files_[it->second]->Find(name);
}

std::string HfCheckpoint::FileOf(absl::string_view name) const {
  auto it = file_of_.find(name);
  return it == file_of_.end() ? std::string() : file_paths_[it->second];
}

absl::Status HfCheckpoint::ReadF32Into(absl::string_view name, absl::Span<float> dst) const {
  auto it = file_of_.find(name);
  if (it == file_of_.end()) {
    return absl::NotFoundError(
        absl::StrCat("HF model folder '", dir_, "' has no tensor '", name, "'"));
  }
  const SafetensorsFile& f = *files_[it->second];
  absl::Status s = f.ReadF32Into(name, dst);
  f.ReleasePages(name);
  if (!s.ok()) return Prefixed(s, file_paths_[it->second]);
  return absl::OkStatus();
}

}  // namespace lspo::model
