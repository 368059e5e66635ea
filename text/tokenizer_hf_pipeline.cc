// The text side of the Hugging Face tokenizer.json pipeline of BpeTokenizer (text/tokenizer.h):
// pattern matching (String and ICU Regex patterns), the normalizers, the split of the added
// tokens out of a text and the pre-tokenizers (ByteLevel, Digits, Split, Metaspace).
//
// Semantics follow the Hugging Face `tokenizers` Rust crate (0.2x): AddedVocabulary
// (extract_and_normalize, find_matches), NormalizedString::split / replace, Pattern::find_matches
// (onig find_iter: an empty match right after the previous match is skipped) and the
// pre-tokenizers ByteLevel / Digits / Split / Metaspace / Sequence. See docs/formats.md §6a.
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"

namespace lspo::model::internal {
namespace {

constexpr int32_t kRegexTimeLimit = 2000;  // ICU match steps (~ms) per find(); see FindAll

// ---------------------------------------------------------------------------------------------
// Text helpers.

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

}  // namespace

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

namespace {

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

}  // namespace

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
namespace {

void SplitWords(const std::vector<Span>& spans, const Word& w, std::vector<Word>* out) {
  for (const Span& sp : spans) {
    out->push_back({w.text.substr(sp.first, sp.second - sp.first), w.first && sp.first == 0});
  }
}

}  // namespace

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

}  // namespace lspo::model::internal
