// Tests for lsp/subspace.h: the per-matrix subspace of every rule, on both sides of the
// boundary side == d, with SmolLM2-135M's shapes (q/o 576 x 576, k/v 192 x 576, gate/up
// 1536 x 576, down 576 x 1536) and the wide 64 x 256 matrix of docs/known-failures.md #10.
#include "lsp/subspace.h"

#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lspo::lsp {
namespace {

using ::testing::HasSubstr;

MatrixSubspace Resolve(int64_t m, int64_t n, int64_t d, NarrowRule rule, int64_t r = 4) {
  absl::StatusOr<MatrixSubspace> s = ResolveSubspace(m, n, d, 0.0, r, rule);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : MatrixSubspace{};
}

void ExpectSide(const SideSubspace& s, int64_t rows, int64_t dim, int64_t r, bool identity) {
  EXPECT_EQ(s.rows, rows);
  EXPECT_EQ(s.dim, dim);
  EXPECT_EQ(s.r, r);
  EXPECT_EQ(s.identity, identity);
}

TEST(ResolveSubspace, BothSidesWiderThanDKeepTheSquareSubspaceUnderEveryRule) {
  for (NarrowRule rule : {NarrowRule::kOneSided, NarrowRule::kHalf, NarrowRule::kFull}) {
    const MatrixSubspace s = Resolve(192, 576, 191, rule);  // k_proj, d one below its side
    ExpectSide(s.p, 192, 191, 4, false);
    ExpectSide(s.q, 576, 191, 4, false);
    EXPECT_EQ(s.numel(), 191 * 191);
    EXPECT_FALSE(s.full());
    EXPECT_EQ(s.Describe(), "191 x 191");
  }
}

TEST(ResolveSubspace, OneSidedGivesTheNarrowSideTheIdentity) {
  // k_proj at d = 192 (side == d) and d = 288 (the paper's half of 576).
  for (int64_t d : {192, 288}) {
    const MatrixSubspace s = Resolve(192, 576, d, NarrowRule::kOneSided);
    ExpectSide(s.p, 192, 192, 1, true);
    ExpectSide(s.q, 576, d, 4, false);
    EXPECT_EQ(s.numel(), 192 * d);
    EXPECT_THAT(s.Describe(), HasSubstr("P identity"));
  }
  // The wide side may be P: down_proj-like (576 x 64) with d = 100 gives Q the identity.
  const MatrixSubspace w = Resolve(576, 64, 100, NarrowRule::kOneSided);
  ExpectSide(w.p, 576, 100, 4, false);
  ExpectSide(w.q, 64, 64, 1, true);
  // Wide 64 x 256 with d = 128 (known failure #10: a shape error in a peer).
  const MatrixSubspace k = Resolve(64, 256, 128, NarrowRule::kOneSided, 8);
  ExpectSide(k.p, 64, 64, 1, true);
  ExpectSide(k.q, 256, 128, 8, false);
  // Both sides narrow: identity on both, a full update.
  const MatrixSubspace f = Resolve(192, 576, 576, NarrowRule::kOneSided);
  EXPECT_TRUE(f.full());
  EXPECT_EQ(f.numel(), 192 * 576);
}

TEST(ResolveSubspace, HalfGivesTheMatrixHalfItsSmallerSide) {
  const MatrixSubspace s = Resolve(192, 576, 288, NarrowRule::kHalf, 16);
  ExpectSide(s.p, 192, 96, 16, false);
  ExpectSide(s.q, 576, 96, 16, false);
  // r is capped at the matrix's d: a 5 x 40 matrix at d = 8 gets d_i = 2, r_i = 2.
  const MatrixSubspace t = Resolve(5, 40, 8, NarrowRule::kHalf);
  ExpectSide(t.p, 5, 2, 2, false);
  ExpectSide(t.q, 40, 2, 2, false);
  // A side of 1: nothing to project, the identity.
  EXPECT_TRUE(Resolve(1, 40, 8, NarrowRule::kHalf).full());
}

TEST(ResolveSubspace, FullGivesIdentityOnBothSides) {
  const MatrixSubspace s = Resolve(192, 576, 288, NarrowRule::kFull);
  ExpectSide(s.p, 192, 192, 1, true);
  ExpectSide(s.q, 576, 576, 1, true);
  EXPECT_TRUE(s.full());
  EXPECT_THAT(s.Describe(), HasSubstr("full update"));
}

TEST(ResolveSubspace, RatioGivesEachMatrixItsOwnD) {
  const auto ratio = [](int64_t m, int64_t n, double x, int64_t r) {
    absl::StatusOr<MatrixSubspace> s = ResolveSubspace(m, n, 0, x, r, NarrowRule::kOneSided);
    EXPECT_TRUE(s.ok()) << s.status();
    return *s;
  };
  // 0.5 of SmolLM2's shapes: q 288, k 96, gate 288.
  EXPECT_EQ(ratio(576, 576, 0.5, 4).p.dim, 288);
  const MatrixSubspace k = ratio(192, 576, 0.5, 4);
  ExpectSide(k.p, 192, 96, 4, false);
  ExpectSide(k.q, 576, 96, 4, false);
  EXPECT_EQ(ratio(1536, 576, 0.5, 4).q.dim, 288);
  // Rounded, and never the whole side: 0.999 of 192 rounds to 192 and is clamped to 191.
  EXPECT_EQ(ratio(192, 576, 0.999, 4).p.dim, 191);
  EXPECT_EQ(ratio(192, 576, 0.001, 4).p.dim, 1);
  EXPECT_EQ(ratio(192, 576, 0.001, 4).p.r, 1);  // r capped at d_i
  EXPECT_EQ(ratio(10, 30, 0.25, 4).p.dim, 3);    // round(2.5) away from zero
}

TEST(ResolveSubspace, BadSettingsAreRefusedByName) {
  const auto code = [](absl::StatusOr<MatrixSubspace> s) { return s.status().code(); };
  const auto message = [](absl::StatusOr<MatrixSubspace> s) {
    return std::string(s.status().message());
  };
  EXPECT_EQ(code(ResolveSubspace(0, 5, 4, 0, 2, NarrowRule::kOneSided)),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(message(ResolveSubspace(8, 8, 4, 0, 0, NarrowRule::kOneSided)),
              HasSubstr("lsp.r = 0"));
  EXPECT_THAT(message(ResolveSubspace(8, 8, 4, 0.5, 2, NarrowRule::kOneSided)),
              HasSubstr("set exactly one"));
  EXPECT_THAT(message(ResolveSubspace(8, 8, 0, 0, 2, NarrowRule::kOneSided)),
              HasSubstr("set exactly one"));
  EXPECT_THAT(message(ResolveSubspace(8, 8, 0, 1.0, 2, NarrowRule::kOneSided)),
              HasSubstr("lsp.d_ratio = 1"));
  EXPECT_THAT(message(ResolveSubspace(8, 8, -3, 0, 2, NarrowRule::kOneSided)),
              HasSubstr("lsp.d = -3"));
}

}  // namespace
}  // namespace lspo::lsp
