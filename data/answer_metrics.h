// Scores of a generated answer against the reference answer, for generative evaluation
// (JobSpec.eval.metric = generative): exact match of the normalised strings and the
// precision / recall / F1 of their tag sets. Torch-free, pure functions.
//
// Normalisation: Unicode case folding (ICU, full folding: "Straße" ~ "STRASSE"), white space
// runs (ASCII space, \t, \n, \r, \f, \v) collapsed to one space, leading and trailing white
// space removed. Tags: the normalised answer split at ',' with each piece trimmed, empty
// pieces dropped, duplicates counted once (a set). An answer without a comma is one tag, so
// for single-label answers F1 equals exact match.
//
// Tag-set scores of prediction tags P against reference tags R (the per-example F1 of
// multi-label classification; averaged over examples it is the "example-based" F1 of
// Tsoumakas & Katakis, 2007):
//   precision = |P ∩ R| / |P|,  recall = |P ∩ R| / |R|,  F1 = 2 p r / (p + r)  (0 when p + r = 0)
// with precision = recall = F1 = 1 when both sets are empty and 0 when only one is.
#ifndef LSPO_DATA_ANSWER_METRICS_H_
#define LSPO_DATA_ANSWER_METRICS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace lspo::data {

// The normalised form of `answer` (UTF-8 in, UTF-8 out; invalid UTF-8 bytes become U+FFFD).
std::string NormalizeAnswer(absl::string_view answer);

// The tag set of `answer`, sorted, each tag normalised.
std::vector<std::string> AnswerTags(absl::string_view answer);

// One prediction scored against its reference.
struct AnswerScore {
  bool exact_match = false;  // NormalizeAnswer(prediction) == NormalizeAnswer(reference)
  double precision = 0.0;    // 0..1
  double recall = 0.0;       // 0..1
  double f1 = 0.0;           // 0..1
};

// Scores `prediction` against `reference` (the rules in the file comment). Never fails.
AnswerScore ScoreAnswer(absl::string_view prediction, absl::string_view reference);

}  // namespace lspo::data

#endif  // LSPO_DATA_ANSWER_METRICS_H_
