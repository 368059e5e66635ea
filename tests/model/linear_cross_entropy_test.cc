// LinearCrossEntropySum (model/linear_cross_entropy.h) against a float64 reference of the
// unblocked loss: the sum and dL/dh, with ignored rows, blocks that do not divide the rows, one
// row per block, a bf16 head, no rows at all, and the memory it keeps for the backward.
#include "model/linear_cross_entropy.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <malloc.h>

#include <cmath>
#include <limits>

namespace lspo::model {
namespace {

constexpr int64_t kIgnore = -100;

// Float64 reference: Σ_{valid i} -log_softmax(h_i Wᵀ)[t_i] and its gradient with respect to h.
struct Reference {
  double loss = 0.0;
  at::Tensor grad;  // (R, H) float64
};

Reference Float64Loss(const at::Tensor& h, const at::Tensor& w, const at::Tensor& target) {
  at::Tensor hd = h.detach().to(at::kDouble).requires_grad_(true);
  at::Tensor logp = at::log_softmax(at::matmul(hd, w.to(at::kDouble).t()), 1);  // (R, V)
  at::Tensor valid = target.ne(kIgnore);
  at::Tensor safe = at::where(valid, target, at::zeros_like(target));
  at::Tensor nll = -logp.gather(1, safe.unsqueeze(1)).squeeze(1) * valid.to(at::kDouble);
  at::Tensor sum = nll.sum();
  sum.backward();
  return {sum.item<double>(), hd.grad()};
}

struct Inputs {
  at::Tensor h, w, target;
};

// R rows of width H, a head of V entries; every third target ignored.
Inputs Random(int64_t R, int64_t H, int64_t V, uint64_t seed) {
  at::manual_seed(seed);
  Inputs in;
  in.h = at::randn({R, H}) * 0.7;
  in.w = at::randn({V, H}) * 0.3;
  in.target = at::randint(0, V, {R}, at::kLong);
  for (int64_t i = 0; i < R; i += 3) in.target[i] = kIgnore;
  return in;
}

double MaxAbs(const at::Tensor& t) { return t.abs().max().item<double>(); }

TEST(LinearCrossEntropy, MatchesTheFloat64ReferenceForEveryBlockSize) {
  const Inputs in = Random(37, 24, 101, 1);
  const Reference ref = Float64Loss(in.h, in.w, in.target);
  ASSERT_GT(ref.loss, 10.0);  // 24 valid rows of ~log(101) each: a real loss, not ~0
  // Budgets giving 1 row, 7 rows (37 = 5 * 7 + 2), 16 rows and every row in one block.
  for (int64_t rows : {1, 7, 16, 37, 1000}) {
    SCOPED_TRACE(rows);
    const int64_t budget = rows * 4 * 101;
    ASSERT_EQ(LossBlockRows(101, budget), rows);
    at::Tensor h = in.h.clone().requires_grad_(true);
    at::Tensor loss = LinearCrossEntropySum(h, in.w, in.target, kIgnore, budget);
    EXPECT_EQ(loss.scalar_type(), at::kFloat);
    EXPECT_NEAR(loss.item<double>(), ref.loss, 2e-6 * ref.loss);
    (loss * 0.5).backward();  // the incoming gradient scales dL/dh
    ASSERT_TRUE(h.grad().defined());
    EXPECT_LE(MaxAbs(h.grad().to(at::kDouble) - 0.5 * ref.grad), 1e-6 * MaxAbs(ref.grad) + 1e-7);
    // Ignored rows get exactly zero.
    for (int64_t i = 0; i < 37; i += 3) EXPECT_EQ(MaxAbs(h.grad()[i]), 0.0) << i;
  }
}

TEST(LinearCrossEntropy, WithoutGradModeItIsTheSameLossAndRecordsNothing) {
  const Inputs in = Random(20, 16, 50, 2);
  const Reference ref = Float64Loss(in.h, in.w, in.target);
  at::Tensor h = in.h.clone().requires_grad_(true);
  at::NoGradGuard no_grad;
  at::Tensor loss = LinearCrossEntropySum(h, in.w, in.target, kIgnore, 3 * 4 * 50);
  EXPECT_FALSE(loss.requires_grad());
  EXPECT_NEAR(loss.item<double>(), ref.loss, 2e-6 * ref.loss);
}

TEST(LinearCrossEntropy, ABf16HeadRunsItsGemmsInBf16AndTheSoftmaxInFp32) {
  Inputs in = Random(33, 32, 64, 3);
  in.w = in.w.to(at::kBFloat16);
  // The reference with h rounded to bf16 as the kernel's GEMM input is: what remains is the
  // bf16 rounding of the logits (8 bits) and of the gradient's GEMM.
  const Reference ref = Float64Loss(in.h.to(at::kBFloat16).to(at::kFloat), in.w.to(at::kFloat),
                                    in.target);
  at::Tensor h = in.h.clone().requires_grad_(true);
  at::Tensor loss = LinearCrossEntropySum(h, in.w, in.target, kIgnore, 5 * 4 * 64);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_NEAR(loss.item<double>(), ref.loss, 1e-2 * ref.loss);
  loss.backward();
  EXPECT_EQ(h.grad().scalar_type(), at::kFloat);  // h's dtype
  EXPECT_LE(MaxAbs(h.grad().to(at::kDouble) - ref.grad), 2e-2 * MaxAbs(ref.grad));
}

TEST(LinearCrossEntropy, NoRowsOrOnlyIgnoredRowsGiveZeroAndAZeroGradient) {
  Inputs in = Random(6, 8, 10, 4);
  in.target.fill_(kIgnore);
  at::Tensor h = in.h.clone().requires_grad_(true);
  at::Tensor loss = LinearCrossEntropySum(h, in.w, in.target);
  EXPECT_EQ(loss.item<double>(), 0.0);
  loss.backward();
  EXPECT_EQ(MaxAbs(h.grad()), 0.0);

  at::Tensor empty = at::zeros({0, 8}).requires_grad_(true);
  at::Tensor zero = LinearCrossEntropySum(empty, in.w, at::zeros({0}, at::kLong));
  EXPECT_EQ(zero.item<double>(), 0.0);
  zero.backward();
  EXPECT_EQ(empty.grad().numel(), 0);
}

TEST(LinearCrossEntropy, ANonFiniteHiddenRowStaysVisibleInTheLossAndGradient) {
  Inputs in = Random(8, 8, 12, 5);
  in.target[1] = 3;
  in.h[1][2] = std::numeric_limits<float>::quiet_NaN();
  at::Tensor h = in.h.clone().requires_grad_(true);
  at::Tensor loss = LinearCrossEntropySum(h, in.w, in.target);
  EXPECT_TRUE(std::isnan(loss.item<double>()));
  loss.backward();
  EXPECT_FALSE(at::isfinite(h.grad()).all().item<bool>());
}

TEST(LinearCrossEntropy, KeepsOnlyTheHiddenGradientForTheBackward) {
  // 256 rows, a 8192-entry head: the unblocked loss keeps the 256 x 8192 fp32
  // log-probabilities (8 MiB) for its backward; this one keeps dL/dh, 256 x 16 fp32 (16 KiB).
  // Measured as the heap growth (glibc's in-use bytes, mmapped blocks included) while the
  // loss and its graph are alive.
  const Inputs in = Random(256, 16, 8192, 6);
  at::Tensor h = in.h.clone().requires_grad_(true);
  const auto in_use = [] {
    const struct mallinfo2 m = mallinfo2();
    return static_cast<int64_t>(m.uordblks + m.hblkhd);
  };
  const int64_t before = in_use();
  at::Tensor loss = LinearCrossEntropySum(h, in.w, in.target, kIgnore, 16 * 4 * 8192);
  const int64_t kept = in_use() - before;
  EXPECT_LT(kept, 1 << 20) << "bytes kept by the loss's graph";
  EXPECT_GE(kept, 256 * 16 * 4) << "dL/dh must be kept";
  const Reference ref = Float64Loss(in.h, in.w, in.target);
  loss.backward();
  EXPECT_LE(MaxAbs(h.grad().to(at::kDouble) - ref.grad), 1e-6 * MaxAbs(ref.grad) + 1e-7);
}

TEST(LinearCrossEntropy, ATrainableHeadGetsItsFloat64Gradient) {
  const Inputs in = Random(29, 12, 40, 7);
  at::Tensor wd = in.w.to(at::kDouble).requires_grad_(true);
  at::Tensor hd = in.h.to(at::kDouble);
  at::Tensor valid = in.target.ne(kIgnore);
  at::Tensor safe = at::where(valid, in.target, at::zeros_like(in.target));
  at::Tensor ref = -(at::log_softmax(at::matmul(hd, wd.t()), 1).gather(1, safe.unsqueeze(1))
                         .squeeze(1) * valid.to(at::kDouble)).sum();
  ref.backward();
  at::Tensor w = in.w.clone().requires_grad_(true);
  at::Tensor h = in.h.clone().requires_grad_(true);
  at::Tensor loss = LinearCrossEntropySum(h, w, in.target, kIgnore, 6 * 4 * 40);  // 5 blocks
  (loss * 2.0).backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_LE(MaxAbs(w.grad().to(at::kDouble) - 2.0 * wd.grad()), 1e-6 * MaxAbs(wd.grad()));
  // A frozen h with a trainable head: only the head's gradient.
  at::Tensor w2 = in.w.clone().requires_grad_(true);
  LinearCrossEntropySum(in.h, w2, in.target).backward();
  EXPECT_LE(MaxAbs(w2.grad().to(at::kDouble) - wd.grad()), 1e-6 * MaxAbs(wd.grad()));
}

TEST(LinearCrossEntropy, BlockRowsFollowTheBudget) {
  EXPECT_EQ(LossBlockRows(128256), 130);  // 64 MiB / (4 * 128256)
  EXPECT_EQ(LossBlockRows(32000), 524);
  EXPECT_EQ(LossBlockRows(1 << 30, 16), 1);  // never 0
}

}  // namespace
}  // namespace lspo::model
