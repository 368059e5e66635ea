// Export of a BpeTokenizer to Hugging Face tokenizer files (BpeTokenizer::WriteHfFiles,
// text/tokenizer.h): a tokenizer.json tokenizer writes back its source files, any other one
// (GGUF, GPT-2 files, Create) gets generated tokenizer.json, tokenizer_config.json and
// special_tokens_map.json (docs/formats.md §6).
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"
#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"

namespace lspo::model {
namespace {

nlohmann::json GeneratedAddedToken(int32_t id, const std::string& content) {
  nlohmann::json t;
  t["id"] = id;
  t["content"] = content;
  t["single_word"] = false;
  t["lstrip"] = false;
  t["rstrip"] = false;
  t["normalized"] = false;
  t["special"] = true;
  return t;
}

constexpr auto kJsonReplace = nlohmann::detail::error_handler_t::replace;

}  // namespace

std::string BpeTokenizer::GeneratedConfigJson() const {
  using Json = nlohmann::json;  // keys sorted; HF readers do not depend on key order
  std::vector<int32_t> specials;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (IsSpecial(id)) specials.push_back(id);
  }
  auto content_or_null = [&](int32_t id) -> Json {
    if (id < 0) return nullptr;
    return tokens_[id];
  };
  Json cfg;
  cfg["add_bos_token"] = false;
  cfg["add_eos_token"] = false;
  cfg["add_prefix_space"] = false;
  Json decoder_map = Json::object();
  for (int32_t id : specials) {
    Json t = GeneratedAddedToken(id, tokens_[id]);
    t.erase("id");
    decoder_map[std::to_string(id)] = std::move(t);
  }
  cfg["added_tokens_decoder"] = std::move(decoder_map);
  Json additional = Json::array();
  for (int32_t id : specials) {
    if (id != bos_id_ && id != eos_id_ && id != unk_id_ && id != pad_id_) {
      additional.push_back(tokens_[id]);
    }
  }
  cfg["additional_special_tokens"] = additional;
  cfg["bos_token"] = content_or_null(bos_id_);
  if (!chat_template_.empty()) cfg["chat_template"] = chat_template_;
  cfg["clean_up_tokenization_spaces"] = false;
  cfg["eos_token"] = content_or_null(eos_id_);
  cfg["model_max_length"] = model_max_length_;
  cfg["pad_token"] = content_or_null(pad_id_);
  // Not "GPT2Tokenizer" (docs/formats.md §6 [I]): transformers 5.x rebuilds that class's backend
  // with a plain ByteLevel pre-tokenizer, dropping the Digits split; PreTrainedTokenizerFast
  // loads tokenizer.json verbatim in transformers 4.x and 5.x.
  cfg["tokenizer_class"] = "PreTrainedTokenizerFast";
  cfg["unk_token"] = content_or_null(unk_id_);
  cfg["vocab_size"] = vocab_size();
  return cfg.dump(2, ' ', false, kJsonReplace);
}

std::string BpeTokenizer::GeneratedSpecialTokensMapJson() const {
  using Json = nlohmann::json;
  Json additional = Json::array();
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (IsSpecial(id) && id != bos_id_ && id != eos_id_ && id != unk_id_ && id != pad_id_) {
      additional.push_back(tokens_[id]);
    }
  }
  Json stm;
  stm["additional_special_tokens"] = additional;
  for (auto [key, id] : {std::pair<const char*, int32_t>{"bos_token", bos_id_},
                         {"eos_token", eos_id_},
                         {"pad_token", pad_id_},
                         {"unk_token", unk_id_}}) {
    if (id >= 0) stm[key] = tokens_[id];
  }
  return stm.dump(2, ' ', false, kJsonReplace);
}

absl::Status BpeTokenizer::WriteHfFiles(const std::string& dir) const {
  namespace fs = std::filesystem;
  using Json = nlohmann::json;  // keys sorted; HF readers do not depend on key order
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "WriteHfFiles: '", dir, "' exists and is not a directory; pass a directory path"));
  }
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("WriteHfFiles: cannot create '", dir, "': ", ec.message()));
  }
  if (hf_ != nullptr) return WriteHfSourceFiles(dir);

  std::vector<int32_t> specials;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (IsSpecial(id)) specials.push_back(id);
  }

  // tokenizer.json ------------------------------------------------------------------------------
  Json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  Json tj;
  tj["version"] = "1.0";
  tj["truncation"] = nullptr;
  tj["padding"] = nullptr;
  tj["added_tokens"] = Json::array();
  for (int32_t id : specials) tj["added_tokens"].push_back(GeneratedAddedToken(id, tokens_[id]));
  tj["normalizer"] = nullptr;
  if (pre_ == PreTokenizerKind::kSmolLm) {
    tj["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         Json::array({Json{{"type", "Digits"}, {"individual_digits", true}}, byte_level})}};
  } else {
    tj["pre_tokenizer"] = byte_level;
  }
  tj["post_processor"] = {{"type", "ByteLevel"},
                          {"add_prefix_space", false},
                          {"trim_offsets", false},
                          {"use_regex", true}};
  tj["decoder"] = byte_level;
  Json model;
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  Json vocab = Json::object();
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (TokenToId(tokens_[id]) == id) vocab[tokens_[id]] = id;  // duplicates: first id only
  }
  model["vocab"] = std::move(vocab);
  model["merges"] = merges_;
  tj["model"] = std::move(model);

  fs::path base(dir);
  RETURN_IF_ERROR(runtime::WriteFileAtomically((base / "tokenizer.json").string(),
                                               tj.dump(2, ' ', false, kJsonReplace)));
  RETURN_IF_ERROR(runtime::WriteFileAtomically((base / "tokenizer_config.json").string(),
                                               GeneratedConfigJson()));
  RETURN_IF_ERROR(runtime::WriteFileAtomically((base / "special_tokens_map.json").string(),
                                               GeneratedSpecialTokensMapJson()));
  return absl::OkStatus();
}

absl::Status BpeTokenizer::WriteHfSourceFiles(const std::string& dir) const {
  const internal::HfPipeline& p = *hf_;
  const std::filesystem::path base(dir);
  RETURN_IF_ERROR(
      runtime::WriteFileAtomically((base / "tokenizer.json").string(), p.tokenizer_json));
  const bool own_config = p.tokenizer_config_json.empty();
  RETURN_IF_ERROR(
      runtime::WriteFileAtomically((base / "tokenizer_config.json").string(),
                                   own_config ? GeneratedConfigJson() : p.tokenizer_config_json));
  if (!p.chat_template_jinja.empty()) {
    RETURN_IF_ERROR(runtime::WriteFileAtomically((base / "chat_template.jinja").string(),
                                                 p.chat_template_jinja));
  }
  if (!p.special_tokens_map_json.empty() || own_config) {
    RETURN_IF_ERROR(runtime::WriteFileAtomically((base / "special_tokens_map.json").string(),
                                                 p.special_tokens_map_json.empty()
                                                     ? GeneratedSpecialTokensMapJson()
                                                     : p.special_tokens_map_json));
  }
  return absl::OkStatus();
}

}  // namespace lspo::model
