// Generated-answer scores (data/answer_metrics.h) on hand-computed cases: the set arithmetic of
// precision / recall / F1, normalisation (case folding, white space), the empty-set rules.
#include "data/answer_metrics.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lspo::data {
namespace {

using ::testing::ElementsAre;

TEST(AnswerMetricsTest, NormalizesCaseAndWhiteSpace) {
  EXPECT_EQ(NormalizeAnswer("  Sous \t  Vide\n"), "sous vide");
  // ICU full case folding: the sharp s folds to "ss", so both spellings match.
  EXPECT_EQ(NormalizeAnswer("STRASSE"), NormalizeAnswer("Straße"));
  EXPECT_EQ(NormalizeAnswer("Crème Brûlée"), "crème brûlée");
  EXPECT_EQ(NormalizeAnswer(""), "");
  EXPECT_EQ(NormalizeAnswer(" \n "), "");
}

TEST(AnswerMetricsTest, TagsAreASortedSetOfTrimmedPieces) {
  EXPECT_THAT(AnswerTags("Bread, baking,, yeast , bread,"), ElementsAre("baking", "bread", "yeast"));
  EXPECT_THAT(AnswerTags("food-safety"), ElementsAre("food-safety"));
  EXPECT_TRUE(AnswerTags(" , ,").empty());
}

TEST(AnswerMetricsTest, PrecisionRecallAndF1OfTagSets) {
  // P = {baking, bread, yeast}, R = {baking, bread}: p = 2/3, r = 1, F1 = 2(2/3)/(5/3) = 0.8.
  AnswerScore s = ScoreAnswer("baking, bread, yeast", "bread, Baking");
  EXPECT_FALSE(s.exact_match);
  EXPECT_DOUBLE_EQ(s.precision, 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.recall, 1.0);
  EXPECT_DOUBLE_EQ(s.f1, 0.8);
  // P = {a}, R = {a, b, c, d}: p = 1, r = 1/4, F1 = 2(1/4)/(5/4) = 0.4.
  s = ScoreAnswer("a", "a, b, c, d");
  EXPECT_DOUBLE_EQ(s.precision, 1.0);
  EXPECT_DOUBLE_EQ(s.recall, 0.25);
  EXPECT_DOUBLE_EQ(s.f1, 0.4);
  // A duplicate counts once: P = {a, b} against R = {a}.
  s = ScoreAnswer("a, a, b", "a");
  EXPECT_DOUBLE_EQ(s.precision, 0.5);
  EXPECT_DOUBLE_EQ(s.f1, 2.0 / 3.0);
  // Disjoint sets.
  s = ScoreAnswer("baking", "frying");
  EXPECT_EQ(s.f1, 0.0);
  EXPECT_EQ(s.precision, 0.0);
  EXPECT_EQ(s.recall, 0.0);
}

TEST(AnswerMetricsTest, ExactMatchIsOnTheNormalisedString) {
  EXPECT_TRUE(ScoreAnswer(" Bread ", "bread").exact_match);
  EXPECT_DOUBLE_EQ(ScoreAnswer(" Bread ", "bread").f1, 1.0);
  // The same tag set in another order is F1 1 but not an exact match.
  AnswerScore s = ScoreAnswer("yeast, bread", "bread, yeast");
  EXPECT_FALSE(s.exact_match);
  EXPECT_DOUBLE_EQ(s.f1, 1.0);
  // A single-label answer: F1 is exact match.
  EXPECT_EQ(ScoreAnswer("spam", "ham").f1, 0.0);
  EXPECT_EQ(ScoreAnswer("Spam", "spam").f1, 1.0);
}

TEST(AnswerMetricsTest, EmptyAnswers) {
  AnswerScore both = ScoreAnswer("", " ");
  EXPECT_TRUE(both.exact_match);
  EXPECT_EQ(both.f1, 1.0);
  AnswerScore none = ScoreAnswer("", "bread");
  EXPECT_FALSE(none.exact_match);
  EXPECT_EQ(none.precision, 0.0);
  EXPECT_EQ(none.recall, 0.0);
  EXPECT_EQ(none.f1, 0.0);
  EXPECT_EQ(ScoreAnswer("bread", "").f1, 0.0);
}

}  // namespace
}  // namespace lspo::data
