// BpeTokenizer::FromGguf: a GGUF file's tokenizer.ggml.* vocabulary (docs/formats.md §4),
// directly for the GPT-2 / SmolLM pre-tokenizers, through the tokenizer.json it stands for for
// the regex-named ones (Llama 3's llama-bpe, qwen2). Contracts: text/tokenizer.h.
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/gguf.h"
#include "nlohmann/json.hpp"
#include "runtime/status_macros.h"
#include "text/tokenizer.h"

namespace lspo::model {

absl::string_view GgufPreTokenizerRegex(absl::string_view pre) {
  if (pre == "llama-bpe") {
    return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
           "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  }
  if (pre == "qwen2") {
    return "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
           "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  }
  return "";
}
bool GgufPreIgnoresMerges(absl::string_view pre) { return pre == "llama-bpe"; }
bool GgufPreUsesNfc(absl::string_view pre) { return pre == "qwen2"; }

namespace {

// The tokenizer.json (and tokenizer_config.json) a GGUF vocabulary with a regex-named pre
// (GgufPreTokenizerRegex) stands for; see FromGguf.
absl::StatusOr<BpeTokenizer> FromGgufAsHfJson(const GgufFile& gguf, const std::string& pre) {
  using nlohmann::json;
  ASSIGN_OR_RETURN(std::vector<std::string> tokens, gguf.GetStringArray("tokenizer.ggml.tokens"));
  std::vector<int64_t> types(tokens.size(), kTokenNormal);
  if (gguf.HasKey("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(types, gguf.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != tokens.size()) {
      return absl::DataLossError(absl::StrCat("GGUF tokenizer.ggml.token_type has ", types.size(),
                                              " entries for ", tokens.size(), " tokens"));
    }
  }
  ASSIGN_OR_RETURN(std::vector<std::string> merges, gguf.GetStringArray("tokenizer.ggml.merges"));
  json vocab = json::object();
  json added = json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    vocab[tokens[i]] = i;
    if (types[i] == kTokenControl || types[i] == kTokenUserDefined) {
      added.push_back({{"id", i},
                       {"content", tokens[i]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", types[i] == kTokenControl}});
    }
  }
  auto id_of = [&](const char* key) -> absl::StatusOr<int64_t> {
    if (!gguf.HasKey(key)) return -1;
    ASSIGN_OR_RETURN(int64_t v, gguf.GetInt(key));
    if (v < 0 || v >= static_cast<int64_t>(tokens.size())) {
      return absl::DataLossError(
          absl::StrCat("GGUF ", key, " = ", v, " is outside [0, ", tokens.size(), ")"));
    }
    return v;
  };
  ASSIGN_OR_RETURN(int64_t bos, id_of("tokenizer.ggml.bos_token_id"));
  ASSIGN_OR_RETURN(int64_t eos, id_of("tokenizer.ggml.eos_token_id"));
  ASSIGN_OR_RETURN(int64_t pad, id_of("tokenizer.ggml.padding_token_id"));
  bool add_bos = false;
  if (gguf.HasKey("tokenizer.ggml.add_bos_token")) {
    ASSIGN_OR_RETURN(add_bos, gguf.GetBool("tokenizer.ggml.add_bos_token"));
  }
  json post = json();  // null
  if (add_bos && bos >= 0) {
    const std::string b = tokens[static_cast<size_t>(bos)];
    post = {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", b}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", json::array({{{"SpecialToken", {{"id", b}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                  {{"SpecialToken", {{"id", b}, {"type_id", 1}}}},
                                  {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
            {"special_tokens", {{b, {{"id", b}, {"ids", {bos}}, {"tokens", {b}}}}}}};
  }
  json tok = {{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added},
              {"normalizer", GgufPreUsesNfc(pre) ? json({{"type", "NFC"}}) : json()},
              {"pre_tokenizer",
               {{"type", "Sequence"},
                {"pretokenizers",
                 json::array({{{"type", "Split"},
                               {"pattern", {{"Regex", std::string(GgufPreTokenizerRegex(pre))}}},
                               {"behavior", "Isolated"},
                               {"invert", false}},
                              {{"type", "ByteLevel"},
                               {"add_prefix_space", false},
                               {"trim_offsets", true},
                               {"use_regex", false}}})}}},
              {"post_processor", post},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"model",
               {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", GgufPreIgnoresMerges(pre)},
                {"vocab", vocab},
                {"merges", merges}}}};
  json config = json::object();
  auto content = [&](int64_t id) {
    return id >= 0 ? json(tokens[static_cast<size_t>(id)]) : json();
  };
  config["bos_token"] = content(bos);
  config["eos_token"] = content(eos);
  config["pad_token"] = content(pad);
  if (gguf.HasKey("tokenizer.chat_template")) {
    ASSIGN_OR_RETURN(std::string t, gguf.GetString("tokenizer.chat_template"));
    config["chat_template"] = t;
  }
  config["tokenizer_class"] = "PreTrainedTokenizerFast";
  auto made = BpeTokenizer::FromHfJson(tok.dump(), config.dump(), "GGUF tokenizer.ggml");
  if (!made.ok() && !absl::IsUnimplemented(made.status())) {
    return absl::DataLossError(
        absl::StrCat("GGUF tokenizer data is inconsistent: ", made.status().message()));
  }
  return made;
}

}  // namespace

absl::StatusOr<BpeTokenizer> BpeTokenizer::FromGguf(const GgufFile& gguf) {
  ASSIGN_OR_RETURN(std::string model, gguf.GetString("tokenizer.ggml.model"));
  if (model != "gpt2") {
    return absl::UnimplementedError(absl::StrCat(
        "GGUF tokenizer.ggml.model is '", model,
        "'; only 'gpt2' (byte-level BPE) is supported; convert the model with a BPE tokenizer"));
  }
  BpeTokenizerSpec spec;
  std::string pre = "default";
  if (gguf.HasKey("tokenizer.ggml.pre")) {
    ASSIGN_OR_RETURN(pre, gguf.GetString("tokenizer.ggml.pre"));
  }
  if (!GgufPreTokenizerRegex(pre).empty()) return FromGgufAsHfJson(gguf, pre);
  if (pre == "smollm") {
    spec.pre_tokenizer = PreTokenizerKind::kSmolLm;
  } else if (pre == "gpt2" || pre == "default") {
    spec.pre_tokenizer = PreTokenizerKind::kGpt2;
  } else {
    return absl::UnimplementedError(
        absl::StrCat("GGUF tokenizer.ggml.pre is '", pre,
                     "'; supported pre-tokenizers are 'smollm', 'gpt2', 'default', 'llama-bpe' "
                     "and 'qwen2'"));
  }
  ASSIGN_OR_RETURN(spec.tokens, gguf.GetStringArray("tokenizer.ggml.tokens"));
  if (gguf.HasKey("tokenizer.ggml.token_type")) {
    ASSIGN_OR_RETURN(auto types, gguf.GetIntArray("tokenizer.ggml.token_type"));
    spec.token_types.assign(types.begin(), types.end());
  }
  ASSIGN_OR_RETURN(spec.merges, gguf.GetStringArray("tokenizer.ggml.merges"));
  struct IdKey {
    const char* key;
    int32_t* dst;
  };
  for (IdKey k : {IdKey{"tokenizer.ggml.bos_token_id", &spec.bos_id},
                  IdKey{"tokenizer.ggml.eos_token_id", &spec.eos_id},
                  IdKey{"tokenizer.ggml.unknown_token_id", &spec.unk_id},
                  IdKey{"tokenizer.ggml.padding_token_id", &spec.pad_id}}) {
    if (!gguf.HasKey(k.key)) continue;
    ASSIGN_OR_RETURN(int64_t v, gguf.GetInt(k.key));
    if (v < 0 || v >= static_cast<int64_t>(spec.tokens.size())) {
      return absl::DataLossError(
          absl::StrCat("GGUF ", k.key, " = ", v, " is outside [0, ", spec.tokens.size(), ")"));
    }
    *k.dst = static_cast<int32_t>(v);
  }
  if (gguf.HasKey("tokenizer.chat_template")) {
    ASSIGN_OR_RETURN(spec.chat_template, gguf.GetString("tokenizer.chat_template"));
  }
  if (gguf.HasKey("general.architecture")) {
    ASSIGN_OR_RETURN(std::string arch, gguf.GetString("general.architecture"));
    std::string ctx_key = absl::StrCat(arch, ".context_length");
    if (gguf.HasKey(ctx_key)) {
      ASSIGN_OR_RETURN(int64_t ctx, gguf.GetInt(ctx_key));
      if (ctx > 0) spec.model_max_length = ctx;
    }
  }
  auto tok = Create(std::move(spec));
  if (!tok.ok() && absl::IsInvalidArgument(tok.status())) {
    return absl::DataLossError(
        absl::StrCat("GGUF tokenizer data is inconsistent: ", tok.status().message()));
  }
  return tok;
}

}  // namespace lspo::model
