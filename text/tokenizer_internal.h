// Internal to lspo_tokenizer (text/tokenizer*.cc); not part of the API, which is
// text/tokenizer.h.
//
// ByteAlphabet: GPT-2's bytes_to_unicode table (openai/gpt-2 src/encoder.py).
// HfPipeline: what BpeTokenizer::FromHfJson read from a Hugging Face tokenizer.json besides the
// vocabulary and merges (which live in BpeTokenizer itself): normalizers, pre-tokenizers, the
// BPE model options, the added tokens, the decoder chain, the post-processor summary and the
// original file texts. Immutable after FromHfJson; shared between copies of a BpeTokenizer.
// The text side of the tokenizer.json pipeline (tokenizer_hf_pipeline.cc): normalizers, the
// added-token split and the pre-tokenizers, which the encoder (tokenizer_hf_model.cc) runs and
// the reader (tokenizer_hf_load.cc) uses for the normalized added tokens.
#ifndef LSPO_TEXT_TOKENIZER_INTERNAL_H_
#define LSPO_TEXT_TOKENIZER_INTERNAL_H_

#include <unicode/regex.h>
#include <unicode/umachine.h>
#include <unicode/utf8.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace lspo::model::internal {

// bytes_to_unicode: bytes 33-126, 161-172, 174-255 keep their code point; the remaining 68
// bytes, in increasing order, map to U+0100 + k.
struct ByteAlphabet {
  UChar32 byte_to_cp[256];
  int16_t cp_to_byte[512];        // code point (< 512) -> byte, or -1
  std::string byte_to_utf8[256];  // UTF-8 of byte_to_cp
  ByteAlphabet();
};
const ByteAlphabet& Alphabet();

// A compiled ICU regex (immutable, shareable between threads; each use makes its own matcher).
using SharedRegex = std::shared_ptr<const icu::RegexPattern>;

// A `{"String": s}` or `{"Regex": r}` pattern of Split / Replace.
struct HfPattern {
  std::string literal;  // used when regex is null
  SharedRegex regex;
};

struct HfNormalizer {
  enum class Kind { kNfc, kNfd, kNfkc, kNfkd, kPrepend, kReplace } kind;
  std::string text;   // kPrepend: the prefix; kReplace: the replacement
  HfPattern pattern;  // kReplace
};

enum class HfSplitBehavior {
  kRemoved,
  kIsolated,
  kMergedWithPrevious,
  kMergedWithNext,
  kContiguous
};

struct HfPreTokenizer {
  enum class Kind { kByteLevel, kDigits, kSplit, kMetaspace } kind;
  bool add_prefix_space = false;                          // kByteLevel
  bool use_regex = true;                                  // kByteLevel
  bool individual_digits = false;                         // kDigits
  HfPattern pattern;                                      // kSplit
  HfSplitBehavior behavior = HfSplitBehavior::kIsolated;  // kSplit
  bool invert = false;                                    // kSplit
  std::string replacement;                                // kMetaspace: one character, UTF-8
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;  // kMetaspace
  bool split = true;                                                          // kMetaspace
};

struct HfDecoder {
  enum class Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind;
  HfPattern pattern;    // kReplace
  std::string content;  // kReplace: replacement; kStrip: the character; kMetaspace: replacement
  int32_t start = 0;    // kStrip
  int32_t stop = 0;     // kStrip
  bool prepend = true;  // kMetaspace: prepend_scheme != "never"
};

struct HfAddedToken {
  int32_t id = -1;
  std::string content;
  std::string pattern;  // what is matched: content, or content normalized when `normalized`
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// Added tokens matched by leftmost-longest search (indices into HfPipeline::added).
struct HfAddedMatcher {
  std::vector<int32_t> by_length;  // longest pattern first
  bool first_byte[256] = {};
  bool empty() const { return by_length.empty(); }
};

struct HfPipeline {
  std::vector<HfNormalizer> normalizers;
  std::vector<HfPreTokenizer> pre_tokenizers;
  bool byte_level = false;   // the last pre-tokenizer is ByteLevel: model symbols are bytes
  bool has_decoder = false;  // false: Decode joins the token strings with " " (as HF does)
  std::vector<HfDecoder> decoders;

  // BPE model options (model.*).
  bool byte_fallback = false;
  bool fuse_unk = false;
  bool ignore_merges = false;
  int32_t model_unk_id = -1;   // model.unk_token's id, -1 = null
  int32_t byte_token_id[256];  // id of "<0xNN>" in model.vocab, -1 if absent

  std::vector<HfAddedToken> added;
  HfAddedMatcher raw_matcher;         // normalized == false: matched on the input text
  HfAddedMatcher normalized_matcher;  // normalized == true: matched on normalized text
  // Decode's text for added tokens with normalized == true: their normalized content (as
  // `tokenizers` decodes them); other ids decode from their token string.
  absl::flat_hash_map<int32_t, std::string> normalized_added_text;

  bool adds_bos = false;  // post_processor prepends bos_id to a single sequence
  bool adds_eos = false;  // post_processor appends eos_id to a single sequence

  // Original file texts, written back by WriteHfFiles.
  std::string tokenizer_json;
  std::string tokenizer_config_json;    // empty = the source had none
  std::string chat_template_jinja;      // empty = the source had none
  std::string special_tokens_map_json;  // empty = the source had none
};

// ---------------------------------------------------------------------------------------------
// The tokenizer.json pipeline (tokenizer_hf_pipeline.cc)

// Decodes one code point at `*i` (advancing it); ill-formed sequences give cp < 0 and consume
// their maximal subpart (ICU U8_NEXT).
inline UChar32 NextCodePoint(absl::string_view s, int32_t* i) {
  UChar32 cp;
  U8_NEXT(s.data(), *i, static_cast<int32_t>(s.size()), cp);
  return cp;
}

// NormalizedString::replace: every match of `pattern` in `s` (empty ones included) replaced by
// `content`.
std::string ReplaceAll(const HfPattern& pattern, absl::string_view s, absl::string_view content);

// The normalizer chain on one piece.
std::string Normalize(const std::vector<HfNormalizer>& chain, absl::string_view in);

// Added tokens: AddedVocabulary::find_matches.
struct Piece {
  size_t begin;
  size_t end;
  int32_t added_id;  // -1 = ordinary text
};

// Splits `s` into the added tokens of `m` (leftmost-longest, honouring single_word, lstrip and
// rstrip) and the ordinary text between them, in order, into `out` (cleared first).
void SplitAdded(const HfPipeline& p, const HfAddedMatcher& m, absl::string_view s,
                std::vector<Piece>* out);

// Pre-tokenizers.
struct Word {
  std::string text;
  bool first;  // starts at offset 0 of the original input (Metaspace prepend_scheme "first")
};

// Runs the pre-tokenizer chain of `p` on `text` (`first`: it starts the input) into `words`
// (cleared first; an empty text gives none).
void PreTokenizeHf(const HfPipeline& p, std::string text, bool first, std::vector<Word>* words);

}  // namespace lspo::model::internal

#endif  // LSPO_TEXT_TOKENIZER_INTERNAL_H_
