// Internal to lspo_tokenizer (text/tokenizer*.cc); not part of the API, which is
// text/tokenizer.h.
//
// Reading a Hugging Face tokenizer.json: the JSON accessors that name the file and the field in
// their errors (Reader), and the readers of its normalizer, pre_tokenizer, decoder and
// post_processor sections (tokenizer_hf_json.cc), which BpeTokenizer::FromHfJson
// (tokenizer_hf_load.cc) runs. Errors are kDataLoss for malformed input and kUnimplemented for
// what is not supported, as FromHfJson documents.
#ifndef LSPO_TEXT_TOKENIZER_HF_JSON_H_
#define LSPO_TEXT_TOKENIZER_HF_JSON_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer_internal.h"

namespace lspo::model::internal {

using Json = nlohmann::json;

// JSON reading. Every accessor names the file and the field in its error.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }

  // kDataLoss "'<file>': <field> <what>".
  absl::Status Bad(absl::string_view field, absl::string_view what) const;
  // kUnimplemented naming `field`, the `value` found and what is `supported`.
  absl::Status Unsupported(absl::string_view field, const Json& value,
                           absl::string_view supported) const;
  // A short rendering of a JSON value for messages: scalars as JSON, containers by kind only
  // (dumping them would recurse as deep as the input nests).
  static std::string Show(const Json& v);

  // obj[key] or nullptr when absent.
  static const Json* Find(const Json& obj, const char* key);
  // obj[key] as a bool, `def` when absent or null; `path` names obj in errors.
  absl::StatusOr<bool> Bool(const Json& obj, const char* key, bool def,
                            absl::string_view path) const;
  // obj[key] as a string (required); `path` names obj in errors.
  absl::StatusOr<std::string> String(const Json& obj, const char* key,
                                     absl::string_view path) const;
  // obj[key] as an integer in [lo, hi], `def` when absent or null; `path` names obj in errors.
  absl::StatusOr<int64_t> Int(const Json& obj, const char* key, int64_t def, int64_t lo, int64_t hi,
                              absl::string_view path) const;
  // `v` as an integer in [lo, hi] into *out; false when it is not one.
  static bool AsInt(const Json& v, int64_t lo, int64_t hi, int64_t* out);

  // {"String": s} or {"Regex": r}.
  absl::StatusOr<HfPattern> Pattern(const Json& obj, absl::string_view path) const;
  // `source` compiled by ICU with Oniguruma's meaning of \h / \H; kUnimplemented naming `field`
  // when ICU cannot compile it.
  absl::StatusOr<HfPattern> CompileRegex(const std::string& source, const std::string& field) const;

 private:
  std::string file_;
};

// "<source>/<file>", or `file` when `source` is empty: how messages name an input file.
std::string FileName(const std::string& source, const char* file);

// `text` parsed as JSON. Errors: kDataLoss naming `file` when it is not valid JSON.
absl::StatusOr<Json> ParseJson(const std::string& text, const std::string& file);

// The readers of the pipeline sections. Each reads the section `n` found at `path` (`depth`:
// the Sequences it is nested in, at most 8) and appends its steps, a Sequence flattened, to
// `out`; a null section adds nothing.
absl::Status ReadNormalizer(const Reader& r, const Json& n, const std::string& path, int depth,
                            std::vector<HfNormalizer>* out);
absl::Status ReadPreTokenizer(const Reader& r, const Json& n, const std::string& path, int depth,
                              std::vector<HfPreTokenizer>* out);
absl::Status ReadDecoder(const Reader& r, const Json& n, const std::string& path, int depth,
                         std::vector<HfDecoder>* out);

// ---- post-processor: what a single sequence gets before / after $A.
struct PostSummary {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
  bool have_template = false;
};

// The post-processor section: the ids its single-sequence template puts before and after $A,
// each checked to be below `vocab`.
absl::Status ReadPostProcessor(const Reader& r, const Json& n, const std::string& path, int depth,
                               int32_t vocab, PostSummary* out);

}  // namespace lspo::model::internal

#endif  // LSPO_TEXT_TOKENIZER_HF_JSON_H_
