// Tests for lsp/projector.h. Every kernel is checked against a float64 DENSE reference computed
// here from Dense() projectors with plain matrix products.
#include "lsp/projector.h"

#include <ATen/CPUGeneratorImpl.h>
#include "third_party/torch/torch_api.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <ostream>
#include <set>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lspo::lsp {
namespace {

using ::testing::HasSubstr;

SparseProjector MakeProjector(int64_t rows, int64_t d, int64_t r, uint64_t seed) {
  absl::StatusOr<SparseProjector> p = SparseProjector::Random(rows, d, r, seed);
  CHECK(p.ok()) << p.status();
  return *std::move(p);
}

at::Tensor DenseF64(const SparseProjector& p) { return p.Dense().to(at::kDouble); }

// |a - b|_F / |b|_F in float64.
double RelErr(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor bd = b.to(at::kDouble);
  return (a.to(at::kDouble) - bd).norm().item<double>() / bd.norm().item<double>();
}

// ---------------------------------------------------------------------------------------------
// Random()

TEST(SparseProjectorRandom, ShapesDtypesAndDistinctSortedPositions) {
  const SparseProjector p = MakeProjector(300, 16, 4, 1);
  EXPECT_EQ(p.rows, 300);
  EXPECT_EQ(p.d, 16);
  EXPECT_EQ(p.r, 4);
  ASSERT_EQ(p.index.sizes(), (at::IntArrayRef{300, 4}));
  ASSERT_EQ(p.value.sizes(), (at::IntArrayRef{300, 4}));
  EXPECT_EQ(p.index.scalar_type(), at::kLong);
  EXPECT_EQ(p.value.scalar_type(), at::kFloat);
  auto idx = p.index.accessor<int64_t, 2>();
  for (int64_t i = 0; i < 300; ++i) {
    std::set<int64_t> cols;
    for (int64_t j = 0; j < 4; ++j) {
      EXPECT_GE(idx[i][j], 0);
      EXPECT_LT(idx[i][j], 16);
      if (j > 0) EXPECT_LT(idx[i][j - 1], idx[i][j]) << "row " << i;
      cols.insert(idx[i][j]);
    }
    EXPECT_EQ(cols.size(), 4u) << "row " << i << " has a repeated column";
  }
  EXPECT_TRUE(p.Validate().ok());
  // r == d is allowed: every column used once per row.
  const SparseProjector full = MakeProjector(10, 5, 5, 2);
  EXPECT_TRUE(
      at::equal(std::get<0>(full.index.sort(1)), at::arange(5).repeat({10, 1})));
}

TEST(SparseProjectorRandom, ValueStdAndColumnUsageAreUniform) {
  const int64_t rows = 20000, d = 64, r = 8;
  const SparseProjector p = MakeProjector(rows, d, r, 7);
  const at::Tensor v = p.value.to(at::kDouble);
  EXPECT_NEAR(v.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(v.std().item<double>(), 1.0 / std::sqrt(static_cast<double>(r)), 0.01);
  const at::Tensor counts = at::bincount(p.index.reshape({-1}), {}, d).to(at::kDouble);
  const double expected = static_cast<double>(rows * r) / d;  // 2500
  EXPECT_LT((counts - expected).abs().max().item<double>(), 0.1 * expected);
}

TEST(SparseProjectorRandom, ExpectationOfPPtIsIdentity) {
  // E[P P^T] = I over draws (docs/method.md): average P P^T over 3000 seeds.
  const int64_t rows = 8, d = 16, r = 4;
  at::Tensor sum = at::zeros({rows, rows}, at::kDouble);
  const int kDraws = 3000;
  for (int s = 0; s < kDraws; ++s) {
    const at::Tensor pd = DenseF64(MakeProjector(rows, d, r, 1000 + s));
    sum += pd.mm(pd.t());
  }
  const at::Tensor mean = sum / kDraws;
  EXPECT_LT((mean - at::eye(rows, at::kDouble)).abs().max().item<double>(), 0.06);
  // And within one large projector, the diagonal of P P^T averages 1.
  const at::Tensor big = MakeProjector(5000, 32, 4, 3).value.to(at::kDouble);
  EXPECT_NEAR(big.pow(2).sum(1).mean().item<double>(), 1.0, 0.03);
}

TEST(SparseProjectorRandom, DeterministicPerSeed) {
  const SparseProjector a = MakeProjector(50, 32, 4, 42);
  const SparseProjector b = MakeProjector(50, 32, 4, 42);
  const SparseProjector c = MakeProjector(50, 32, 4, 43);
  EXPECT_TRUE(at::equal(a.index, b.index));
  EXPECT_TRUE(at::equal(a.value, b.value));
  EXPECT_FALSE(at::equal(a.index, c.index));
}

TEST(SparseProjectorRandom, RejectsBadSizes) {
  auto code = [](int64_t rows, int64_t d, int64_t r) {
    return SparseProjector::Random(rows, d, r, 0).status().code();
  };
  EXPECT_EQ(code(10, 4, 5), absl::StatusCode::kInvalidArgument);  // r > d
  EXPECT_EQ(code(10, 0, 1), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(10, 4, 0), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(0, 4, 2), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(SparseProjector::Random(10, 4, 5, 0).status().message()),
              HasSubstr("choose r <= d"));
}

TEST(SparseProjector, FromTensorsValidatesInvariants) {
  const SparseProjector p = MakeProjector(6, 8, 3, 5);
  absl::StatusOr<SparseProjector> ok = SparseProjector::FromTensors(p.index, p.value, 8);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(at::equal(ok->Dense(), p.Dense()));

  at::Tensor dup = p.index.clone();
  dup[2][1] = dup[2][0];
  absl::Status st = SparseProjector::FromTensors(dup, p.value, 8).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("row 2"));

  EXPECT_EQ(SparseProjector::FromTensors(p.index, p.value, 4).status().code(),
            absl::StatusCode::kInvalidArgument);  // indices >= d
  at::Tensor nan_value = p.value.clone();
  nan_value[0][0] = std::nan("");
  EXPECT_EQ(SparseProjector::FromTensors(p.index, nan_value, 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SparseProjector::FromTensors(p.index, p.value.slice(0, 0, 5), 8).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SparseProjector::FromTensors(p.value, p.value, 8).status().code(),
            absl::StatusCode::kInvalidArgument);  // float index
  EXPECT_EQ(SparseProjector{}.Validate().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// The identity side of a one-sided or full subspace (lsp/subspace.h)

TEST(SparseProjectorIdentity, IsExactAndRecognisedWhenReadBack) {
  absl::StatusOr<SparseProjector> id = SparseProjector::Identity(5);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(id->identity);
  EXPECT_EQ(id->rows, 5);
  EXPECT_EQ(id->d, 5);
  EXPECT_EQ(id->r, 1);
  EXPECT_TRUE(at::equal(id->Dense(), at::eye(5, at::kFloat)));
  EXPECT_TRUE(id->Validate().ok());
  // Read back from tensors (the arena, a checkpoint): recognised as the identity.
  absl::StatusOr<SparseProjector> back = SparseProjector::FromTensors(id->index, id->value, 5);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->identity);
  // A permutation or a scaled diagonal is a valid (5, 1)-sparse projector but no identity.
  at::Tensor perm = id->index.flip(0).contiguous();
  absl::StatusOr<SparseProjector> p = SparseProjector::FromTensors(perm, id->value, 5);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->identity);
  p = SparseProjector::FromTensors(id->index, id->value * 2, 5);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->identity);
  EXPECT_FALSE(MakeProjector(5, 4, 1, 3).identity);
  EXPECT_EQ(SparseProjector::Identity(0).status().code(), absl::StatusCode::kInvalidArgument);
  // ForSide draws the identity or a random projector.
  absl::StatusOr<SparseProjector> side = SparseProjector::ForSide(7, 7, 1, true, 1);
  ASSERT_TRUE(side.ok());
  EXPECT_TRUE(side->identity);
  side = SparseProjector::ForSide(7, 4, 2, false, 1);
  ASSERT_TRUE(side.ok());
  EXPECT_FALSE(side->identity);
  EXPECT_TRUE(at::equal(side->index, MakeProjector(7, 4, 2, 1).index));
}

// A one-sided subspace: P the identity (m, m), Q (n, d) sparse. Every kernel equals its dense
// float64 formula with S (m, d) rectangular.
TEST(SparseProjectorIdentity, OneSidedKernelsMatchDenseFloat64) {
  const int64_t m = 32, n = 64, d = 48, r = 4, N = 9;
  const SparseProjector P = *SparseProjector::Identity(m);
  const SparseProjector Q = MakeProjector(n, d, r, 21);
  torch::manual_seed(5);
  const at::Tensor G = torch::randn({m, n});             // (m, n)
  const at::Tensor X = torch::randn({N, n});             // (N, n)
  const at::Tensor dY = torch::randn({N, m});            // (N, m)
  const at::Tensor q = DenseF64(Q);                      // (n, d)
  const at::Tensor S_ref = G.to(at::kDouble).mm(q);      // (m, d) = I^T G Q
  const at::Tensor S = CompressDense(G, P, Q);
  ASSERT_EQ(S.sizes(), (at::IntArrayRef{m, d}));
  EXPECT_LT(RelErr(S, S_ref), 1e-6);
  const at::Tensor XQ = ProjectRows(X, Q);               // (N, d)
  const at::Tensor Sf = CompressFactored(dY, XQ, P);     // (m, d) = dY^T X Q
  const at::Tensor Sf_ref = dY.to(at::kDouble).t().mm(X.to(at::kDouble)).mm(q);
  ASSERT_EQ(Sf.sizes(), (at::IntArrayRef{m, d}));
  EXPECT_LT(RelErr(Sf, Sf_ref), 1e-6);
  const at::Tensor D = torch::randn({m, d});             // (m, d)
  at::Tensor W = torch::randn({m, n});
  const at::Tensor W_ref = W.to(at::kDouble) + D.to(at::kDouble).mm(q.t());
  ApplyStep(W, P, D, Q);
  EXPECT_LT(RelErr(W, W_ref), 1e-6);
  // Bias |G Q Q^T - G| / |G|; zero when Q is the identity too (a full subspace).
  const at::Tensor g = G.to(at::kDouble);
  const double bias_ref = (g.mm(q).mm(q.t()) - g).norm().item<double>() / g.norm().item<double>();
  EXPECT_NEAR(RelativeBias(G, P, Q), bias_ref, 1e-9 * bias_ref);
  EXPECT_LT(RelativeBias(G, P, *SparseProjector::Identity(n)), 1e-12);
}

// GaLore-Offload's projectors (gpu_worker/galore_offload_path.cc): one side the identity, the
// other a dense (rows, k) matrix. FromDense keeps the matrix as the values (no index memory:
// a stride-0 view), FromTensors recognises a dense projector read back, and ExpandStep,
// ApplyStep and ApplyStepCompensated (BLAS path) equal the float64 products on both sides.
TEST(SparseProjectorDense, GaloreSidesMatchDenseFloat64) {
  const int64_t m = 40, n = 24, k = 6;
  torch::manual_seed(12);
  const at::Tensor B = torch::randn({n, k});  // Q = B (n, k): right side, S = G B (m, k)
  const at::Tensor A = torch::randn({m, k});  // P = A (m, k): left side, S = A^T G (k, n)
  absl::StatusOr<SparseProjector> q = SparseProjector::FromDense(B);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(q->dense);
  EXPECT_FALSE(q->identity);
  EXPECT_EQ(q->r, k);
  EXPECT_EQ(q->index.stride(0), 0) << "the index of a dense projector is a view of one row";
  EXPECT_TRUE(at::equal(q->Dense(), B));
  EXPECT_TRUE(q->Validate().ok());
  // Read back from tensors (the arena, a checkpoint): still dense; a permuted row is not.
  absl::StatusOr<SparseProjector> back =
      SparseProjector::FromTensors(q->index.contiguous(), q->value, k);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->dense);
  at::Tensor perm = q->index.contiguous().clone();
  perm[0] = perm[0].flip(0);
  back = SparseProjector::FromTensors(perm, q->value, k);
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->dense);
  EXPECT_FALSE(SparseProjector::FromDense(torch::randn({3})).ok());
  EXPECT_FALSE(SparseProjector::FromDense(torch::full({2, 2}, NAN)).ok());

  const SparseProjector Im = *SparseProjector::Identity(m), In = *SparseProjector::Identity(n);
  const SparseProjector P = *SparseProjector::FromDense(A);
  const at::Tensor b = B.to(at::kDouble), a = A.to(at::kDouble);
  const at::Tensor Dr = torch::randn({m, k}), Dl = torch::randn({k, n});
  const at::Tensor right_ref = Dr.to(at::kDouble).mm(b.t());  // (m, n) = I D B^T
  const at::Tensor left_ref = a.mm(Dl.to(at::kDouble));       // (m, n) = A D I
  EXPECT_LT(RelErr(ExpandStep(Im, Dr, *q), right_ref), 1e-6);
  EXPECT_LT(RelErr(ExpandStep(P, Dl, In), left_ref), 1e-6);
  // Both sides dense: A D B^T.
  const at::Tensor D2 = torch::randn({k, k});
  EXPECT_LT(RelErr(ExpandStep(P, D2, *q), a.mm(D2.to(at::kDouble)).mm(b.t())), 1e-6);
  at::Tensor W = torch::randn({m, n});
  const at::Tensor W_ref = W.to(at::kDouble) + right_ref;
  ApplyStep(W, Im, Dr, *q);
  EXPECT_LT(RelErr(W, W_ref), 1e-6);
  // 16-bit weights: one rounding of W + P D Q^T (at most one ulp from the float64 sum: the fp32
  // sum rounds first), and the compensated form keeps what the rounding dropped.
  at::Tensor Wb = torch::randn({m, n}).to(at::kBFloat16);
  const at::Tensor Wb_exact = Wb.to(at::kDouble) + left_ref;
  at::Tensor Wb2 = Wb.clone();
  ApplyStep(Wb, P, Dl, In);
  EXPECT_LE(MaxDriftUlps(Wb, Wb_exact), 1.0);
  at::Tensor C = at::zeros_like(Wb2);
  const at::Tensor exact = Wb2.to(at::kDouble) * 0.5 + left_ref;
  ApplyStepCompensated(Wb2, C, P, Dl, In, 0.5);
  // W + C holds the sum to the rounding of C into bf16 (2^-9 of C, itself within half a bf16
  // ulp of W: ~2^-18 relative); W alone is off by up to half a bf16 ulp (2^-9).
  EXPECT_LT(RelErr(Wb2.to(at::kDouble) + C.to(at::kDouble), exact), 1e-5);
  EXPECT_GT(RelErr(Wb2.to(at::kDouble), exact), 1e-4);
}

// ---------------------------------------------------------------------------------------------
// Compensated apply into bf16 weights

// 200 steps whose updates are ~1/20 of a bf16 ulp of the weights, with decoupled decay on half
// of them: after every step the compensated bf16 W is within one ulp of round(master) (master
// in float64), and W + C tracks the master to a small fraction of a ulp. Round-to-nearest
// (ApplyStep on bf16 W, control) loses the updates and ends many ulps away.
TEST(ApplyStepCompensated, StaysWithinOneUlpOfTheMasterAtEveryStep) {
  const int64_t m = 24, n = 40, d = 8, r = 2;
  const SparseProjector P = MakeProjector(m, d, r, 31), Q = MakeProjector(n, d, r, 32);
  torch::manual_seed(8);
  at::Tensor master = (torch::randn({m, n}) * 0.05).to(at::kDouble);  // (m, n) fp64
  at::Tensor W = at::empty({m, n}, at::kBFloat16);
  at::Tensor C = RoundWithResidual(W, master.to(at::kFloat));
  at::Tensor near = W.clone();
  EXPECT_EQ(MaxDriftUlps(W, master), 0.0);
  double worst = 0;
  for (int t = 1; t <= 200; ++t) {
    const at::Tensor D = torch::randn({d, d}) * 1e-6;  // P D Q^T ~ 1e-5 per element
    const double decay = (t % 2 == 0) ? 1.0 - 1e-4 : 1.0;
    master = master * decay +
             DenseF64(P).mm(D.to(at::kDouble)).mm(DenseF64(Q).t());
    ApplyStepCompensated(W, C, P, D, Q, decay);
    near.mul_(decay);
    ApplyStep(near, P, D, Q);
    const double ulps = MaxDriftUlps(W, master);
    worst = std::max(worst, ulps);
    ASSERT_LE(ulps, 1.0) << "step " << t;
  }
  // W + C tracks the master up to the rounding of C into bf16, at most 2^-9 of |C| <= half a
  // ulp per step: 200 steps stay below 200 / 1024 ~ 0.2 ulp of each element.
  const at::Tensor rm = master.to(at::kBFloat16).to(at::kDouble).abs().clamp_min(1e-30);
  const at::Tensor ulp = at::pow(2.0, (std::get<1>(at::frexp(rm)) - 8).to(at::kDouble));
  const double tracked_ulps =
      ((W.to(at::kDouble) + C.to(at::kDouble) - master).abs() / ulp).max().item<double>();
  const double near_ulps = MaxDriftUlps(near, master);
  std::printf("compensated: worst %.3g ulp over 200 steps, |W + C - master| %.3g ulp; nearest: "
              "%.3g ulp after 200 steps\n",
              worst, tracked_ulps, near_ulps);
  EXPECT_LT(tracked_ulps, 200.0 / 1024);
  EXPECT_GT(near_ulps, 2.0);
}

// The same 200 steps with stochastic rounding (no residual): unbiased, so the decay that round-
// to-nearest loses (each step's 1e-4 of W is far below half a ulp) shows up in expectation. The
// systematic part of the drift, mean over elements of sign(master) (W - master) in ulps, is
// near 0 (nearest: ~+2.5 ulps, the decay never applied); the price is a random walk of the
// individual weights (printed: several ulps after 200 steps).
TEST(ApplyStepFused, StochasticRoundingKeepsTheDecayInExpectation) {
  const int64_t m = 48, n = 80, d = 8, r = 2;
  const SparseProjector P = MakeProjector(m, d, r, 31), Q = MakeProjector(n, d, r, 32);
  torch::manual_seed(8);
  at::Tensor master = (torch::randn({m, n}) * 0.05).to(at::kDouble);  // (m, n) fp64
  at::Tensor sr = master.to(at::kBFloat16);
  at::Tensor near = sr.clone();
  double worst = 0;
  for (int t = 1; t <= 200; ++t) {
    const at::Tensor D = torch::randn({d, d}) * 1e-6;  // P D Q^T ~ 1e-5 per element
    const double decay = (t % 2 == 0) ? 1.0 - 1e-4 : 1.0;
    master = master * decay + DenseF64(P).mm(D.to(at::kDouble)).mm(DenseF64(Q).t());
    ApplyStepFused(sr, nullptr, P, D, Q, decay, Rounding::kStochastic, 1000 + t);
    ApplyStepFused(near, nullptr, P, D, Q, decay, Rounding::kNearest, 0);
    worst = std::max(worst, MaxDriftUlps(sr, master));
  }
  const at::Tensor rm = master.to(at::kBFloat16).to(at::kDouble).abs().clamp_min(1e-30);
  const at::Tensor ulp = at::pow(2.0, (std::get<1>(at::frexp(rm)) - 8).to(at::kDouble));
  auto bias = [&](const at::Tensor& w) {
    return (master.sign() * (w.to(at::kDouble) - master) / ulp).mean().item<double>();
  };
  const double sr_bias = bias(sr), near_bias = bias(near);
  std::printf("stochastic: systematic drift %+.3f ulp, worst %.3g ulp over 200 steps; nearest: "
              "systematic %+.3f ulp, final %.3g ulp\n",
              sr_bias, worst, near_bias, MaxDriftUlps(near, master));
  EXPECT_LT(std::fabs(sr_bias), 0.5);
  EXPECT_GT(near_bias, 1.5);
}

TEST(MaxDriftUlps, CountsRepresentableSteps) {
  const at::Tensor m = at::tensor({1.0, 0.75, -2.0, 0.0}, at::kFloat);
  at::Tensor w = m.to(at::kBFloat16);
  EXPECT_EQ(MaxDriftUlps(w, m), 0.0);
  // bf16 ulp of 1.0 is 2^-7, of 2.0 is 2^-6.
  w = at::tensor({1.0 + 2.0 / 128, 0.75, -2.0 - 1.0 / 64, 0.0}, at::kFloat).to(at::kBFloat16);
  EXPECT_EQ(MaxDriftUlps(w, m), 2.0);
  EXPECT_EQ(MaxDriftUlps(m, m), 0.0);  // fp32 against itself
  // An element far below the matrix's RMS counts with the RMS's ulp: 2e-6 off on a weight of
  // 1e-6 next to weights of 1 is a small fraction of a ulp, not thousands.
  const at::Tensor m2 = at::tensor({1.0, -1.0, 1e-6}, at::kFloat);
  const at::Tensor w2 = at::tensor({1.0, -1.0, 3e-6}, at::kFloat).to(at::kBFloat16);
  EXPECT_LT(MaxDriftUlps(w2, m2), 1e-3);
}

// ---------------------------------------------------------------------------------------------
// Kernels vs dense float64

struct Shape {
  int64_t N, m, n, d, r;
};
void PrintTo(const Shape& s, std::ostream* os) {
  *os << "N=" << s.N << " m=" << s.m << " n=" << s.n << " d=" << s.d << " r=" << s.r;
}
const Shape kSmall{64, 48, 40, 16, 4};
const Shape kSmolLM2{256, 576, 1536, 128, 4};  // down_proj (576 x 1536)

// Parameter: (shape, force the generic ATen path instead of the CPU loops).
class KernelTest : public ::testing::TestWithParam<std::tuple<Shape, bool>> {
 protected:
  static Shape S() { return std::get<0>(GetParam()); }
  void SetUp() override {
    const Shape s = S();
    internal::SetForceAtenKernels(std::get<1>(GetParam()));
    torch::manual_seed(17);
    P_ = MakeProjector(s.m, s.d, s.r, 101);
    Q_ = MakeProjector(s.n, s.d, s.r, 202);
    X_ = torch::randn({s.N, s.n});   // (N, n) fp32
    dY_ = torch::randn({s.N, s.m});  // (N, m) fp32
  }
  void TearDown() override { internal::SetForceAtenKernels(false); }
  SparseProjector P_, Q_;
  at::Tensor X_, dY_;
};

TEST_P(KernelTest, ProjectRowsMatchesDense) {
  const at::Tensor want = X_.to(at::kDouble).mm(DenseF64(Q_));  // (N, d)
  const at::Tensor got = ProjectRows(X_, Q_);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_LT(RelErr(got, want), 1e-5);
  const at::Tensor got64 = ProjectRows(X_.to(at::kDouble), Q_);
  EXPECT_EQ(got64.scalar_type(), at::kDouble);
  EXPECT_LT(RelErr(got64, want), 1e-12);
  const at::Tensor got_bf16 = ProjectRows(X_.to(at::kBFloat16), Q_);
  EXPECT_EQ(got_bf16.scalar_type(), at::kBFloat16);
  EXPECT_LT(RelErr(got_bf16, want), 2e-2);
}

TEST_P(KernelTest, CompressFactoredMatchesDenseGradient) {
  const at::Tensor g = dY_.to(at::kDouble).t().mm(X_.to(at::kDouble));   // (m, n) = dY^T X
  const at::Tensor want = DenseF64(P_).t().mm(g).mm(DenseF64(Q_));       // (d, d)
  const at::Tensor xq = ProjectRows(X_, Q_);                             // (N, d)
  const at::Tensor got = CompressFactored(dY_, xq, P_);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_LT(RelErr(got, want), 1e-5);
  // bf16 activations (as on the GPU): dY is projected in fp32.
  const at::Tensor got_bf16 = CompressFactored(dY_.to(at::kBFloat16), xq, P_);
  EXPECT_EQ(got_bf16.scalar_type(), at::kFloat);
  EXPECT_LT(RelErr(got_bf16, want), 1e-2);
}

TEST_P(KernelTest, ProjectRowsTransposedSharesOnePassAndMatchesDense) {
  // Q and a second projector of the same input (as q|k|v share X): each output is (X Q)^T,
  // equal to its own call bit for bit, and the backward's S from the transposed layout equals
  // the dense P^T dY^T X Q.
  const SparseProjector Q2 = MakeProjector(S().n, std::max<int64_t>(1, S().d / 2),
                                           std::min<int64_t>(S().r, std::max<int64_t>(1, S().d / 2)),
                                           303);
  const std::vector<at::Tensor> both = ProjectRowsTransposed(X_, {&Q_, &Q2});
  ASSERT_EQ(both.size(), 2u);
  const at::Tensor x64 = X_.to(at::kDouble);
  for (int k = 0; k < 2; ++k) {
    const SparseProjector& q = k == 0 ? Q_ : Q2;
    const at::Tensor want = x64.mm(DenseF64(q)).t();  // (d, N)
    ASSERT_EQ(both[k].sizes(), want.sizes());
    EXPECT_TRUE(both[k].is_contiguous());
    EXPECT_EQ(both[k].scalar_type(), at::kFloat);
    EXPECT_LT(RelErr(both[k], want), 1e-5);
    EXPECT_TRUE(at::equal(both[k], ProjectRowsTransposed(X_, {&q})[0])) << k;
  }
  const at::Tensor g = dY_.to(at::kDouble).t().mm(x64);                   // (m, n)
  const at::Tensor want_s = DenseF64(P_).t().mm(g).mm(DenseF64(Q_));      // (d, d)
  EXPECT_LT(RelErr(CompressFactored(dY_, both[0].t(), P_), want_s), 1e-5);
  // fp64 input stays fp64; 16-bit input is read exactly and accumulated in fp32.
  const at::Tensor t64 = ProjectRowsTransposed(x64, {&Q_})[0];
  EXPECT_EQ(t64.scalar_type(), at::kDouble);
  EXPECT_LT(RelErr(t64, x64.mm(DenseF64(Q_)).t()), 1e-12);
  const at::Tensor xh = X_.to(at::kHalf);
  const at::Tensor th = ProjectRowsTransposed(xh, {&Q_})[0];
  EXPECT_EQ(th.scalar_type(), at::kFloat);
  EXPECT_LT(RelErr(th, xh.to(at::kDouble).mm(DenseF64(Q_)).t()), 1e-5);
}

TEST_P(KernelTest, CompressDenseMatchesDense) {
  const at::Tensor g = torch::randn({S().m, S().n});  // (m, n)
  const at::Tensor want = DenseF64(P_).t().mm(g.to(at::kDouble)).mm(DenseF64(Q_));
  const at::Tensor got = CompressDense(g, P_, Q_);
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_LT(RelErr(got, want), 1e-5);
  EXPECT_LT(RelErr(CompressDense(g.to(at::kDouble), P_, Q_), want), 1e-12);
}

TEST_P(KernelTest, ExpandAndApplyStepMatchDense) {
  const Shape s = S();
  const at::Tensor D = torch::randn({s.d, s.d});  // (d, d)
  const at::Tensor step = DenseF64(P_).mm(D.to(at::kDouble)).mm(DenseF64(Q_).t());  // (m, n)
  const at::Tensor got = ExpandStep(P_, D, Q_);
  ASSERT_EQ(got.sizes(), step.sizes());
  EXPECT_EQ(got.scalar_type(), at::kFloat);
  EXPECT_LT(RelErr(got, step), 1e-5);

  const at::Tensor w0 = torch::randn({s.m, s.n});
  at::Tensor w = w0.clone();
  ApplyStep(w, P_, D, Q_);
  EXPECT_EQ(w.scalar_type(), at::kFloat);
  EXPECT_LT(RelErr(w, w0.to(at::kDouble) + step), 1e-6);

  at::Tensor w64 = w0.to(at::kDouble);
  ApplyStep(w64, P_, D.to(at::kDouble), Q_);
  EXPECT_LT(RelErr(w64, w0.to(at::kDouble) + step), 1e-12);

  // bf16 weights: exactly one rounding of (fp32 W + fp32 step).
  at::Tensor wb = w0.to(at::kBFloat16);
  const at::Tensor want_b = (wb.to(at::kFloat) + got).to(at::kBFloat16);
  ApplyStep(wb, P_, D, Q_);
  EXPECT_EQ(wb.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(wb, want_b));
}

// ApplyStepFused: the decay is the same as decaying W first (fp32, bit for bit), and each
// rounding of 16-bit W agrees between the fused CPU kernel and the ATen path (the same noise;
// an element may differ only where the two paths' fp32 sums differ in the last bit).
TEST_P(KernelTest, FusedApplyAgreesWithTheUnfusedUpdate) {
  const Shape s = S();
  const at::Tensor D = torch::randn({s.d, s.d}) * 1e-3;  // (d, d)
  const at::Tensor w0 = torch::randn({s.m, s.n}) * 0.02;
  at::Tensor fused = w0.clone();
  ApplyStepFused(fused, nullptr, P_, D, Q_, 0.99, Rounding::kNearest, 0);
  at::Tensor unfused = w0.clone();
  unfused.mul_(0.99);
  ApplyStep(unfused, P_, D, Q_);
  EXPECT_TRUE(at::equal(fused, unfused));

  const bool aten = std::get<1>(GetParam());
  for (at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    for (Rounding rd : {Rounding::kNearest, Rounding::kCompensated, Rounding::kStochastic}) {
      SCOPED_TRACE(testing::Message() << dt << " rounding " << static_cast<int>(rd));
      auto run = [&](bool force_aten) {
        internal::SetForceAtenKernels(force_aten);
        at::Tensor w = w0.to(dt);
        at::Tensor c = (w0 - w.to(at::kFloat)).to(dt);
        ApplyStepFused(w, rd == Rounding::kCompensated ? &c : nullptr, P_, D, Q_, 0.999, rd, 5);
        internal::SetForceAtenKernels(aten);
        return std::make_pair(w, c);
      };
      const auto [w_loop, c_loop] = run(false);
      const auto [w_aten, c_aten] = run(true);
      const int64_t differ = w_loop.ne(w_aten).sum().item<int64_t>();
      EXPECT_LE(differ, w0.numel() / 1000) << "elements that differ of " << w0.numel();
      // Wherever they differ, by one ulp at most.
      const at::Tensor gap = (w_loop.to(at::kDouble) - w_aten.to(at::kDouble)).abs();
      const double ulp = dt == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
      EXPECT_TRUE(gap.le(w_aten.to(at::kDouble).abs() * 2 * ulp + 1e-7).all().item<bool>());
      if (rd == Rounding::kCompensated) {
        // W + C of both paths: the same sum to C's rounding.
        EXPECT_LT(RelErr(w_loop.to(at::kFloat) + c_loop.to(at::kFloat),
                         w_aten.to(at::kDouble) + c_aten.to(at::kDouble)),
                  1e-6);
      }
    }
  }
}

TEST_P(KernelTest, RelativeBiasMatchesDenseFormula) {
  const Shape s = S();
  const at::Tensor g = torch::randn({s.m, s.n});
  const at::Tensor pd = DenseF64(P_), qd = DenseF64(Q_);
  const at::Tensor gd = g.to(at::kDouble);
  const double want = (pd.mm(pd.t()).mm(gd).mm(qd).mm(qd.t()) - gd).norm().item<double>() /
                      gd.norm().item<double>();
  EXPECT_NEAR(RelativeBias(g, P_, Q_), want, 1e-9 * want);
}

TEST_P(KernelTest, ProjectRowsGradientsMatchDense) {
  // With grad mode on and a leaf requiring grad, ProjectRows is differentiable in X and values.
  const at::Tensor x = X_.to(at::kDouble).set_requires_grad(true);
  SparseProjector q = Q_;
  q.value = Q_.value.clone().set_requires_grad(true);
  const at::Tensor w = torch::randn({S().N, S().d}, at::kDouble);  // (N, d) upstream gradient
  (ProjectRows(x, q) * w).sum().backward();
  const at::Tensor x_ref = X_.to(at::kDouble).set_requires_grad(true);
  const at::Tensor v_ref = Q_.value.to(at::kDouble).set_requires_grad(true);
  const at::Tensor q_ref = at::zeros({S().n, S().d}, at::kDouble).scatter(1, Q_.index, v_ref);
  (x_ref.mm(q_ref) * w).sum().backward();
  EXPECT_LT(RelErr(x.grad(), x_ref.grad()), 1e-12);
  EXPECT_LT(RelErr(q.value.grad(), v_ref.grad()), 1e-6);  // an fp32 leaf gets an fp32 grad
}

TEST_P(KernelTest, GatherRowsGradientsMatchDense) {
  const at::Tensor e = torch::randn({S().d, 33}, at::kDouble).set_requires_grad(true);
  const at::Tensor v = P_.value.to(at::kDouble).set_requires_grad(true);
  const at::Tensor w = torch::randn({S().m, 33}, at::kDouble);
  (internal::GatherRows(e, P_.index, v) * w).sum().backward();
  const at::Tensor e_ref = e.detach().clone().set_requires_grad(true);
  const at::Tensor v_ref = P_.value.to(at::kDouble).set_requires_grad(true);
  const at::Tensor p_ref = at::zeros({S().m, S().d}, at::kDouble).scatter(1, P_.index, v_ref);
  (p_ref.mm(e_ref) * w).sum().backward();
  EXPECT_LT(RelErr(e.grad(), e_ref.grad()), 1e-12);
  EXPECT_LT(RelErr(v.grad(), v_ref.grad()), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, KernelTest,
    ::testing::Combine(::testing::Values(kSmall, kSmolLM2), ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<Shape, bool>>& info) {
      return std::string(std::get<0>(info.param).m == 48 ? "Small" : "SmolLM2_576x1536") +
             (std::get<1>(info.param) ? "_AtenPath" : "_CpuLoops");
    });

TEST(Kernels, CpuLoopsAndAtenPathAgree) {
  const SparseProjector P = MakeProjector(576, 128, 4, 31), Q = MakeProjector(1536, 128, 4, 32);
  torch::manual_seed(8);
  const at::Tensor x = torch::randn({100, 1536}), dy = torch::randn({100, 576});
  const at::Tensor g = torch::randn({576, 1536}), D = torch::randn({128, 128});
  auto run = [&](bool aten) {
    internal::SetForceAtenKernels(aten);
    const at::Tensor xq = ProjectRows(x, Q);
    std::vector<at::Tensor> out = {xq, CompressFactored(dy, xq, P), CompressDense(g, P, Q),
                                   ExpandStep(P, D, Q)};
    internal::SetForceAtenKernels(false);
    return out;
  };
  const std::vector<at::Tensor> a = run(false), b = run(true);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LT(RelErr(a[i], b[i]), 1e-6) << "output " << i;
}

TEST(RelativeBias, ManyRowBlocksMatchDense) {
  // 4100 x 1024: three fp64 row blocks of 2048, 2048, 4 rows.
  const int64_t m = 4100, n = 1024, d = 64, r = 4;
  const SparseProjector P = MakeProjector(m, d, r, 9), Q = MakeProjector(n, d, r, 10);
  torch::manual_seed(3);
  const at::Tensor g = torch::randn({m, n});
  const at::Tensor pd = DenseF64(P), qd = DenseF64(Q), gd = g.to(at::kDouble);
  const at::Tensor s = pd.t().mm(gd).mm(qd);
  const double want = (pd.mm(s).mm(qd.t()) - gd).norm().item<double>() / gd.norm().item<double>();
  EXPECT_NEAR(RelativeBias(g, P, Q), want, 1e-9 * want);
}

TEST(RelativeBias, ZeroGradientHasZeroBiasAndExactFitHasNone) {
  const SparseProjector P = MakeProjector(12, 4, 2, 1), Q = MakeProjector(10, 4, 2, 2);
  EXPECT_EQ(RelativeBias(at::zeros({12, 10}), P, Q), 0.0);
  // Identity-like projectors on a G supported on their span: P = Q = [I; 0] (r = 1).
  absl::StatusOr<SparseProjector> pi = SparseProjector::FromTensors(
      at::arange(12).remainder(4).unsqueeze(1),
      at::cat({at::ones({4, 1}), at::zeros({8, 1})}), 4);
  ASSERT_TRUE(pi.ok()) << pi.status();
  absl::StatusOr<SparseProjector> qi = SparseProjector::FromTensors(
      at::arange(10).remainder(4).unsqueeze(1),
      at::cat({at::ones({4, 1}), at::zeros({6, 1})}), 4);
  ASSERT_TRUE(qi.ok()) << qi.status();
  at::Tensor g = at::zeros({12, 10});
  g.slice(0, 0, 4).slice(1, 0, 4).copy_(torch::randn({4, 4}));
  EXPECT_LT(RelativeBias(g, *pi, *qi), 1e-12);
}

// The device path (issue 6): on a GPU, both CUDA executions (ATen index ops and the project's
// kernels, lsp/cuda) must match the float64 CPU references on fresh random inputs.
TEST(ProjectorCudaTest, BothDevicePathsMatchTheFloat64Reference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: compiled, not run";
  const at::Device gpu(at::kCUDA, 0);
  const int64_t N = 77, m = 192, n = 320, d = 32, r = 4;
  const SparseProjector P = MakeProjector(m, d, r, 31), Q = MakeProjector(n, d, r, 32);
  const SparseProjector Pg = P.To(gpu), Qg = Q.To(gpu);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(33);
  const at::Tensor X = at::randn({N, n}, gen, at::kFloat);    // (N, n)
  const at::Tensor dY = at::randn({N, m}, gen, at::kFloat);   // (N, m)
  const at::Tensor D = at::randn({d, d}, gen, at::kFloat);    // (d, d)
  const at::Tensor W = 0.02 * at::randn({m, n}, gen, at::kFloat);
  // float64 references with dense projectors.
  const at::Tensor xq_ref = X.to(at::kDouble).mm(DenseF64(Q));                    // (N, d)
  const at::Tensor s_ref = DenseF64(P).t().mm(dY.to(at::kDouble).t()).mm(xq_ref);  // (d, d)
  const at::Tensor w_ref = W.to(at::kDouble) + DenseF64(P).mm(D.to(at::kDouble)).mm(DenseF64(Q).t());
  for (const CudaKernels k : {CudaKernels::kAten, CudaKernels::kCustom, CudaKernels::kDefault}) {
    if (k == CudaKernels::kCustom && !internal::CudaKernelsAvailable()) continue;
    SCOPED_TRACE(k == CudaKernels::kCustom ? "custom kernels"
                 : k == CudaKernels::kAten ? "ATen index ops"
                                           : "the default");
    torch::NoGradGuard no_grad;
    const at::Tensor xq = ProjectRows(X.to(gpu), Qg, k);
    EXPECT_LT(RelErr(xq.cpu().to(at::kDouble), xq_ref), 1e-5);
    const at::Tensor s = CompressFactored(dY.to(gpu), xq, Pg, k);
    EXPECT_LT(RelErr(s.cpu().to(at::kDouble), s_ref), 1e-5);
    at::Tensor w32 = W.to(gpu);
    ApplyStepFused(w32, nullptr, Pg, D.to(gpu), Qg, 1.0, Rounding::kNearest, 0, k);
    EXPECT_LT(RelErr(w32.cpu().to(at::kDouble), w_ref), 1e-6);
    at::Tensor w16 = W.to(at::kBFloat16).to(gpu);
    ApplyStepFused(w16, nullptr, Pg, D.to(gpu), Qg, 1.0, Rounding::kNearest, 0, k);
    EXPECT_TRUE(at::isfinite(w16).all().item<bool>());
    EXPECT_LT(RelErr(w16.cpu().to(at::kDouble), w_ref), 8e-3);  // bf16 W: one rounding
  }
}

// kAten and kCustom are taken as given; kDefault is the environment's LSPO_CUDA_KERNELS.
TEST(CudaKernelsTest, AnExplicitChoiceIsKeptTheDefaultIsTheEnvironments) {
  EXPECT_EQ(internal::ResolveCudaKernels(CudaKernels::kAten), CudaKernels::kAten);
  EXPECT_EQ(internal::ResolveCudaKernels(CudaKernels::kCustom), CudaKernels::kCustom);
  const char* env = std::getenv("LSPO_CUDA_KERNELS");
  const std::string e = env != nullptr ? env : "";
  const CudaKernels want = e == "custom" ? CudaKernels::kCustom
                           : e == "aten" ? CudaKernels::kAten
                                         : CudaKernels::kDefault;
  EXPECT_EQ(internal::ResolveCudaKernels(CudaKernels::kDefault), want);
}

}  // namespace
}  // namespace lspo::lsp
