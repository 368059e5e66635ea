// Tests for lsp/fit.h against float64 DENSE references computed here.
#include "lsp/fit.h"

#include "third_party/torch/torch_api.h"

#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "lsp/projector.h"

namespace lspo::lsp {
namespace {

using ::testing::HasSubstr;

SparseProjector Make(int64_t rows, int64_t d, int64_t r, uint64_t seed) {
  absl::StatusOr<SparseProjector> p = SparseProjector::Random(rows, d, r, seed);
  CHECK(p.ok()) << p.status();
  return *std::move(p);
}

// Differentiable dense (rows, d) float64 projector from (index, value).
at::Tensor DenseOf(const at::Tensor& index, const at::Tensor& value, int64_t d) {
  return at::zeros({index.size(0), d}, at::kDouble).scatter(1, index, value.to(at::kDouble));
}

// The dense float64 objective |P P^T G Q Q^T - G|_F / |G|_F + beta (|P|_F + |Q|_F).
at::Tensor DenseObjective(const at::Tensor& g, const at::Tensor& pd, const at::Tensor& qd,
                          double beta) {
  const at::Tensor gd = g.to(at::kDouble);
  const at::Tensor b = pd.mm(pd.t()).mm(gd).mm(qd).mm(qd.t()) - gd;
  return b.norm() / gd.norm() + beta * (pd.norm() + qd.norm());
}

// Low-rank (rank 4) + 5% noise "gradient" (m, n), like a real weight gradient.
at::Tensor LowRankPlusNoise(int64_t m, int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  const at::Tensor u = torch::randn({m, 4}), v = torch::randn({n, 4});
  const at::Tensor low = u.mm(v.t());
  return low + 0.05 * low.norm() / std::sqrt(static_cast<double>(m * n)) * torch::randn({m, n});
}

class FitObjectiveTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { internal::SetForceAtenKernels(GetParam()); }
  void TearDown() override { internal::SetForceAtenKernels(false); }
};

TEST_P(FitObjectiveTest, MatchesDenseFormulaAtInitWithGradients) {
  const int64_t m = 48, n = 40, d = 16, r = 4;
  const double beta = 0.01;
  const SparseProjector P = Make(m, d, r, 1), Q = Make(n, d, r, 2);
  const at::Tensor g = LowRankPlusNoise(m, n, 5);
  const at::Tensor gn = (g.to(at::kDouble) / g.to(at::kDouble).norm());

  at::Tensor pv = P.value.clone().set_requires_grad(true);
  at::Tensor qv = Q.value.clone().set_requires_grad(true);
  internal::FitTerms terms =
      internal::FitObjective(gn, P.index, pv, Q.index, qv, d, d, beta);
  terms.objective.backward();

  at::Tensor pv_ref = P.value.clone().set_requires_grad(true);
  at::Tensor qv_ref = Q.value.clone().set_requires_grad(true);
  at::Tensor want =
      DenseObjective(g, DenseOf(P.index, pv_ref, d), DenseOf(Q.index, qv_ref, d), beta);
  want.backward();
  const double want_v = want.item<double>();
  EXPECT_NEAR(terms.objective.item<double>(), want_v, 1e-9 * want_v);
  const double want_err = DenseObjective(g, P.Dense().to(at::kDouble),
                                         Q.Dense().to(at::kDouble), 0.0).item<double>();
  EXPECT_NEAR(terms.error.item<double>(), want_err, 1e-9 * want_err);
  // Gradients through the trace identity equal the dense ones.
  EXPECT_LT((pv.grad() - pv_ref.grad()).abs().max().item<double>(),
            1e-6 * pv_ref.grad().abs().max().item<double>());
  EXPECT_LT((qv.grad() - qv_ref.grad()).abs().max().item<double>(),
            1e-6 * qv_ref.grad().abs().max().item<double>());

  // fp32 evaluation is close (cancellation costs a few digits).
  internal::FitTerms t32 =
      internal::FitObjective(gn.to(at::kFloat), P.index, P.value, Q.index, Q.value, d, d, beta);
  EXPECT_NEAR(t32.objective.item<double>(), want_v, 1e-3 * want_v);
}

INSTANTIATE_TEST_SUITE_P(Paths, FitObjectiveTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "AtenPath" : "CpuLoops");
                         });

TEST(FitProjectors, LowersTheBiasAndReportsItExactly) {
  const int64_t m = 48, n = 40, d = 16, r = 4;
  SparseProjector P = Make(m, d, r, 11), Q = Make(n, d, r, 12);
  const at::Tensor p_index = P.index.clone(), q_index = Q.index.clone();
  const at::Tensor g = LowRankPlusNoise(m, n, 6);
  FitOptions opt;
  opt.max_iters = 100;
  opt.lr = 0.05;
  absl::StatusOr<FitResult> res = FitProjectors(g, &P, &Q, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  // Every evaluation after the first is an Adam step or the restart of a step-size halving.
  EXPECT_EQ(res->iterations + res->lr_halvings, 100);
  EXPECT_LT(res->final_error, res->initial_error);
  EXPECT_LT(res->final_error, 0.5 * res->initial_error) << "fit barely moved";
  // Positions fixed, values changed, plain fp32 tensors.
  EXPECT_TRUE(at::equal(P.index, p_index));
  EXPECT_TRUE(at::equal(Q.index, q_index));
  EXPECT_EQ(P.value.scalar_type(), at::kFloat);
  EXPECT_FALSE(P.value.requires_grad());
  // Reported error = dense float64 bias of the kept values.
  const double dense = DenseObjective(g, P.Dense().to(at::kDouble), Q.Dense().to(at::kDouble),
                                      0.0).item<double>();
  EXPECT_NEAR(res->final_error, dense, 1e-4);
  EXPECT_NEAR(res->final_error, RelativeBias(g, P, Q), 1e-12);
}

TEST(FitProjectors, SmolLM2ShapeFitImproves) {
  const int64_t m = 576, n = 1536, d = 128, r = 4;
  SparseProjector P = Make(m, d, r, 21), Q = Make(n, d, r, 22);
  const at::Tensor g = LowRankPlusNoise(m, n, 7);
  FitOptions opt;
  opt.max_iters = 20;
  opt.lr = 0.05;
  absl::StatusOr<FitResult> res = FitProjectors(g, &P, &Q, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_LT(res->final_error, res->initial_error);
  EXPECT_NEAR(res->final_error, RelativeBias(g, P, Q), 1e-12);
}

TEST(FitProjectors, ClosedFormRescaleMatchesDenseOptimumAndIsAtMostOne) {
  // With no Adam iterations, the fit is the closed-form common rescale of P and Q:
  // error^2 = 1 - <R, G>^2 / (|R|^2 |G|^2), R = P P^T G Q Q^T (dense float64 reference).
  SparseProjector P = Make(96, 16, 4, 41), Q = Make(80, 16, 4, 42);
  const at::Tensor g = LowRankPlusNoise(96, 80, 10);
  const at::Tensor pd = P.Dense().to(at::kDouble), qd = Q.Dense().to(at::kDouble);
  const at::Tensor gd = g.to(at::kDouble);
  const at::Tensor rec = pd.mm(pd.t()).mm(gd).mm(qd).mm(qd.t());
  const double cos2 = std::pow((rec * gd).sum().item<double>(), 2) /
                      (rec.pow(2).sum().item<double>() * gd.pow(2).sum().item<double>());
  const double want = std::sqrt(1.0 - cos2);
  FitOptions opt;
  opt.max_iters = 0;
  absl::StatusOr<FitResult> res = FitProjectors(g, &P, &Q, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_GT(res->initial_error, 1.0);  // random N(0, 1/r) values overshoot the scale
  EXPECT_NEAR(res->final_error, want, 1e-5);
  EXPECT_LE(res->final_error, 1.0);
}

// A rectangular subspace (d_p != d_q) evaluates the same trace identity as the dense formula.
TEST(FitObjective, RectangularSubspaceMatchesDenseFloat64) {
  const int64_t m = 48, n = 40, d_p = 12, d_q = 20, r = 3;
  const double beta = 0.02;
  const SparseProjector P = Make(m, d_p, r, 71), Q = Make(n, d_q, r, 72);
  const at::Tensor g = LowRankPlusNoise(m, n, 9);
  const at::Tensor gn = g.to(at::kDouble) / g.to(at::kDouble).norm();
  internal::FitTerms terms =
      internal::FitObjective(gn, P.index, P.value, Q.index, Q.value, d_p, d_q, beta);
  const double want = DenseObjective(g, DenseOf(P.index, P.value, d_p),
                                     DenseOf(Q.index, Q.value, d_q), beta)
                          .item<double>();
  EXPECT_NEAR(terms.objective.item<double>(), want, 1e-9 * want);
  // A fixed (identity) side is left out of the regulariser.
  internal::FitTerms fixed_p =
      internal::FitObjective(gn, P.index, P.value, Q.index, Q.value, d_p, d_q, beta, true);
  EXPECT_NEAR(fixed_p.objective.item<double>(),
              want - beta * P.value.to(at::kDouble).norm().item<double>(), 1e-9 * want);
}

// One-sided subspace of a narrow matrix (m = 32 <= d = 48 < n = 64, lsp/subspace.h): P is the
// identity and stays exactly so; only Q is fitted; the bias reported is the dense float64
// |G Q Q^T - G| / |G| of the kept Q.
TEST(FitProjectors, OneSidedFitsOnlyTheLearnedSide) {
  const int64_t m = 32, n = 64, d = 48, r = 4;
  SparseProjector P = *SparseProjector::Identity(m);
  SparseProjector Q = Make(n, d, r, 81);
  const at::Tensor q0 = Q.value.clone();
  const at::Tensor g = LowRankPlusNoise(m, n, 11);
  FitOptions opt;
  opt.max_iters = 60;
  absl::StatusOr<FitResult> res = FitProjectors(g, &P, &Q, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_TRUE(P.identity);
  EXPECT_TRUE(at::equal(P.value, at::ones({m, 1}, at::kFloat)));
  EXPECT_FALSE(at::equal(Q.value, q0));
  EXPECT_LT(res->final_error, 0.5 * res->initial_error);
  const at::Tensor gd = g.to(at::kDouble), qd = Q.Dense().to(at::kDouble);
  const double dense = (gd.mm(qd).mm(qd.t()) - gd).norm().item<double>() / gd.norm().item<double>();
  EXPECT_NEAR(res->final_error, dense, 1e-9);
  // The closed-form rescale of one learned side (lambda^2 instead of lambda^4) lands on the
  // dense optimum of a common scale of Q: error^2 = 1 - <R, G>^2 / (|R|^2 |G|^2), R = G Q Q^T.
  SparseProjector P2 = *SparseProjector::Identity(m), Q2 = Make(n, d, r, 82);
  const at::Tensor q2 = Q2.Dense().to(at::kDouble);
  const at::Tensor rec = gd.mm(q2).mm(q2.t());
  const double cos2 = std::pow((rec * gd).sum().item<double>(), 2) /
                      (rec.pow(2).sum().item<double>() * gd.pow(2).sum().item<double>());
  opt.max_iters = 0;
  res = FitProjectors(g, &P2, &Q2, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_NEAR(res->final_error, std::sqrt(1.0 - cos2), 1e-6);
}

// Identity on both sides (lsp.narrow: full): S = G, no bias, nothing to fit.
TEST(FitProjectors, FullSubspaceHasNoBiasAndNothingToFit) {
  SparseProjector P = *SparseProjector::Identity(12), Q = *SparseProjector::Identity(20);
  const at::Tensor g = LowRankPlusNoise(12, 20, 12);
  absl::StatusOr<FitResult> res = FitProjectors(g, &P, &Q, FitOptions{});
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->iterations, 0);
  EXPECT_LT(res->initial_error, 1e-12);
  EXPECT_LT(res->final_error, 1e-12);
  EXPECT_TRUE(P.identity && Q.identity);
}

TEST(FitProjectors, StopsAtAlphaAndKeepsValues) {
  SparseProjector P = Make(48, 16, 4, 31), Q = Make(40, 16, 4, 32);
  const at::Tensor p0 = P.value.clone();
  const at::Tensor g = LowRankPlusNoise(48, 40, 8);
  const double initial = RelativeBias(g, P, Q);
  FitOptions opt;
  opt.alpha = initial + 0.01;
  absl::StatusOr<FitResult> res = FitProjectors(g, &P, &Q, opt);
  ASSERT_TRUE(res.ok()) << res.status();
  EXPECT_EQ(res->iterations, 0);
  EXPECT_TRUE(at::equal(P.value, p0));
  EXPECT_NEAR(res->final_error, initial, 1e-12);
  EXPECT_NEAR(res->initial_error, initial, 1e-12);
}

TEST(FitProjectors, RegulariserShrinksTheValues) {
  const at::Tensor g = LowRankPlusNoise(48, 40, 9);
  SparseProjector P0 = Make(48, 16, 4, 41), Q0 = Make(40, 16, 4, 42);
  SparseProjector P1 = P0, Q1 = Q0;
  FitOptions opt;
  opt.max_iters = 60;
  ASSERT_TRUE(FitProjectors(g, &P0, &Q0, opt).ok());
  opt.beta = 0.5;
  ASSERT_TRUE(FitProjectors(g, &P1, &Q1, opt).ok());
  EXPECT_LT(P1.value.norm().item<double>() + Q1.value.norm().item<double>(),
            P0.value.norm().item<double>() + Q0.value.norm().item<double>());
}

// r = 16 with a step too large for its ~1/sqrt(r) values (docs/projector_bias.md "r = 16 and the
// learning rate"): without step-size control every Adam iterate is worse than the rescaled
// start and the fit keeps it; with it (FitOptions::patience) the lr halves until Adam makes
// progress. Both runs start from the same draw; the dense float64 bias of the kept values is
// what FitResult reports.
TEST(FitProjectors, HalvesAStepTooLargeForTheValueScale) {
  const int64_t m = 192, n = 160, d = 32, r = 16;
  const at::Tensor g = LowRankPlusNoise(m, n, 13);
  SparseProjector P0 = Make(m, d, r, 91), Q0 = Make(n, d, r, 92);
  SparseProjector P1 = P0, Q1 = Q0;
  P1.value = P0.value.clone();
  Q1.value = Q0.value.clone();
  FitOptions opt;
  opt.max_iters = 40;
  opt.lr = 0.5;
  opt.patience = 0;
  absl::StatusOr<FitResult> fixed = FitProjectors(g, &P0, &Q0, opt);
  ASSERT_TRUE(fixed.ok()) << fixed.status();
  opt.patience = 3;
  absl::StatusOr<FitResult> halved = FitProjectors(g, &P1, &Q1, opt);
  ASSERT_TRUE(halved.ok()) << halved.status();
  EXPECT_EQ(fixed->lr_halvings, 0);
  EXPECT_GE(halved->lr_halvings, 1);
  EXPECT_LE(halved->lr_halvings, opt.max_halvings);
  EXPECT_LT(halved->final_error, 0.7 * fixed->final_error)
      << "fixed lr " << fixed->final_error << ", halved " << halved->final_error;
  const at::Tensor gd = g.to(at::kDouble);
  const at::Tensor pd = P1.Dense().to(at::kDouble), qd = Q1.Dense().to(at::kDouble);
  const double dense = (pd.mm(pd.t()).mm(gd).mm(qd).mm(qd.t()) - gd).norm().item<double>() /
                       gd.norm().item<double>();
  EXPECT_NEAR(halved->final_error, dense, 1e-9);
}

TEST(FitProjectors, RejectsBadInputAndLeavesProjectorsUntouched) {
  SparseProjector P = Make(48, 16, 4, 51), Q = Make(40, 16, 4, 52);
  const at::Tensor p0 = P.value.clone();
  at::Tensor g = LowRankPlusNoise(48, 40, 10);
  FitOptions opt;

  at::Tensor bad = g.clone();
  bad[3][7] = std::nan("");
  bad[5][0] = INFINITY;
  absl::Status st = FitProjectors(bad, &P, &Q, opt).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("2 non-finite"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("flat index 127"));

  st = FitProjectors(at::zeros({48, 40}), &P, &Q, opt).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), HasSubstr("gradient is all zero, nothing to fit"));

  EXPECT_EQ(FitProjectors(g.t(), &P, &Q, opt).status().code(),
            absl::StatusCode::kInvalidArgument);  // (n, m)
  EXPECT_EQ(FitProjectors(g.reshape({-1}), &P, &Q, opt).status().code(),
            absl::StatusCode::kInvalidArgument);  // 1-D
  EXPECT_EQ(FitProjectors(g, nullptr, &Q, opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Q must have n rows (a different d is a valid rectangular subspace, see
  // FitObjective.RectangularSubspaceMatchesDenseFloat64).
  SparseProjector q_other_rows = Make(41, 16, 4, 53);
  EXPECT_EQ(FitProjectors(g, &P, &q_other_rows, opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  FitOptions bad_opt;
  bad_opt.lr = 0;
  EXPECT_EQ(FitProjectors(g, &P, &Q, bad_opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad_opt = FitOptions{};
  bad_opt.max_iters = -1;
  EXPECT_EQ(FitProjectors(g, &P, &Q, bad_opt).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad_opt = FitOptions{};
  bad_opt.patience = -1;
  st = FitProjectors(g, &P, &Q, bad_opt).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("FitOptions.patience = -1"));
  EXPECT_TRUE(at::equal(P.value, p0));
}

TEST(TransferAdamState, MatchesDenseFloat64) {
  const int64_t m = 48, n = 40, d_old = 16, d_new = 12, r = 4;
  const SparseProjector Po = Make(m, d_old, r, 61), Qo = Make(n, d_old, r, 62);
  const SparseProjector Pn = Make(m, d_new, r, 63), Qn = Make(n, d_new, r, 64);
  torch::manual_seed(4);
  const at::Tensor m0 = torch::randn({d_old, d_old});
  const at::Tensor v0 = torch::rand({d_old, d_old});
  at::Tensor M = m0.clone(), V = v0.clone();
  TransferAdamState(Po, Qo, Pn, Qn, M, V);

  const at::Tensor cp = Pn.Dense().to(at::kDouble).t().mm(Po.Dense().to(at::kDouble));  // (d', d)
  const at::Tensor cq = Qo.Dense().to(at::kDouble).t().mm(Qn.Dense().to(at::kDouble));  // (d, d')
  const at::Tensor m_ref = cp.mm(m0.to(at::kDouble)).mm(cq);
  const at::Tensor v_ref = cp.pow(2).mm(v0.to(at::kDouble)).mm(cq.pow(2));
  ASSERT_EQ(M.sizes(), (at::IntArrayRef{d_new, d_new}));
  EXPECT_EQ(M.scalar_type(), at::kFloat);
  EXPECT_LT((M.to(at::kDouble) - m_ref).norm().item<double>() / m_ref.norm().item<double>(),
            1e-5);
  EXPECT_LT((V.to(at::kDouble) - v_ref).norm().item<double>() / v_ref.norm().item<double>(),
            1e-5);
  EXPECT_GE(V.min().item<double>(), 0.0);
}

TEST(TransferAdamState, SameProjectorsOnOrthonormalColumnsKeepState) {
  // P = Q = [I; 0] with r = 1 (P^T P = I): the transfer is the identity.
  absl::StatusOr<SparseProjector> p = SparseProjector::FromTensors(
      at::arange(6).remainder(3).unsqueeze(1), at::cat({at::ones({3, 1}), at::zeros({3, 1})}), 3);
  ASSERT_TRUE(p.ok()) << p.status();
  const at::Tensor m0 = torch::randn({3, 3}), v0 = torch::rand({3, 3});
  at::Tensor M = m0.clone(), V = v0.clone();
  TransferAdamState(*p, *p, *p, *p, M, V);
  EXPECT_TRUE(at::allclose(M, m0));
  EXPECT_TRUE(at::allclose(V, v0));
}

// A refit of a one-sided subspace: P stays the identity (m, m), Q (n, d) is redrawn. The
// moments (m, d) move only on the Q side: M' = M (Q^T Q'), V' = V (Q^T Q')^2.
TEST(TransferAdamState, OneSidedRectangularMatchesDenseFloat64) {
  const int64_t m = 32, n = 64, d = 48, r = 4;
  const SparseProjector I = *SparseProjector::Identity(m);
  const SparseProjector Qo = Make(n, d, r, 91), Qn = Make(n, d, r, 92);
  torch::manual_seed(6);
  const at::Tensor m0 = torch::randn({m, d}), v0 = torch::rand({m, d});
  at::Tensor M = m0.clone(), V = v0.clone();
  TransferAdamState(I, Qo, I, Qn, M, V);
  const at::Tensor cq = Qo.Dense().to(at::kDouble).t().mm(Qn.Dense().to(at::kDouble));  // (d, d)
  const at::Tensor m_ref = m0.to(at::kDouble).mm(cq);
  const at::Tensor v_ref = v0.to(at::kDouble).mm(cq.pow(2));
  ASSERT_EQ(M.sizes(), (at::IntArrayRef{m, d}));
  EXPECT_LT((M.to(at::kDouble) - m_ref).norm().item<double>() / m_ref.norm().item<double>(),
            1e-5);
  EXPECT_LT((V.to(at::kDouble) - v_ref).norm().item<double>() / v_ref.norm().item<double>(),
            1e-5);
  // Identity on both sides (full): the state is kept exactly.
  const SparseProjector In = *SparseProjector::Identity(n);
  at::Tensor M2 = torch::randn({m, n}), V2 = torch::rand({m, n});
  const at::Tensor m2 = M2.clone(), v2 = V2.clone();
  TransferAdamState(I, In, I, In, M2, V2);
  EXPECT_TRUE(at::equal(M2, m2));
  EXPECT_TRUE(at::equal(V2, v2));
}

}  // namespace
}  // namespace lspo::lsp
