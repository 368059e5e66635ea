// Generated-answer scores; see answer_metrics.h.
#include "data/answer_metrics.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "unicode/unistr.h"

namespace lspo::data {

std::string NormalizeAnswer(absl::string_view answer) {
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(
      icu::StringPiece(answer.data(), static_cast<int32_t>(answer.size())));
  u.foldCase();
  std::string folded;
  u.toUTF8String(folded);
  std::string out;
  out.reserve(folded.size());
  bool space = false;
  for (char c : folded) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      space = !out.empty();
      continue;
    }
    if (space) out.push_back(' ');
    space = false;
    out.push_back(c);
  }
  return out;
}

std::vector<std::string> AnswerTags(absl::string_view answer) {
  std::vector<std::string> tags;
  for (absl::string_view piece : absl::StrSplit(NormalizeAnswer(answer), ',')) {
    piece = absl::StripAsciiWhitespace(piece);
    if (!piece.empty()) tags.emplace_back(piece);
  }
  std::sort(tags.begin(), tags.end());
  tags.erase(std::unique(tags.begin(), tags.end()), tags.end());
  return tags;
}

AnswerScore ScoreAnswer(absl::string_view prediction, absl::string_view reference) {
  AnswerScore s;
  s.exact_match = NormalizeAnswer(prediction) == NormalizeAnswer(reference);
  const std::vector<std::string> p = AnswerTags(prediction);
  const std::vector<std::string> r = AnswerTags(reference);
  if (p.empty() || r.empty()) {
    const double both = p.empty() && r.empty() ? 1.0 : 0.0;
    s.precision = s.recall = s.f1 = both;
    return s;
  }
  std::vector<std::string> common;
  std::set_intersection(p.begin(), p.end(), r.begin(), r.end(), std::back_inserter(common));
  s.precision = static_cast<double>(common.size()) / static_cast<double>(p.size());
  s.recall = static_cast<double>(common.size()) / static_cast<double>(r.size());
  s.f1 = s.precision + s.recall > 0 ? 2 * s.precision * s.recall / (s.precision + s.recall) : 0;
  return s;
}

}  // namespace lspo::data
