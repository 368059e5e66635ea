// BpeTokenizer::FromHfJson and FromHfFolder (text/tokenizer.h): a Hugging Face tokenizer.json
// (and tokenizer_config.json) read into a BpeTokenizer, step by step in the order of the file's
// checks (the model options, the vocabulary and added tokens, unk and byte tokens, the merges,
// the pipeline sections, the added-token matchers, tokenizer_config.json), so that the first
// problem found is the one reported. See docs/formats.md §6a.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"
#include "text/tokenizer.h"
#include "text/tokenizer_hf_json.h"
#include "text/tokenizer_internal.h"

namespace lspo::model {
namespace internal {
namespace {

// model.vocab and added_tokens as ReadVocabEntries read them, their ids not yet cross-checked.
struct HfVocabEntries {
  std::vector<std::pair<std::string, int32_t>> model_entries;  // (token, id) of model.vocab
  std::vector<HfAddedToken> added;                             // in file order
  int64_t vocab_n = 0;                                         // the largest id + 1
};

// model.type (BPE), dropout, the subword prefix / suffix and the BPE options of `model` into hf.
absl::Status ReadModelOptions(const Reader& r, const Json& model, HfPipeline* hf) {
  ASSIGN_OR_RETURN(std::string type, r.String(model, "type", "model"));
  if (type != "BPE") {
    return r.Unsupported("model.type", Json(type),
                         "BPE (byte-level as GPT-2 / Llama 3 / Qwen2, or SentencePiece-style "
                         "with byte_fallback as Llama 2 / Mistral)");
  }
  if (const Json* d = Reader::Find(model, "dropout"); d != nullptr && !d->is_null()) {
    if (!d->is_number() || d->get<double>() != 0.0) {
      return r.Unsupported("model.dropout", *d, "null (or 0): deterministic BPE");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* v = Reader::Find(model, key);
    if (v != nullptr && !v->is_null() && !(v->is_string() && v->get<std::string>().empty())) {
      return r.Unsupported(absl::StrCat("model.", key), *v, "null or \"\"");
    }
  }
  ASSIGN_OR_RETURN(hf->byte_fallback, r.Bool(model, "byte_fallback", false, "model"));
  ASSIGN_OR_RETURN(hf->fuse_unk, r.Bool(model, "fuse_unk", false, "model"));
  ASSIGN_OR_RETURN(hf->ignore_merges, r.Bool(model, "ignore_merges", false, "model"));
  return absl::OkStatus();
}

// model.vocab and added_tokens (ids in range, every added token well-formed, ids without gaps).
absl::Status ReadVocabEntries(const Reader& r, const Json& j, const Json& model,
                              HfVocabEntries* out) {
  const Json* vocab = Reader::Find(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) {
    return r.Bad("model.vocab", "is missing or not an object {\"token\": id}");
  }
  const Json* added_json = Reader::Find(j, "added_tokens");
  if (added_json != nullptr && !added_json->is_null() && !added_json->is_array()) {
    return r.Bad("added_tokens", "is not an array");
  }
  const size_t n_added = added_json != nullptr && added_json->is_array() ? added_json->size() : 0;

  // Ids: model.vocab and added_tokens together must cover 0..N-1.
  constexpr int64_t kMaxId = INT32_MAX - 1;
  int64_t max_id = -1;
  std::vector<std::pair<std::string, int32_t>> model_entries;
  model_entries.reserve(vocab->size());
  for (auto it = vocab->begin(); it != vocab->end(); ++it) {
    int64_t id = 0;
    if (!Reader::AsInt(it.value(), 0, kMaxId, &id)) {
      return r.Bad("model.vocab",
                   absl::StrCat("gives token ", r.Show(Json(it.key())), " the id ",
                                r.Show(it.value()), "; expected an integer in [0, ", kMaxId, "]"));
    }
    max_id = std::max(max_id, id);
    model_entries.emplace_back(it.key(), static_cast<int32_t>(id));
  }
  std::vector<HfAddedToken> added;
  added.reserve(n_added);
  for (size_t i = 0; i < n_added; ++i) {
    const Json& a = (*added_json)[i];
    std::string path = absl::StrCat("added_tokens[", i, "]");
    if (!a.is_object()) return r.Bad(path, "is not an object");
    HfAddedToken t;
    const Json* idj = Reader::Find(a, "id");
    int64_t id = 0;
    if (idj == nullptr || !Reader::AsInt(*idj, 0, kMaxId, &id)) {
      return r.Bad(path + ".id", absl::StrCat("is ", idj == nullptr ? "missing" : r.Show(*idj),
                                              "; expected an integer in [0, ", kMaxId, "]"));
    }
    t.id = static_cast<int32_t>(id);
    max_id = std::max(max_id, id);
    ASSIGN_OR_RETURN(t.content, r.String(a, "content", path));
    if (t.content.empty()) return r.Bad(path + ".content", "is empty");
    ASSIGN_OR_RETURN(t.special, r.Bool(a, "special", false, path));
    ASSIGN_OR_RETURN(t.single_word, r.Bool(a, "single_word", false, path));
    ASSIGN_OR_RETURN(t.lstrip, r.Bool(a, "lstrip", false, path));
    ASSIGN_OR_RETURN(t.rstrip, r.Bool(a, "rstrip", false, path));
    ASSIGN_OR_RETURN(t.normalized, r.Bool(a, "normalized", !t.special, path));
    added.push_back(std::move(t));
  }
  if (max_id < 0) return r.Bad("model.vocab", "is empty");
  const int64_t vocab_n = max_id + 1;
  if (vocab_n > static_cast<int64_t>(model_entries.size() + added.size())) {
    return r.Bad("model.vocab",
                 absl::StrCat("and added_tokens leave gaps: the largest id is ", max_id,
                              " but there are only ", model_entries.size() + added.size(),
                              " entries; ids must cover 0..N-1"));
  }
  out->model_entries = std::move(model_entries);
  out->added = std::move(added);
  out->vocab_n = vocab_n;
  return absl::OkStatus();
}

// The pipeline sections (normalizer, pre_tokenizer, decoder, post_processor) into hf and post;
// a template that adds more than one token on a side is refused.
absl::Status ReadPipeline(const Reader& r, const Json& j, int64_t vocab_n, HfPipeline* hf,
                          PostSummary* out_post) {
  PostSummary& post = *out_post;
  if (const Json* n = Reader::Find(j, "normalizer"); n != nullptr) {
    RETURN_IF_ERROR(ReadNormalizer(r, *n, "normalizer", 0, &hf->normalizers));
  }
  if (const Json* n = Reader::Find(j, "pre_tokenizer"); n != nullptr) {
    RETURN_IF_ERROR(ReadPreTokenizer(r, *n, "pre_tokenizer", 0, &hf->pre_tokenizers));
  }
  hf->byte_level = !hf->pre_tokenizers.empty() &&
                   hf->pre_tokenizers.back().kind == HfPreTokenizer::Kind::kByteLevel;
  if (const Json* n = Reader::Find(j, "decoder"); n != nullptr && !n->is_null()) {
    hf->has_decoder = true;
    RETURN_IF_ERROR(ReadDecoder(r, *n, "decoder", 0, &hf->decoders));
  }
  if (const Json* n = Reader::Find(j, "post_processor"); n != nullptr) {
    RETURN_IF_ERROR(
        ReadPostProcessor(r, *n, "post_processor", 0, static_cast<int32_t>(vocab_n), &post));
  }
  for (auto [side, ids] :
       {std::pair<const char*, const std::vector<int32_t>*>{"before", &post.prefix},
        {"after", &post.suffix}}) {
    if (ids->size() > 1) {
      return absl::UnimplementedError(absl::StrCat(
          "'", r.file(), "': post_processor.single adds ", ids->size(), " tokens ", side,
          " $A, which is not supported; supported: at most one token on each side (a bos "
          "before, an eos after)"));
    }
  }
  return absl::OkStatus();
}

// What each added token matches (its content, normalized when `normalized`), and the two
// matchers of hf.
void BuildAddedMatchers(std::vector<HfAddedToken> added, HfPipeline* hf) {
  // Added tokens: what each one matches, and the two matchers (special tokens first, then the
  // others, each in file order, as AddedVocabulary::refresh_added_tokens orders them).
  for (HfAddedToken& a : added) {
    a.pattern = a.normalized ? Normalize(hf->normalizers, a.content) : a.content;
    if (a.normalized) hf->normalized_added_text[a.id] = a.pattern;
  }
  hf->added = std::move(added);
  std::vector<int32_t> order;
  for (int32_t i = 0; i < static_cast<int32_t>(hf->added.size()); ++i) {
    if (hf->added[i].special) order.push_back(i);
  }
  for (int32_t i = 0; i < static_cast<int32_t>(hf->added.size()); ++i) {
    if (!hf->added[i].special) order.push_back(i);
  }
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return hf->added[a].pattern.size() > hf->added[b].pattern.size();
  });
  for (int32_t i : order) {
    const HfAddedToken& a = hf->added[i];
    if (a.pattern.empty()) continue;
    HfAddedMatcher& m = a.normalized ? hf->normalized_matcher : hf->raw_matcher;
    m.by_length.push_back(i);
    m.first_byte[static_cast<uint8_t>(a.pattern[0])] = true;
  }
}

}  // namespace

// FromHfJson's steps that fill the BpeTokenizer under construction (a friend of BpeTokenizer).
struct HfJsonLoader {
  // The token strings, token types and id maps of `tok` from the entries: every id given once,
  // all of 0..N-1 covered, added-token contents unique.
  static absl::Status AssignIds(const Reader& r, HfVocabEntries* v, BpeTokenizer* tok) {
    const int64_t vocab_n = v->vocab_n;
    std::vector<std::pair<std::string, int32_t>>& model_entries = v->model_entries;
    const std::vector<HfAddedToken>& added = v->added;
    BpeTokenizer& t = *tok;
    t.tokens_.assign(vocab_n, std::string());
    t.token_types_.assign(vocab_n, kTokenNormal);
    std::vector<uint8_t> covered(vocab_n, 0);  // 1 model, 2 added
    t.token_to_id_.reserve(model_entries.size());
    for (auto& [token, id] : model_entries) {
      if (covered[id]) {
        return r.Bad("model.vocab",
                     absl::StrCat("gives the id ", id, " to both ", r.Show(Json(t.tokens_[id])),
                                  " and ", r.Show(Json(token)), "; ids must be unique"));
      }
      covered[id] = 1;
      t.tokens_[id] = token;
      t.token_to_id_.emplace(std::move(token), id);
    }
    model_entries.clear();
    for (size_t i = 0; i < added.size(); ++i) {
      const HfAddedToken& a = added[i];
      if (covered[a.id] == 2) {
        return r.Bad(absl::StrCat("added_tokens[", i, "].id"),
                     absl::StrCat("is ", a.id, ", which an earlier added token has"));
      }
      if (!t.added_to_id_.emplace(a.content, a.id).second) {
        return r.Bad(absl::StrCat("added_tokens[", i, "].content"),
                     absl::StrCat("is ", r.Show(Json(a.content)),
                                  ", which an earlier added "
                                  "token has"));
      }
      covered[a.id] = 2;
      t.tokens_[a.id] = a.content;
      if (a.special) t.token_types_[a.id] = kTokenControl;
    }
    for (int64_t id = 0; id < vocab_n; ++id) {
      if (!covered[id]) {
        return r.Bad("model.vocab", absl::StrCat("and added_tokens have no token with id ", id,
                                                 "; ids must cover 0..", vocab_n - 1));
      }
    }
    return absl::OkStatus();
  }

  // model.unk_token, the "<0xNN>" byte tokens of the vocabulary and the byte symbols.
  static absl::Status ReadUnkAndBytes(const Reader& r, const Json& model, HfPipeline* hf,
                                      BpeTokenizer* tok) {
    BpeTokenizer& t = *tok;
    if (const Json* unk = Reader::Find(model, "unk_token"); unk != nullptr && !unk->is_null()) {
      if (!unk->is_string()) return r.Bad("model.unk_token", "is not a string or null");
      auto it = t.token_to_id_.find(unk->get<std::string>());
      if (it == t.token_to_id_.end()) {
        return r.Bad("model.unk_token",
                     absl::StrCat("is ", r.Show(*unk), ", which is not in model.vocab"));
      }
      hf->model_unk_id = it->second;
      if (t.token_types_[it->second] == kTokenNormal) t.token_types_[it->second] = kTokenUnknown;
    }
    for (int b = 0; b < 256; ++b) {
      auto it = t.token_to_id_.find(absl::StrFormat("<0x%02X>", b));
      if (it == t.token_to_id_.end()) continue;
      hf->byte_token_id[b] = it->second;
      if (hf->byte_fallback && t.token_types_[it->second] == kTokenNormal) {
        t.token_types_[it->second] = kTokenByte;
      }
    }
    const internal::ByteAlphabet& alphabet = Alphabet();
    for (int b = 0; b < 256; ++b) {
      auto it = t.token_to_id_.find(alphabet.byte_to_utf8[b]);
      t.byte_to_id_[b] = it == t.token_to_id_.end() ? -1 : it->second;
    }
    return absl::OkStatus();
  }

  // model.merges into the merge ranks of `tok`.
  static absl::Status ReadMerges(const Reader& r, const Json& model, BpeTokenizer* tok) {
    BpeTokenizer& t = *tok;
    // merges ("A B" strings or ["A", "B"] pairs); a repeated pair keeps its last rank.
    const Json* merges = Reader::Find(model, "merges");
    if (merges == nullptr || !merges->is_array()) {
      return r.Bad("model.merges", "is missing or not an array");
    }
    t.merge_ranks_.reserve(merges->size());
    for (size_t rank = 0; rank < merges->size(); ++rank) {
      const Json& m = (*merges)[rank];
      std::string left, right;
      if (m.is_string()) {
        const std::string& line = m.get_ref<const std::string&>();
        size_t space = line.find(' ');
        if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
          return r.Bad(absl::StrCat("model.merges[", rank, "]"),
                       absl::StrCat("is ", r.Show(m),
                                    "; expected two tokens separated by one "
                                    "space"));
        }
        left = line.substr(0, space);
        right = line.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return r.Bad(absl::StrCat("model.merges[", rank, "]"),
                     absl::StrCat("is ", r.Show(m), "; expected \"A B\" or [\"A\", \"B\"]"));
      }
      auto li = t.token_to_id_.find(left);
      auto ri = t.token_to_id_.find(right);
      auto mi = t.token_to_id_.find(left + right);
      if (li == t.token_to_id_.end() || ri == t.token_to_id_.end() || mi == t.token_to_id_.end()) {
        return r.Bad(absl::StrCat("model.merges[", rank, "]"),
                     absl::StrCat("is ", r.Show(m),
                                  ", which names a token (left, right or their "
                                  "concatenation) that is not in model.vocab"));
      }
      t.merge_ranks_.insert_or_assign(
          (static_cast<uint64_t>(static_cast<uint32_t>(li->second)) << 32) |
              static_cast<uint32_t>(ri->second),
          BpeTokenizer::Merge{static_cast<int32_t>(rank), mi->second});
    }
    return absl::OkStatus();
  }

  // The text of a tokenizer_config.json: the special tokens, the chat template, the model's
  // maximum length; split_special_tokens must be false, and a bos / eos the post-processor adds
  // must be the configured one.
  static absl::Status ReadConfig(const Reader& r, const std::string& tokenizer_config_json_text,
                                 const std::string& source_name, const PostSummary& post,
                                 const HfPipeline* hf, BpeTokenizer* tok) {
    BpeTokenizer& t = *tok;
    const Reader c(FileName(source_name, "tokenizer_config.json"));
    ASSIGN_OR_RETURN(Json cfg, ParseJson(tokenizer_config_json_text, c.file()));
    if (!cfg.is_object()) return c.Bad("the top level", "is not a JSON object");
    struct Key {
      const char* name;
      int32_t* dst;
    };
    for (Key k : {Key{"bos_token", &t.bos_id_}, Key{"eos_token", &t.eos_id_},
                  Key{"pad_token", &t.pad_id_}, Key{"unk_token", &t.unk_id_}}) {
      const Json* v = Reader::Find(cfg, k.name);
      if (v == nullptr) continue;  // absent: what tokenizer.json says
      if (v->is_null()) {
        *k.dst = -1;
        continue;
      }
      const Json* content = v->is_object() ? Reader::Find(*v, "content") : v;
      if (content == nullptr || !content->is_string()) {
        return c.Bad(k.name, absl::StrCat("is ", c.Show(*v),
                                          "; expected a string, an "
                                          "{\"content\": ...} object or null"));
      }
      int32_t id = t.TokenToId(content->get<std::string>());
      if (id < 0) {
        return c.Bad(k.name, absl::StrCat("is ", c.Show(*content),
                                          ", which is not in the "
                                          "vocabulary of ",
                                          r.file()));
      }
      *k.dst = id;
    }
    if (const Json* v = Reader::Find(cfg, "chat_template"); v != nullptr && !v->is_null()) {
      if (v->is_string()) {
        t.chat_template_ = v->get<std::string>();
      } else if (v->is_array()) {
        for (size_t i = 0; i < v->size(); ++i) {
          const Json& e = (*v)[i];
          const Json* name = Reader::Find(e, "name");
          const Json* tmpl = Reader::Find(e, "template");
          if (name == nullptr || !name->is_string() || tmpl == nullptr || !tmpl->is_string()) {
            return c.Bad(absl::StrCat("chat_template[", i, "]"),
                         "is not an object {\"name\": string, \"template\": string}");
          }
          if (name->get<std::string>() == "default") t.chat_template_ = tmpl->get<std::string>();
        }
      } else {
        return c.Bad("chat_template", absl::StrCat("is ", c.Show(*v),
                                                   "; expected a string or "
                                                   "a list of {name, template}"));
      }
    }
    if (const Json* v = Reader::Find(cfg, "split_special_tokens");
        v != nullptr && !(v->is_boolean() && !v->get<bool>()) && !v->is_null()) {
      return c.Unsupported("split_special_tokens", *v,
                           "false (added tokens are always matched verbatim)");
    }
    if (const Json* v = Reader::Find(cfg, "model_max_length"); v != nullptr) {
      int64_t len = 0;
      if (Reader::AsInt(*v, 1, INT64_MAX, &len)) t.model_max_length_ = len;
    }
    if (hf->adds_bos && t.bos_id_ != post.prefix[0]) {
      return absl::UnimplementedError(absl::StrCat(
          "'", r.file(), "': post_processor.single prepends token ", post.prefix[0], " (",
          Reader::Show(Json(t.tokens_[post.prefix[0]])), ") but '", c.file(), "' bos_token names ",
          t.bos_id_ < 0 ? "none" : Reader::Show(Json(t.tokens_[t.bos_id_])),
          "; supported: a template whose leading token is the bos_token"));
    }
    if (hf->adds_eos && t.eos_id_ != post.suffix[0]) {
      return absl::UnimplementedError(absl::StrCat(
          "'", r.file(), "': post_processor.single appends token ", post.suffix[0], " (",
          Reader::Show(Json(t.tokens_[post.suffix[0]])), ") but '", c.file(), "' eos_token names ",
          t.eos_id_ < 0 ? "none" : Reader::Show(Json(t.tokens_[t.eos_id_])),
          "; supported: a template whose trailing token is the eos_token"));
    }
    return absl::OkStatus();
  }
};

}  // namespace internal

using internal::FileName;
using internal::HfJsonLoader;
using internal::HfPipeline;
using internal::HfVocabEntries;
using internal::Json;
using internal::ParseJson;
using internal::PostSummary;
using internal::Reader;

// -----------------------------------------------------------------------------------------------
absl::StatusOr<BpeTokenizer> BpeTokenizer::FromHfJson(std::string tokenizer_json_text,
                                                      std::string tokenizer_config_json_text,
                                                      std::string source_name) {
  const Reader r(FileName(source_name, "tokenizer.json"));
  ASSIGN_OR_RETURN(Json j, ParseJson(tokenizer_json_text, r.file()));
  if (!j.is_object()) return r.Bad("the top level", "is not a JSON object");
  auto hf = std::make_shared<HfPipeline>();
  std::fill(std::begin(hf->byte_token_id), std::end(hf->byte_token_id), -1);

  // model -----------------------------------------------------------------------------------
  const Json* model = Reader::Find(j, "model");
  if (model == nullptr || !model->is_object()) return r.Bad("model", "is missing or not an object");
  RETURN_IF_ERROR(internal::ReadModelOptions(r, *model, hf.get()));
  HfVocabEntries entries;
  RETURN_IF_ERROR(internal::ReadVocabEntries(r, j, *model, &entries));
  BpeTokenizer t;
  RETURN_IF_ERROR(HfJsonLoader::AssignIds(r, &entries, &t));
  RETURN_IF_ERROR(HfJsonLoader::ReadUnkAndBytes(r, *model, hf.get(), &t));
  RETURN_IF_ERROR(HfJsonLoader::ReadMerges(r, *model, &t));

  // pipeline --------------------------------------------------------------------------------
  PostSummary post;
  RETURN_IF_ERROR(internal::ReadPipeline(r, j, entries.vocab_n, hf.get(), &post));
  internal::BuildAddedMatchers(std::move(entries.added), hf.get());

  // tokenizer_config.json ---------------------------------------------------------------------
  t.unk_id_ = hf->model_unk_id;
  t.bos_id_ = post.prefix.empty() ? -1 : post.prefix[0];
  t.eos_id_ = post.suffix.empty() ? -1 : post.suffix[0];
  hf->adds_bos = !post.prefix.empty();
  hf->adds_eos = !post.suffix.empty();
  if (!tokenizer_config_json_text.empty()) {
    RETURN_IF_ERROR(
        HfJsonLoader::ReadConfig(r, tokenizer_config_json_text, source_name, post, hf.get(), &t));
  }

  hf->tokenizer_json = std::move(tokenizer_json_text);
  hf->tokenizer_config_json = std::move(tokenizer_config_json_text);
  t.hf_ = std::move(hf);
  return t;
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::FromHfFolder(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path base(dir);
  ASSIGN_OR_RETURN(
      std::string tokenizer_json,
      runtime::ReadFileToString((base / "tokenizer.json").string(), "Hugging Face tokenizer.json"));
  auto optional_file = [&](const char* name, std::string* out) -> absl::Status {
    std::string path = (base / name).string();
    std::error_code ec;
    if (!fs::exists(path, ec)) return absl::OkStatus();  // optional; a directory there fails below
    ASSIGN_OR_RETURN(*out, runtime::ReadFileToString(path, name));
    return absl::OkStatus();
  };
  std::string config, jinja, special_map;
  RETURN_IF_ERROR(optional_file("tokenizer_config.json", &config));
  RETURN_IF_ERROR(optional_file("chat_template.jinja", &jinja));
  RETURN_IF_ERROR(optional_file("special_tokens_map.json", &special_map));
  ASSIGN_OR_RETURN(BpeTokenizer t, FromHfJson(std::move(tokenizer_json), std::move(config), dir));
  // FromHfJson made the pipeline and nothing shares it yet: complete it in place.
  std::shared_ptr<HfPipeline> hf = std::const_pointer_cast<HfPipeline>(t.hf_);
  if (!jinja.empty()) t.chat_template_ = jinja;
  hf->chat_template_jinja = std::move(jinja);
  hf->special_tokens_map_json = std::move(special_map);
  return t;
}

}  // namespace lspo::model
