// The JSON side of reading a Hugging Face tokenizer.json (tokenizer_hf_json.h): the accessors of
// Reader (ICU regex compilation included) and the readers of the normalizer, pre_tokenizer,
// decoder and post_processor sections, as the `tokenizers` crate (0.2x) defines them. See
// docs/formats.md §6a.
#include "text/tokenizer_hf_json.h"

#include <unicode/regex.h>
#include <unicode/stringpiece.h>
#include <unicode/unistr.h>
#include <unicode/utypes.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/status_macros.h"

namespace lspo::model::internal {
namespace {

constexpr int kMaxNesting = 8;  // Sequence inside Sequence ... (refused deeper)

}  // namespace

absl::Status Reader::Bad(absl::string_view field, absl::string_view what) const {
  return absl::DataLossError(absl::StrCat("'", file_, "': ", field, " ", what));
}

absl::Status Reader::Unsupported(absl::string_view field, const Json& value,
                                 absl::string_view supported) const {
  return absl::UnimplementedError(absl::StrCat("'", file_, "': ", field, " is ", Show(value),
                                               ", which is not supported; supported: ", supported));
}

std::string Reader::Show(const Json& v) {
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  std::string s = v.dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace);
  if (s.size() > 120) s = s.substr(0, 117) + "...";
  return s;
}

const Json* Reader::Find(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

absl::StatusOr<bool> Reader::Bool(const Json& obj, const char* key, bool def,
                                  absl::string_view path) const {
  const Json* v = Find(obj, key);
  if (v == nullptr || v->is_null()) return def;
  if (!v->is_boolean()) {
    return Bad(absl::StrCat(path, ".", key),
               absl::StrCat("is ", Show(*v), "; expected true or false"));
  }
  return v->get<bool>();
}

absl::StatusOr<std::string> Reader::String(const Json& obj, const char* key,
                                           absl::string_view path) const {
  const Json* v = Find(obj, key);
  if (v == nullptr) return Bad(absl::StrCat(path, ".", key), "is missing; expected a string");
  if (!v->is_string()) {
    return Bad(absl::StrCat(path, ".", key), absl::StrCat("is ", Show(*v), "; expected a string"));
  }
  return v->get<std::string>();
}

absl::StatusOr<int64_t> Reader::Int(const Json& obj, const char* key, int64_t def, int64_t lo,
                                    int64_t hi, absl::string_view path) const {
  const Json* v = Find(obj, key);
  if (v == nullptr || v->is_null()) return def;
  int64_t x = 0;
  if (!AsInt(*v, lo, hi, &x)) {
    return Bad(absl::StrCat(path, ".", key),
               absl::StrCat("is ", Show(*v), "; expected an integer in [", lo, ", ", hi, "]"));
  }
  return x;
}

bool Reader::AsInt(const Json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) return false;
    *out = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    *out = v.get<int64_t>();
  } else {
    return false;
  }
  return *out >= lo && *out <= hi;
}

absl::StatusOr<HfPattern> Reader::Pattern(const Json& obj, absl::string_view path) const {
  const Json* p = Find(obj, "pattern");
  std::string field = absl::StrCat(path, ".pattern");
  if (p == nullptr || !p->is_object() || p->size() != 1) {
    return Bad(field, absl::StrCat("is ", p == nullptr ? "missing" : Show(*p),
                                   "; expected {\"String\": ...} or {\"Regex\": ...}"));
  }
  HfPattern out;
  if (const Json* s = Find(*p, "String"); s != nullptr) {
    if (!s->is_string()) return Bad(field + ".String", "is not a string");
    out.literal = s->get<std::string>();
    return out;
  }
  if (const Json* r = Find(*p, "Regex"); r != nullptr) {
    if (!r->is_string()) return Bad(field + ".Regex", "is not a string");
    return CompileRegex(r->get<std::string>(), field + ".Regex");
  }
  return Unsupported(field, *p, "{\"String\": ...} or {\"Regex\": ...}");
}

absl::StatusOr<HfPattern> Reader::CompileRegex(const std::string& source,
                                               const std::string& field) const {
  // Oniguruma's \h / \H are hex digits (ICU: horizontal space); translate them outside
  // character classes (\h also inside).
  std::string pat;
  pat.reserve(source.size());
  int class_depth = 0;
  for (size_t i = 0; i < source.size(); ++i) {
    char c = source[i];
    if (c == '\\' && i + 1 < source.size()) {
      char e = source[i + 1];
      if (e == 'h') {
        pat += class_depth > 0 ? "0-9a-fA-F" : "[0-9a-fA-F]";
      } else if (e == 'H' && class_depth == 0) {
        pat += "[^0-9a-fA-F]";
      } else {
        pat += c;
        pat += e;
      }
      ++i;
      continue;
    }
    if (c == '[') ++class_depth;
    if (c == ']' && class_depth > 0) --class_depth;
    pat += c;
  }
  UParseError perr;
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexPattern> re(icu::RegexPattern::compile(
      icu::UnicodeString::fromUTF8(icu::StringPiece(pat.data(), pat.size())),
      UREGEX_MULTILINE | UREGEX_UNIX_LINES, perr, status));
  if (U_FAILURE(status) || re == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("'", file_, "': ", field, " is ", Show(Json(source)),
                     ", which ICU's regex engine cannot compile (", u_errorName(status),
                     " at offset ", perr.offset,
                     "); supported: ICU regular expression syntax (the Oniguruma patterns of "
                     "GPT-2, Llama 3, Qwen2 and the like)"));
  }
  HfPattern out;
  out.regex = internal::SharedRegex(re.release());
  return out;
}

std::string FileName(const std::string& source, const char* file) {
  return source.empty() ? std::string(file) : absl::StrCat(source, "/", file);
}

absl::StatusOr<Json> ParseJson(const std::string& text, const std::string& file) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat("'", file, "' is not valid JSON: ", e.what()));
  }
}

// ---- normalizer
absl::Status ReadNormalizer(const Reader& r, const Json& n, const std::string& path, int depth,
                            std::vector<HfNormalizer>* out) {
  if (n.is_null()) return absl::OkStatus();
  constexpr absl::string_view kSupported = "null, Sequence, NFC, NFD, NFKC, NFKD, Prepend, Replace";
  if (!n.is_object()) return r.Bad(path, absl::StrCat("is ", r.Show(n), "; expected an object"));
  ASSIGN_OR_RETURN(std::string type, r.String(n, "type", path));
  if (type == "Sequence") {
    if (depth >= kMaxNesting) return r.Unsupported(path, Json("Sequence"), "nesting depth 8");
    const Json* list = Reader::Find(n, "normalizers");
    if (list == nullptr || !list->is_array()) {
      return r.Bad(path + ".normalizers", "is missing or not an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(ReadNormalizer(r, (*list)[i], absl::StrCat(path, ".normalizers[", i, "]"),
                                     depth + 1, out));
    }
    return absl::OkStatus();
  }
  HfNormalizer step;
  if (type == "NFC") {
    step.kind = HfNormalizer::Kind::kNfc;
  } else if (type == "NFD") {
    step.kind = HfNormalizer::Kind::kNfd;
  } else if (type == "NFKC") {
    step.kind = HfNormalizer::Kind::kNfkc;
  } else if (type == "NFKD") {
    step.kind = HfNormalizer::Kind::kNfkd;
  } else if (type == "Prepend") {
    step.kind = HfNormalizer::Kind::kPrepend;
    ASSIGN_OR_RETURN(step.text, r.String(n, "prepend", path));
  } else if (type == "Replace") {
    step.kind = HfNormalizer::Kind::kReplace;
    ASSIGN_OR_RETURN(step.pattern, r.Pattern(n, path));
    ASSIGN_OR_RETURN(step.text, r.String(n, "content", path));
  } else {
    return r.Unsupported(path + ".type", Json(type), kSupported);
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

// ---- pre-tokenizer
absl::Status ReadPreTokenizer(const Reader& r, const Json& n, const std::string& path, int depth,
                              std::vector<HfPreTokenizer>* out) {
  if (n.is_null()) return absl::OkStatus();
  constexpr absl::string_view kSupported = "null, Sequence, ByteLevel, Digits, Split, Metaspace";
  if (!n.is_object()) return r.Bad(path, absl::StrCat("is ", r.Show(n), "; expected an object"));
  ASSIGN_OR_RETURN(std::string type, r.String(n, "type", path));
  if (!out->empty() && out->back().kind == HfPreTokenizer::Kind::kByteLevel) {
    return r.Unsupported(path + ".type", Json(type),
                         "ByteLevel as the last pre-tokenizer only (nothing after it)");
  }
  if (type == "Sequence") {
    if (depth >= kMaxNesting) return r.Unsupported(path, Json("Sequence"), "nesting depth 8");
    const Json* list = Reader::Find(n, "pretokenizers");
    if (list == nullptr || !list->is_array()) {
      return r.Bad(path + ".pretokenizers", "is missing or not an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(ReadPreTokenizer(r, (*list)[i], absl::StrCat(path, ".pretokenizers[", i, "]"),
                                       depth + 1, out));
    }
    return absl::OkStatus();
  }
  HfPreTokenizer step;
  if (type == "ByteLevel") {
    step.kind = HfPreTokenizer::Kind::kByteLevel;
    ASSIGN_OR_RETURN(step.add_prefix_space, r.Bool(n, "add_prefix_space", true, path));
    ASSIGN_OR_RETURN(step.use_regex, r.Bool(n, "use_regex", true, path));
  } else if (type == "Digits") {
    step.kind = HfPreTokenizer::Kind::kDigits;
    ASSIGN_OR_RETURN(step.individual_digits, r.Bool(n, "individual_digits", false, path));
  } else if (type == "Split") {
    step.kind = HfPreTokenizer::Kind::kSplit;
    ASSIGN_OR_RETURN(step.pattern, r.Pattern(n, path));
    ASSIGN_OR_RETURN(std::string behavior, r.String(n, "behavior", path));
    if (behavior == "Removed") {
      step.behavior = HfSplitBehavior::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = HfSplitBehavior::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = HfSplitBehavior::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = HfSplitBehavior::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = HfSplitBehavior::kContiguous;
    } else {
      return r.Unsupported(path + ".behavior", Json(behavior),
                           "Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
    }
    ASSIGN_OR_RETURN(step.invert, r.Bool(n, "invert", false, path));
  } else if (type == "Metaspace") {
    step.kind = HfPreTokenizer::Kind::kMetaspace;
    ASSIGN_OR_RETURN(step.replacement, r.String(n, "replacement", path));
    int32_t i = 0;
    if (step.replacement.empty() || NextCodePoint(step.replacement, &i) < 0 ||
        i != static_cast<int32_t>(step.replacement.size())) {
      return r.Bad(path + ".replacement", absl::StrCat("is ", r.Show(Json(step.replacement)),
                                                       "; expected exactly one character"));
    }
    const Json* scheme = Reader::Find(n, "prepend_scheme");
    if (scheme != nullptr && !scheme->is_null()) {
      std::string s = scheme->is_string() ? scheme->get<std::string>() : "";
      if (s == "always") {
        step.prepend = HfPreTokenizer::Prepend::kAlways;
      } else if (s == "first") {
        step.prepend = HfPreTokenizer::Prepend::kFirst;
      } else if (s == "never") {
        step.prepend = HfPreTokenizer::Prepend::kNever;
      } else {
        return r.Unsupported(path + ".prepend_scheme", *scheme, "\"always\", \"first\", \"never\"");
      }
    }
    ASSIGN_OR_RETURN(bool add_prefix_space, r.Bool(n, "add_prefix_space", true, path));
    if (!add_prefix_space) step.prepend = HfPreTokenizer::Prepend::kNever;  // older files
    ASSIGN_OR_RETURN(step.split, r.Bool(n, "split", true, path));
  } else {
    return r.Unsupported(path + ".type", Json(type), kSupported);
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

// ---- decoder
absl::Status ReadDecoder(const Reader& r, const Json& n, const std::string& path, int depth,
                         std::vector<HfDecoder>* out) {
  constexpr absl::string_view kSupported =
      "null, Sequence, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace";
  if (!n.is_object()) return r.Bad(path, absl::StrCat("is ", r.Show(n), "; expected an object"));
  ASSIGN_OR_RETURN(std::string type, r.String(n, "type", path));
  if (type == "Sequence") {
    if (depth >= kMaxNesting) return r.Unsupported(path, Json("Sequence"), "nesting depth 8");
    const Json* list = Reader::Find(n, "decoders");
    if (list == nullptr || !list->is_array()) {
      return r.Bad(path + ".decoders", "is missing or not an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(
          ReadDecoder(r, (*list)[i], absl::StrCat(path, ".decoders[", i, "]"), depth + 1, out));
    }
    return absl::OkStatus();
  }
  HfDecoder step;
  if (type == "ByteLevel") {
    step.kind = HfDecoder::Kind::kByteLevel;
  } else if (type == "Replace") {
    step.kind = HfDecoder::Kind::kReplace;
    ASSIGN_OR_RETURN(step.pattern, r.Pattern(n, path));
    ASSIGN_OR_RETURN(step.content, r.String(n, "content", path));
  } else if (type == "ByteFallback") {
    step.kind = HfDecoder::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = HfDecoder::Kind::kFuse;
  } else if (type == "Strip") {
    step.kind = HfDecoder::Kind::kStrip;
    ASSIGN_OR_RETURN(step.content, r.String(n, "content", path));
    int32_t i = 0;
    if (step.content.empty() || NextCodePoint(step.content, &i) < 0 ||
        i != static_cast<int32_t>(step.content.size())) {
      return r.Bad(path + ".content", "is not exactly one character");
    }
    ASSIGN_OR_RETURN(int64_t start, r.Int(n, "start", 0, 0, 1 << 20, path));
    ASSIGN_OR_RETURN(int64_t stop, r.Int(n, "stop", 0, 0, 1 << 20, path));
    step.start = static_cast<int32_t>(start);
    step.stop = static_cast<int32_t>(stop);
  } else if (type == "Metaspace") {
    step.kind = HfDecoder::Kind::kMetaspace;
    ASSIGN_OR_RETURN(step.content, r.String(n, "replacement", path));
    int32_t i = 0;
    if (step.content.empty() || NextCodePoint(step.content, &i) < 0 ||
        i != static_cast<int32_t>(step.content.size())) {
      return r.Bad(path + ".replacement", "is not exactly one character");
    }
    const Json* scheme = Reader::Find(n, "prepend_scheme");
    ASSIGN_OR_RETURN(bool add_prefix_space, r.Bool(n, "add_prefix_space", true, path));
    step.prepend = add_prefix_space;
    if (scheme != nullptr && scheme->is_string()) {
      std::string s = scheme->get<std::string>();
      if (s != "always" && s != "first" && s != "never") {
        return r.Unsupported(path + ".prepend_scheme", *scheme, "\"always\", \"first\", \"never\"");
      }
      step.prepend = s != "never" && add_prefix_space;
    } else if (scheme != nullptr && !scheme->is_null()) {
      return r.Unsupported(path + ".prepend_scheme", *scheme, "\"always\", \"first\", \"never\"");
    }
  } else {
    return r.Unsupported(path + ".type", Json(type), kSupported);
  }
  out->push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status ReadPostProcessor(const Reader& r, const Json& n, const std::string& path, int depth,
                               int32_t vocab, PostSummary* out) {
  if (n.is_null()) return absl::OkStatus();
  constexpr absl::string_view kSupported = "null, ByteLevel, TemplateProcessing, Sequence";
  if (!n.is_object()) return r.Bad(path, absl::StrCat("is ", r.Show(n), "; expected an object"));
  ASSIGN_OR_RETURN(std::string type, r.String(n, "type", path));
  if (type == "ByteLevel") return absl::OkStatus();  // trims offsets only
  if (type == "Sequence") {
    if (depth >= kMaxNesting) return r.Unsupported(path, Json("Sequence"), "nesting depth 8");
    const Json* list = Reader::Find(n, "processors");
    if (list == nullptr || !list->is_array()) {
      return r.Bad(path + ".processors", "is missing or not an array");
    }
    for (size_t i = 0; i < list->size(); ++i) {
      RETURN_IF_ERROR(ReadPostProcessor(r, (*list)[i], absl::StrCat(path, ".processors[", i, "]"),
                                        depth + 1, vocab, out));
    }
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") return r.Unsupported(path + ".type", Json(type), kSupported);
  if (out->have_template) {
    return r.Unsupported(path + ".type", Json(type), "one TemplateProcessing");
  }
  out->have_template = true;
  const Json* single = Reader::Find(n, "single");
  const Json* specials = Reader::Find(n, "special_tokens");
  if (single == nullptr || !single->is_array()) {
    return r.Bad(path + ".single", "is missing or not an array");
  }
  bool seen_a = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& item = (*single)[i];
    std::string field = absl::StrCat(path, ".single[", i, "]");
    if (const Json* seq = Reader::Find(item, "Sequence"); seq != nullptr) {
      const Json* id = Reader::Find(*seq, "id");
      if (id == nullptr || !id->is_string() || id->get<std::string>() != "A" || seen_a) {
        return r.Unsupported(field, item, "one {\"Sequence\": {\"id\": \"A\"}} item");
      }
      seen_a = true;
      continue;
    }
    const Json* sp = Reader::Find(item, "SpecialToken");
    const Json* name = sp == nullptr ? nullptr : Reader::Find(*sp, "id");
    if (name == nullptr || !name->is_string()) {
      return r.Bad(field, absl::StrCat("is ", r.Show(item),
                                       "; expected {\"SpecialToken\": {\"id\": ...}} or "
                                       "{\"Sequence\": {\"id\": \"A\"}}"));
    }
    const Json* entry =
        specials == nullptr ? nullptr : Reader::Find(*specials, name->get<std::string>().c_str());
    const Json* ids = entry == nullptr ? nullptr : Reader::Find(*entry, "ids");
    if (ids == nullptr || !ids->is_array()) {
      return r.Bad(absl::StrCat(path, ".special_tokens"),
                   absl::StrCat("has no ids for ", r.Show(*name), " (named by ", field, ")"));
    }
    for (const Json& idj : *ids) {
      int64_t id = 0;
      if (!Reader::AsInt(idj, 0, vocab - 1, &id)) {
        return r.Bad(absl::StrCat(path, ".special_tokens.", name->get<std::string>(), ".ids"),
                     absl::StrCat("holds ", r.Show(idj), "; expected ids in [0, ", vocab, ")"));
      }
      (seen_a ? out->suffix : out->prefix).push_back(static_cast<int32_t>(id));
    }
  }
  if (!seen_a) return r.Unsupported(path + ".single", *single, "a template with $A");
  return absl::OkStatus();
}

}  // namespace lspo::model::internal
