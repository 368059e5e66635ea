// Hugging Face tokenizer.json support for BpeTokenizer (model/tokenizer.h): the reader
// (FromHfJson / FromHfFolder), the encode pipeline (added tokens, normalizers, pre-tokenizers,
// BPE model options), the decoder chain and WriteHfFiles for such tokenizers.
//
// Semantics follow the Hugging Face `tokenizers` Rust crate (0.2x): AddedVocabulary
// (extract_and_normalize, find_matches), NormalizedString::split / replace, Pattern::find_matches
// (onig find_iter: an empty match right after the previous match is skipped), the pre-tokenizers
// ByteLevel / Digits / Split / Metaspace / Sequence, BPE::merge_word (byte_fallback, unk,
// fuse_unk, ignore_merges) and Word::merge_all, and the decoders. See docs/formats.md §6a.
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "model/tokenizer.h"
#include "model/tokenizer_internal.h"
#include "nlohmann/json.hpp"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

using internal::Alphabet;
using internal::HfAddedMatcher;
using internal::HfAddedToken;
using internal::HfDecoder;
using internal::HfNormalizer;
using internal::HfPattern;
using internal::HfPipeline;
using internal::HfPreTokenizer;
using internal::HfSplitBehavior;
using Json = nlohmann::json;

constexpr int kMaxNesting = 8;             // Sequence inside Sequence ... (refused deeper)
constexpr int32_t kRegexTimeLimit = 2000;  // ICU match steps (~ms) per find(); see FindAll
constexpr size_t kCacheableWord = 256;     // words up to this many bytes are cached per Encode

// ---------------------------------------------------------------------------------------------
// Text helpers.

// Decodes one code point at `*i` (advancing it); ill-formed sequences give cp < 0 and consume
// their maximal subpart (ICU U8_NEXT).
UChar32 NextCodePoint(absl::string_view s, int32_t* i) {
  UChar32 cp;
  U8_NEXT(s.data(), *i, static_cast<int32_t>(s.size()), cp);
  return cp;
}

// Rust char::is_whitespace / regex \s: the White_Space property.
bool IsSpaceCp(UChar32 cp) { return cp >= 0 && u_isUWhiteSpace(cp); }

// Rust regex \w (Unicode): Alphabetic, M*, Nd, Pc, Join_Control.
bool IsWordCp(UChar32 cp) {
  if (cp < 0) return false;
  if (u_hasBinaryProperty(cp, UCHAR_ALPHABETIC) || u_hasBinaryProperty(cp, UCHAR_JOIN_CONTROL)) {
    return true;
  }
  switch (u_charType(cp)) {
    case U_NON_SPACING_MARK:
    case U_ENCLOSING_MARK:
    case U_COMBINING_SPACING_MARK:
    case U_DECIMAL_DIGIT_NUMBER:
    case U_CONNECTOR_PUNCTUATION:
      return true;
    default:
      return false;
  }
}

// Rust char::is_numeric: general category Nd, Nl or No.
bool IsNumericCp(UChar32 cp) {
  if (cp < 0) return false;
  int8_t t = u_charType(cp);
  return t == U_DECIMAL_DIGIT_NUMBER || t == U_LETTER_NUMBER || t == U_OTHER_NUMBER;
}

// The code point that ends at byte `end` of s (cp < 0 when ill-formed or end == 0).
UChar32 LastCodePoint(absl::string_view s, size_t end, int32_t* start) {
  if (end == 0) return -1;
  int32_t i = static_cast<int32_t>(end);
  UChar32 cp;
  U8_PREV(s.data(), 0, i, cp);
  *start = i;
  return cp;
}

// The input as UTF-16 for ICU, with the byte offset of each UTF-16 unit (and of the end).
// Ill-formed UTF-8 becomes U+FFFD, one per maximal ill-formed subpart.
struct Utf16Text {
  icu::UnicodeString text;
  std::vector<int32_t> byte_at;  // [units + 1]
};

Utf16Text ToUtf16(absl::string_view s) {
  Utf16Text u;
  u.byte_at.reserve(s.size() + 1);
  int32_t i = 0;
  const int32_t n = static_cast<int32_t>(s.size());
  while (i < n) {
    int32_t start = i;
    UChar32 cp = NextCodePoint(s, &i);
    if (cp < 0) cp = 0xFFFD;
    u.text.append(cp);
    u.byte_at.push_back(start);
    if (cp > 0xFFFF) u.byte_at.push_back(start);
  }
  u.byte_at.push_back(n);
  return u;
}

using Span = std::pair<size_t, size_t>;  // byte offsets [first, second)

// All matches of `pattern` in `s`, as `tokenizers` finds them (onig find_iter semantics:
// leftmost, non-overlapping; an empty match that starts where the previous match ended is
// skipped and the search moves on by one character). A literal pattern is matched literally;
// the empty literal matches at every character boundary (it is an empty regex in `tokenizers`).
// An ICU run that exceeds its time limit or stack ends the search (only pathological fuzzed
// patterns get there).
std::vector<Span> FindAll(const HfPattern& pattern, absl::string_view s) {
  std::vector<Span> out;
  if (pattern.regex == nullptr && !pattern.literal.empty()) {
    const std::string& lit = pattern.literal;
    size_t pos = 0;
    while (pos <= s.size()) {
      size_t at = s.find(lit, pos);
      if (at == absl::string_view::npos) break;
      out.emplace_back(at, at + lit.size());
      pos = at + lit.size();
    }
    return out;
  }
  if (pattern.regex == nullptr) {  // empty literal: every boundary
    int32_t i = 0;
    const int32_t n = static_cast<int32_t>(s.size());
    out.emplace_back(0, 0);
    while (i < n) {
      NextCodePoint(s, &i);
      out.emplace_back(i, i);
    }
    return out;
  }
  Utf16Text u = ToUtf16(s);
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(pattern.regex->matcher(u.text, status));
  if (U_FAILURE(status) || m == nullptr) return out;
  m->setTimeLimit(kRegexTimeLimit, status);
  status = U_ZERO_ERROR;
  const int32_t len = u.text.length();
  int32_t last_end = 0;
  int32_t last_match_end = -1;
  while (last_end <= len) {
    if (!m->find(last_end, status) || U_FAILURE(status)) break;
    int32_t start = m->start(status);
    int32_t end = m->end(status);
    if (U_FAILURE(status)) break;
    if (start == end && end == last_match_end) {
      if (last_end >= len) break;
      last_end += (U16_IS_LEAD(u.text[last_end]) && last_end + 1 < len &&
                   U16_IS_TRAIL(u.text[last_end + 1]))
                      ? 2
                      : 1;
      continue;
    }
    last_end = end;
    last_match_end = end;
    out.emplace_back(u.byte_at[start], u.byte_at[end]);
  }
  return out;
}

// Pattern::find_matches: the matches plus the gaps between them, covering `s`.
struct Segment {
  size_t begin;
  size_t end;
  bool is_match;
};

std::vector<Segment> SegmentsOf(const std::vector<Span>& matches, size_t size) {
  std::vector<Segment> out;
  if (size == 0) {
    out.push_back({0, 0, false});
    return out;
  }
  size_t prev = 0;
  for (const Span& m : matches) {
    if (prev != m.first) out.push_back({prev, m.first, false});
    out.push_back({m.first, m.second, true});
    prev = m.second;
  }
  if (prev != size) out.push_back({prev, size, false});
  return out;
}

// The same for a character predicate: every matching character is its own match.
template <typename Pred>
std::vector<Segment> CharSegments(absl::string_view s, Pred pred) {
  std::vector<Segment> out;
  if (s.empty()) {
    out.push_back({0, 0, false});
    return out;
  }
  size_t last = 0;
  int32_t i = 0;
  const int32_t n = static_cast<int32_t>(s.size());
  while (i < n) {
    int32_t start = i;
    UChar32 cp = NextCodePoint(s, &i);
    if (pred(cp)) {
      if (last < static_cast<size_t>(start))
        out.push_back({last, static_cast<size_t>(start), false});
      out.push_back({static_cast<size_t>(start), static_cast<size_t>(i), true});
      last = i;
    }
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
  return out;
}

// NormalizedString::split: the kept, non-empty pieces for `behavior`.
std::vector<Span> ApplyBehavior(std::vector<Segment> segs, HfSplitBehavior behavior) {
  struct Acc {
    size_t begin, end;
    bool remove;
  };
  std::vector<Acc> acc;
  switch (behavior) {
    case HfSplitBehavior::kIsolated:
      for (const Segment& s : segs) acc.push_back({s.begin, s.end, false});
      break;
    case HfSplitBehavior::kRemoved:
      for (const Segment& s : segs) acc.push_back({s.begin, s.end, s.is_match});
      break;
    case HfSplitBehavior::kContiguous: {
      bool prev = false;
      for (const Segment& s : segs) {
        if (s.is_match == prev && !acc.empty()) {
          acc.back().end = s.end;
        } else {
          acc.push_back({s.begin, s.end, false});
        }
        prev = s.is_match;
      }
      break;
    }
    case HfSplitBehavior::kMergedWithPrevious: {
      bool prev = false;
      for (const Segment& s : segs) {
        if (s.is_match && !prev && !acc.empty()) {
          acc.back().end = s.end;
        } else {
          acc.push_back({s.begin, s.end, false});
        }
        prev = s.is_match;
      }
      break;
    }
    case HfSplitBehavior::kMergedWithNext: {
      bool prev = false;
      for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
        if (it->is_match && !prev && !acc.empty()) {
          acc.back().begin = it->begin;
        } else {
          acc.push_back({it->begin, it->end, false});
        }
        prev = it->is_match;
      }
      std::reverse(acc.begin(), acc.end());
      break;
    }
  }
  std::vector<Span> out;
  for (const Acc& a : acc) {
    if (!a.remove && a.end > a.begin) out.emplace_back(a.begin, a.end);
  }
  return out;
}

// NormalizedString::replace: every match (empty ones included) replaced by `content`.
std::string ReplaceAll(const HfPattern& pattern, absl::string_view s, absl::string_view content) {
  std::vector<Span> matches = FindAll(pattern, s);
  if (matches.empty()) return std::string(s);
  std::string out;
  out.reserve(s.size() + matches.size() * content.size());
  size_t prev = 0;
  for (const Span& m : matches) {
    out.append(s.data() + prev, m.first - prev);
    out.append(content.data(), content.size());
    prev = m.second;
  }
  out.append(s.data() + prev, s.size() - prev);
  return out;
}

// Unicode normalization of the well-formed runs of `s` (ill-formed bytes are kept as they are).
std::string UnicodeNormalize(const icu::Normalizer2& norm, absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  int32_t i = 0;
  const int32_t n = static_cast<int32_t>(s.size());
  int32_t run = 0;
  auto flush = [&](int32_t end) {
    if (end <= run) return;
    UErrorCode status = U_ZERO_ERROR;
    icu::StringByteSink<std::string> sink(&out);
    norm.normalizeUTF8(0, icu::StringPiece(s.data() + run, end - run), sink, nullptr, status);
    if (U_FAILURE(status)) out.append(s.data() + run, end - run);
  };
  while (i < n) {
    int32_t start = i;
    UChar32 cp = NextCodePoint(s, &i);
    if (cp < 0) {
      flush(start);
      out.append(s.data() + start, i - start);
      run = i;
    }
  }
  flush(n);
  return out;
}

const icu::Normalizer2* NormalizerInstance(HfNormalizer::Kind kind) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (kind) {
    case HfNormalizer::Kind::kNfc:
      n = icu::Normalizer2::getNFCInstance(status);
      break;
    case HfNormalizer::Kind::kNfd:
      n = icu::Normalizer2::getNFDInstance(status);
      break;
    case HfNormalizer::Kind::kNfkc:
      n = icu::Normalizer2::getNFKCInstance(status);
      break;
    case HfNormalizer::Kind::kNfkd:
      n = icu::Normalizer2::getNFKDInstance(status);
      break;
    default:
      break;
  }
  return U_FAILURE(status) ? nullptr : n;
}

// The normalizer chain on one piece.
std::string Normalize(const std::vector<HfNormalizer>& chain, absl::string_view in) {
  std::string s(in);
  for (const HfNormalizer& n : chain) {
    switch (n.kind) {
      case HfNormalizer::Kind::kNfc:
      case HfNormalizer::Kind::kNfd:
      case HfNormalizer::Kind::kNfkc:
      case HfNormalizer::Kind::kNfkd: {
        const icu::Normalizer2* norm = NormalizerInstance(n.kind);
        if (norm != nullptr) s = UnicodeNormalize(*norm, s);
        break;
      }
      case HfNormalizer::Kind::kPrepend:
        if (!s.empty()) s.insert(0, n.text);  // NormalizedString::prepend: not on empty text
        break;
      case HfNormalizer::Kind::kReplace:
        s = ReplaceAll(n.pattern, s, n.text);
        break;
    }
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Added tokens: AddedVocabulary::find_matches.
struct Piece {
  size_t begin;
  size_t end;
  int32_t added_id;  // -1 = ordinary text
};

void SplitAdded(const HfPipeline& p, const HfAddedMatcher& m, absl::string_view s,
                std::vector<Piece>* out) {
  out->clear();
  if (s.empty()) return;
  if (m.empty()) {
    out->push_back({0, s.size(), -1});
    return;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < s.size()) {
    // Leftmost-longest: the first position where a pattern matches, the longest one there.
    size_t mstart = s.size();
    int32_t which = -1;
    for (size_t q = pos; q < s.size() && which < 0; ++q) {
      if (!m.first_byte[static_cast<uint8_t>(s[q])]) continue;
      for (int32_t idx : m.by_length) {
        const std::string& pat = p.added[idx].pattern;
        if (s.size() - q >= pat.size() && s.compare(q, pat.size(), pat) == 0) {
          which = idx;
          mstart = q;
          break;
        }
      }
    }
    if (which < 0) break;
    const HfAddedToken& tok = p.added[which];
    size_t mend = mstart + tok.pattern.size();
    pos = mend;  // the search goes on after the match whatever is done with it
    if (tok.single_word) {
      int32_t before_start = 0;
      bool start_space = mstart == 0 || !IsWordCp(LastCodePoint(s, mstart, &before_start));
      int32_t after = static_cast<int32_t>(mend);
      bool stop_space = mend == s.size() || !IsWordCp(NextCodePoint(s, &after));
      if (!start_space || !stop_space) continue;
    }
    size_t start = mstart;
    size_t stop = mend;
    if (tok.lstrip) {  // the whitespace run that ends at `start`
      size_t k = start;
      while (k > 0) {
        int32_t cp_start = 0;
        UChar32 cp = LastCodePoint(s, k, &cp_start);
        if (!IsSpaceCp(cp)) break;
        k = cp_start;
      }
      start = std::max(k, start_offset);
    }
    if (tok.rstrip) {  // the whitespace run that starts at `stop`
      int32_t k = static_cast<int32_t>(stop);
      while (k < static_cast<int32_t>(s.size())) {
        int32_t next = k;
        if (!IsSpaceCp(NextCodePoint(s, &next))) break;
        k = next;
      }
      stop = k;
    }
    // A match inside the whitespace a previous rstrip took (only for tokens that begin with
    // whitespace) is clamped to it; `tokenizers` would emit overlapping pieces there.
    if (stop <= start_offset) continue;
    start = std::max(start, start_offset);
    if (start_offset < start) out->push_back({start_offset, start, -1});
    out->push_back({start, stop, tok.id});
    start_offset = stop;
  }
  if (start_offset != s.size()) out->push_back({start_offset, s.size(), -1});
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizers.
struct Word {
  std::string text;
  bool first;  // starts at offset 0 of the original input (Metaspace prepend_scheme "first")
};

void SplitWords(const std::vector<Span>& spans, const Word& w, std::vector<Word>* out) {
  for (const Span& sp : spans) {
    out->push_back({w.text.substr(sp.first, sp.second - sp.first), w.first && sp.first == 0});
  }
}

void PreTokenizeHf(const HfPipeline& p, std::string text, bool first, std::vector<Word>* words) {
  words->clear();
  if (text.empty()) return;
  words->push_back({std::move(text), first});
  std::vector<Word> next;
  for (const HfPreTokenizer& step : p.pre_tokenizers) {
    next.clear();
    for (Word& w : *words) {
      switch (step.kind) {
        case HfPreTokenizer::Kind::kSplit: {
          std::vector<Segment> segs = SegmentsOf(FindAll(step.pattern, w.text), w.text.size());
          if (step.invert) {
            for (Segment& s : segs) s.is_match = !s.is_match;
          }
          SplitWords(ApplyBehavior(std::move(segs), step.behavior), w, &next);
          break;
        }
        case HfPreTokenizer::Kind::kDigits: {
          std::vector<Segment> segs = CharSegments(w.text, IsNumericCp);
          SplitWords(
              ApplyBehavior(std::move(segs), step.individual_digits ? HfSplitBehavior::kIsolated
                                                                    : HfSplitBehavior::kContiguous),
              w, &next);
          break;
        }
        case HfPreTokenizer::Kind::kMetaspace: {
          Word m{absl::StrReplaceAll(w.text, {{" ", step.replacement}}), w.first};
          bool prepend = step.prepend == HfPreTokenizer::Prepend::kAlways ||
                         (step.prepend == HfPreTokenizer::Prepend::kFirst && w.first);
          if (prepend && !m.text.empty() && !absl::StartsWith(m.text, step.replacement)) {
            m.text.insert(0, step.replacement);
          }
          if (!step.split) {
            if (!m.text.empty()) next.push_back(std::move(m));
            break;
          }
          int32_t ri = 0;
          const UChar32 rep = NextCodePoint(step.replacement, &ri);
          std::vector<Segment> segs = CharSegments(m.text, [rep](UChar32 c) { return c == rep; });
          SplitWords(ApplyBehavior(std::move(segs), HfSplitBehavior::kMergedWithNext), m, &next);
          break;
        }
        case HfPreTokenizer::Kind::kByteLevel: {
          if (step.add_prefix_space && !w.text.empty() && w.text[0] != ' ') {
            w.text.insert(0, " ");
          }
          if (!step.use_regex) {
            next.push_back(std::move(w));
            break;
          }
          for (absl::string_view piece : PreTokenize(w.text, PreTokenizerKind::kGpt2)) {
            if (!piece.empty()) next.push_back({std::string(piece), false});
          }
          break;
        }
      }
    }
    words->swap(next);
  }
}

// ---------------------------------------------------------------------------------------------
// Decoders (`tokenizers` decode_chain of each decoder; the result is joined with "").

// "<0xNN>" -> the byte, as ByteFallback reads it (u8::from_str_radix also takes "+N").
int ByteFallbackValue(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (t[3] == '+') return hex(t[4]);
  int hi = hex(t[3]);
  int lo = hex(t[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

void RunDecoder(const HfDecoder& d, std::vector<std::string>* tokens) {
  switch (d.kind) {
    case HfDecoder::Kind::kByteLevel: {
      // Each token's characters map back to bytes; a token with a character outside the
      // alphabet is kept as its UTF-8. The result is one string.
      const internal::ByteAlphabet& a = Alphabet();
      std::string joined;
      for (const std::string& t : *tokens) {
        std::string bytes;
        bool all = true;
        int32_t i = 0;
        while (i < static_cast<int32_t>(t.size())) {
          UChar32 cp = NextCodePoint(t, &i);
          if (cp < 0 || cp >= 512 || a.cp_to_byte[cp] < 0) {
            all = false;
            break;
          }
          bytes.push_back(static_cast<char>(a.cp_to_byte[cp]));
        }
        joined += all ? bytes : t;
      }
      tokens->assign(1, std::move(joined));
      break;
    }
    case HfDecoder::Kind::kReplace:
      for (std::string& t : *tokens) t = ReplaceAll(d.pattern, t, d.content);
      break;
    case HfDecoder::Kind::kByteFallback: {
      // Runs of <0xNN> tokens become their bytes (kept as they are when not UTF-8; HF writes
      // one U+FFFD per byte there).
      std::vector<std::string> out;
      std::string bytes;
      bool in_run = false;
      for (std::string& t : *tokens) {
        int b = ByteFallbackValue(t);
        if (b >= 0) {
          bytes.push_back(static_cast<char>(b));
          in_run = true;
          continue;
        }
        if (in_run) {
          out.push_back(std::move(bytes));
          bytes.clear();
          in_run = false;
        }
        out.push_back(std::move(t));
      }
      if (in_run) out.push_back(std::move(bytes));
      tokens->swap(out);
      break;
    }
    case HfDecoder::Kind::kFuse: {
      std::string joined = absl::StrJoin(*tokens, "");
      tokens->assign(1, std::move(joined));
      break;
    }
    case HfDecoder::Kind::kStrip: {
      for (std::string& t : *tokens) {
        // Strip up to `start` leading and `stop` trailing `content` characters.
        size_t begin = 0;
        size_t end = t.size();
        for (int32_t k = 0;
             k < d.start && absl::StartsWith(absl::string_view(t).substr(begin), d.content); ++k) {
          begin += d.content.size();
        }
        for (int32_t k = 0;
             k < d.stop && end >= begin + d.content.size() &&
             absl::EndsWith(absl::string_view(t).substr(begin, end - begin), d.content);
             ++k) {
          end -= d.content.size();
        }
        t = t.substr(begin, end - begin);
      }
      break;
    }
    case HfDecoder::Kind::kMetaspace: {
      for (size_t i = 0; i < tokens->size(); ++i) {
        absl::string_view with = (i == 0 && d.prepend) ? "" : " ";
        (*tokens)[i] = absl::StrReplaceAll((*tokens)[i], {{d.content, with}});
      }
      break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// JSON reading. Every accessor names the file and the field in its error.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }

  absl::Status Bad(absl::string_view field, absl::string_view what) const {
    return absl::DataLossError(absl::StrCat("'", file_, "': ", field, " ", what));
  }
  absl::Status Unsupported(absl::string_view field, const Json& value,
                           absl::string_view supported) const {
    return absl::UnimplementedError(
        absl::StrCat("'", file_, "': ", field, " is ", Show(value),
                     ", which is not supported; supported: ", supported));
  }
  // A short rendering of a JSON value for messages: scalars as JSON, containers by kind only
  // (dumping them would recurse as deep as the input nests).
  static std::string Show(const Json& v) {
    if (v.is_array()) return "an array";
    if (v.is_object()) return "an object";
    std::string s = v.dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace);
    if (s.size() > 120) s = s.substr(0, 117) + "...";
    return s;
  }

  // obj[key] or nullptr when absent.
  static const Json* Find(const Json& obj, const char* key) {
    if (!obj.is_object()) return nullptr;
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  absl::StatusOr<bool> Bool(const Json& obj, const char* key, bool def,
                            absl::string_view path) const {
    const Json* v = Find(obj, key);
    if (v == nullptr || v->is_null()) return def;
    if (!v->is_boolean()) {
      return Bad(absl::StrCat(path, ".", key),
                 absl::StrCat("is ", Show(*v), "; expected true or false"));
    }
    return v->get<bool>();
  }
  absl::StatusOr<std::string> String(const Json& obj, const char* key,
                                     absl::string_view path) const {
    const Json* v = Find(obj, key);
    if (v == nullptr) return Bad(absl::StrCat(path, ".", key), "is missing; expected a string");
    if (!v->is_string()) {
      return Bad(absl::StrCat(path, ".", key),
                 absl::StrCat("is ", Show(*v), "; expected a string"));
    }
    return v->get<std::string>();
  }
  absl::StatusOr<int64_t> Int(const Json& obj, const char* key, int64_t def, int64_t lo, int64_t hi,
                              absl::string_view path) const {
    const Json* v = Find(obj, key);
    if (v == nullptr || v->is_null()) return def;
    int64_t x = 0;
    if (!AsInt(*v, lo, hi, &x)) {
      return Bad(absl::StrCat(path, ".", key),
                 absl::StrCat("is ", Show(*v), "; expected an integer in [", lo, ", ", hi, "]"));
    }
    return x;
  }
  static bool AsInt(const Json& v, int64_t lo, int64_t hi, int64_t* out) {
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

  // {"String": s} or {"Regex": r}.
  absl::StatusOr<HfPattern> Pattern(const Json& obj, absl::string_view path) const {
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

  absl::StatusOr<HfPattern> CompileRegex(const std::string& source,
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

 private:
  std::string file_;
};

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

// ---- post-processor: what a single sequence gets before / after $A.
struct PostSummary {
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;
  bool have_template = false;
};

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

}  // namespace

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
  ASSIGN_OR_RETURN(std::string type, r.String(*model, "type", "model"));
  if (type != "BPE") {
    return r.Unsupported("model.type", Json(type),
                         "BPE (byte-level as GPT-2 / Llama 3 / Qwen2, or SentencePiece-style "
                         "with byte_fallback as Llama 2 / Mistral)");
  }
  if (const Json* d = Reader::Find(*model, "dropout"); d != nullptr && !d->is_null()) {
    if (!d->is_number() || d->get<double>() != 0.0) {
      return r.Unsupported("model.dropout", *d, "null (or 0): deterministic BPE");
    }
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const Json* v = Reader::Find(*model, key);
    if (v != nullptr && !v->is_null() && !(v->is_string() && v->get<std::string>().empty())) {
      return r.Unsupported(absl::StrCat("model.", key), *v, "null or \"\"");
    }
  }
  ASSIGN_OR_RETURN(hf->byte_fallback, r.Bool(*model, "byte_fallback", false, "model"));
  ASSIGN_OR_RETURN(hf->fuse_unk, r.Bool(*model, "fuse_unk", false, "model"));
  ASSIGN_OR_RETURN(hf->ignore_merges, r.Bool(*model, "ignore_merges", false, "model"));

  const Json* vocab = Reader::Find(*model, "vocab");
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

  BpeTokenizer t;
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

  if (const Json* unk = Reader::Find(*model, "unk_token"); unk != nullptr && !unk->is_null()) {
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

  // merges ("A B" strings or ["A", "B"] pairs); a repeated pair keeps its last rank.
  const Json* merges = Reader::Find(*model, "merges");
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
        Merge{static_cast<int32_t>(rank), mi->second});
  }

  // pipeline --------------------------------------------------------------------------------
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
  PostSummary post;
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

  // tokenizer_config.json ---------------------------------------------------------------------
  t.unk_id_ = hf->model_unk_id;
  t.bos_id_ = post.prefix.empty() ? -1 : post.prefix[0];
  t.eos_id_ = post.suffix.empty() ? -1 : post.suffix[0];
  hf->adds_bos = !post.prefix.empty();
  hf->adds_eos = !post.suffix.empty();
  if (!tokenizer_config_json_text.empty()) {
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

// -----------------------------------------------------------------------------------------------
void BpeTokenizer::EncodeHfWord(absl::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  const HfPipeline& p = *hf_;
  const internal::ByteAlphabet& alphabet = Alphabet();
  if (p.ignore_merges) {
    std::string key;
    if (p.byte_level) {
      for (char ch : word) key += alphabet.byte_to_utf8[static_cast<uint8_t>(ch)];
    }
    auto it = token_to_id_.find(p.byte_level ? absl::string_view(key) : word);
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  // BPE::merge_word: one symbol per character (per byte for ByteLevel).
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  bool pending_unk = false;
  auto unknown = [&](absl::string_view symbol) {
    if (p.byte_fallback) {
      std::vector<int32_t> bytes;
      for (char ch : symbol) {
        int32_t id = p.byte_token_id[static_cast<uint8_t>(ch)];
        if (id < 0) break;
        bytes.push_back(id);
      }
      if (bytes.size() == symbol.size()) {  // (a pending unk stays pending, as in tokenizers)
        symbols.insert(symbols.end(), bytes.begin(), bytes.end());
        return;
      }
    }
    if (p.model_unk_id < 0) return;  // no unk_token: dropped
    if (pending_unk && !p.fuse_unk) symbols.push_back(p.model_unk_id);
    pending_unk = true;
  };
  auto known = [&](int32_t id) {
    if (pending_unk) {
      symbols.push_back(p.model_unk_id);
      pending_unk = false;
    }
    symbols.push_back(id);
  };
  if (p.byte_level) {
    for (char ch : word) {
      int32_t id = byte_to_id_[static_cast<uint8_t>(ch)];
      if (id >= 0) {
        known(id);
      } else {
        unknown(alphabet.byte_to_utf8[static_cast<uint8_t>(ch)]);
      }
    }
  } else {
    int32_t i = 0;
    while (i < static_cast<int32_t>(word.size())) {
      int32_t start = i;
      NextCodePoint(word, &i);
      absl::string_view ch = word.substr(start, i - start);
      auto it = token_to_id_.find(ch);
      if (it != token_to_id_.end()) {
        known(it->second);
      } else {
        unknown(ch);
      }
    }
  }
  if (pending_unk) symbols.push_back(p.model_unk_id);
  ApplyMerges(std::move(symbols), out);
}

std::vector<int32_t> BpeTokenizer::EncodeHf(absl::string_view text) const {
  const HfPipeline& p = *hf_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache;
  std::vector<Word> words;
  auto encode_words = [&](const std::string& piece, bool first) {
    PreTokenizeHf(p, piece, first, &words);
    for (const Word& w : words) {
      if (w.text.size() > kCacheableWord) {
        EncodeHfWord(w.text, &out);
        continue;
      }
      auto it = cache.find(w.text);
      if (it == cache.end()) {
        std::vector<int32_t> ids;
        EncodeHfWord(w.text, &ids);
        it = cache.emplace(w.text, std::move(ids)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  };
  std::vector<Piece> raw, normalized;
  SplitAdded(p, p.raw_matcher, text, &raw);
  for (const Piece& piece : raw) {
    if (piece.added_id >= 0) {
      out.push_back(piece.added_id);
      continue;
    }
    // The original offset of a normalized piece is that of its first character; a normalizer
    // that deletes leading characters is not tracked (none of the supported ones is used so).
    std::string norm = Normalize(p.normalizers, text.substr(piece.begin, piece.end - piece.begin));
    const bool first = piece.begin == 0;
    if (p.normalized_matcher.empty()) {
      encode_words(norm, first);
      continue;
    }
    SplitAdded(p, p.normalized_matcher, norm, &normalized);
    for (const Piece& sub : normalized) {
      if (sub.added_id >= 0) {
        out.push_back(sub.added_id);
      } else {
        encode_words(norm.substr(sub.begin, sub.end - sub.begin), first && sub.begin == 0);
      }
    }
  }
  return out;
}

std::string BpeTokenizer::DecodeHf(absl::Span<const int32_t> ids) const {
  const HfPipeline& p = *hf_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (!p.normalized_added_text.empty()) {
      auto it = p.normalized_added_text.find(id);
      if (it != p.normalized_added_text.end()) {
        tokens.push_back(it->second);
        continue;
      }
    }
    tokens.push_back(tokens_[id]);
  }
  if (!p.has_decoder) return absl::StrJoin(tokens, " ");
  for (const HfDecoder& d : p.decoders) RunDecoder(d, &tokens);
  return absl::StrJoin(tokens, "");
}

absl::Status BpeTokenizer::WriteHfSourceFiles(const std::string& dir) const {
  const HfPipeline& p = *hf_;
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
