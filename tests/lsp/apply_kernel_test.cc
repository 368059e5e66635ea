// The fused CPU apply (lsp/apply_kernel.h) against float64 references of the same update, on
// the weight shapes of the supported families, for every storage dtype and rounding; the
// stochastic rounding's bracketing, unbiasedness and determinism; and its argument checks.
#include "lsp/apply_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/lsp/host_projector.h"
#include "lsp/rounding.h"
#include "runtime/float16.h"
#include "tbb/global_control.h"

namespace lspo::lsp {
namespace {

using runtime::Bf16ToFp32;
using runtime::Fp16ToFp32;
using runtime::Fp32ToBf16;
using runtime::Fp32ToFp16;

// A random (m, d) projector with r distinct columns per row and N(0, 1/r) values.
using Proj = HostProjector;

Proj RandomProj(int64_t rows, int64_t d, int64_t r, std::mt19937& rng) {
  return RandomHostProjector(rows, d, r, rng);
}

float Load(const std::vector<uint16_t>& v, int64_t k, WeightDtype dt) {
  return dt == WeightDtype::kBFloat16 ? Bf16ToFp32(v[k]) : Fp16ToFp32(v[k]);
}
uint16_t Store(float f, WeightDtype dt) {
  return dt == WeightDtype::kBFloat16 ? Fp32ToBf16(f) : Fp32ToFp16(f);
}

// The operands of one apply of W (m, n) in `dt` from E (d, n) and P's (m, r) index / value.
FusedApplyArgs Args(void* w, WeightDtype dt, int64_t m, int64_t n, const float* e, int64_t d,
                    const int64_t* idx, const float* val, int64_t r, Rounding rd,
                    uint64_t seed) {
  FusedApplyArgs a;
  a.w = w;
  a.dtype = dt;
  a.m = m;
  a.n = n;
  a.e = e;
  a.d = d;
  a.p_index = idx;
  a.p_value = val;
  a.r = r;
  a.rounding = rd;
  a.seed = seed;
  return a;
}

// The spacing of the 16-bit format around |x| (bf16: 8 significant bits, fp16: 11; fp16's
// subnormal spacing 2^-24 below 2^-14).
double Ulp16(double x, WeightDtype dt) {
  const int bits = dt == WeightDtype::kBFloat16 ? 8 : 11;
  const int min_exp = dt == WeightDtype::kBFloat16 ? -126 : -14;
  int e = 0;
  std::frexp(std::max(std::fabs(x), std::ldexp(1.0, min_exp)), &e);
  return std::ldexp(1.0, e - bits);
}

struct Shape {
  std::string family;
  int64_t m, n, d, r;
};

// Weight shapes (m = out, n = in) of each family's seven linears, from their config.json
// (hidden, intermediate, heads x head_dim, kv heads x head_dim), with the main job's d / r and
// the paper's. The large families test a 40-row slice with the full width (rows are independent
// in the kernel; the width sets every per-row loop).
std::vector<Shape> FamilyShapes() {
  return {
      {"SmolLM2-135M q/o", 576, 576, 128, 4},    {"SmolLM2-135M k/v", 192, 576, 128, 4},
      {"SmolLM2-135M gate/up", 1536, 576, 384, 8}, {"SmolLM2-135M down", 576, 1536, 384, 8},
      {"Qwen2-0.5B q/o", 40, 896, 256, 8},       {"Qwen2-0.5B k/v", 128, 896, 256, 8},
      {"Qwen2-0.5B down", 40, 4864, 256, 8},     {"TinyLlama-1.1B gate/up", 40, 2048, 256, 8},
      {"TinyLlama-1.1B down", 40, 5632, 256, 8}, {"Llama-2-7B q/o", 40, 4096, 2048, 4},
      {"Llama-2-7B down", 40, 11008, 2048, 4},   {"Mistral-7B down", 40, 14336, 512, 8},
  };
}

// Runs one apply on random operands of `s` and checks every element against the float64 sum
// ref = decay (W + C) + sum_k p_k E[idx_k, j].
void CheckShape(const Shape& s, WeightDtype dt, Rounding rd) {
  SCOPED_TRACE(s.family + " dtype " + std::to_string(static_cast<int>(dt)) + " rounding " +
               std::to_string(static_cast<int>(rd)));
  std::mt19937 rng(static_cast<uint32_t>(s.m * 31 + s.n + static_cast<int>(rd)));
  const Proj p = RandomProj(s.m, s.d, s.r, rng);
  std::normal_distribution<float> nd;
  std::vector<float> e(s.d * s.n), w32(s.m * s.n);
  for (auto& v : e) v = 1e-3f * nd(rng);
  for (auto& v : w32) v = 0.02f * nd(rng);
  std::vector<uint16_t> w16(s.m * s.n), c16(s.m * s.n, 0);
  std::vector<double> before(s.m * s.n);
  const bool f32 = dt == WeightDtype::kFloat32;
  for (int64_t k = 0; k < s.m * s.n; ++k) {
    if (f32) {
      before[k] = w32[k];
      continue;
    }
    w16[k] = Store(w32[k], dt);
    const float back = Load(w16, k, dt);
    c16[k] = Store(w32[k] - back, dt);
    before[k] = back + (rd == Rounding::kCompensated ? Load(c16, k, dt) : 0.0f);
  }
  const float decay = 0.9995f;
  FusedApplyArgs a =
      Args(f32 ? static_cast<void*>(w32.data()) : static_cast<void*>(w16.data()), dt, s.m, s.n,
           e.data(), s.d, p.index.data(), p.value.data(), s.r, rd, 77);
  a.c = rd == Rounding::kCompensated ? c16.data() : nullptr;
  a.decay = decay;
  ASSERT_TRUE(FusedApplyCpu(a).ok());
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      const int64_t k = i * s.n + j;
      double ref = before[k] * static_cast<double>(decay);
      double mag = std::fabs(ref);  // the operands' size: fp32's rounding scales with it
      for (int64_t q = 0; q < s.r; ++q) {
        const double term =
            static_cast<double>(p.value[i * s.r + q]) * e[p.index[i * s.r + q] * s.n + j];
        ref += term;
        mag += std::fabs(term);
      }
      // The kernel sums in fp32: r + 1 additions and as many products, each within half an
      // fp32 ulp of the operands' size.
      const double fp32_err = static_cast<double>(s.r + 2) * std::ldexp(mag, -24);
      if (f32) {
        const double err = std::fabs(w32[k] - ref) / (fp32_err + 1e-30);
        worst = std::max(worst, err);
        bad += err > 1.0;
        continue;
      }
      const double got = Load(w16, k, dt);
      const double ulp = Ulp16(ref, dt);
      double allowed = fp32_err;
      double off = std::fabs(got - ref);
      switch (rd) {
        case Rounding::kNearest:  // half an ulp of the sum
          allowed += 0.5 * ulp;
          break;
        case Rounding::kStochastic:  // one of the two neighbours bracketing the sum
          allowed += ulp;
          break;
        case Rounding::kCompensated:  // W + C carries the sum to C's own rounding
          off = std::fabs(got + Load(c16, k, dt) - ref);
          // C is at most half an ulp of W, rounded to 2^-8 (bf16) / 2^-11 (fp16) of itself;
          // fp16's C may be subnormal (spacing 2^-24).
          allowed += ulp / 64 + (dt == WeightDtype::kFloat16 ? std::ldexp(1.0, -25) : 0.0);
          break;
      }
      worst = std::max(worst, off / allowed);
      bad += off > allowed;
    }
  }
  EXPECT_EQ(bad, 0) << "elements off; worst " << worst;
}

TEST(FusedApplyCpuTest, MatchesTheFloat64SumOnEveryFamilyShape) {
  for (const Shape& s : FamilyShapes()) {
    CheckShape(s, WeightDtype::kFloat32, Rounding::kNearest);
    for (WeightDtype dt : {WeightDtype::kBFloat16, WeightDtype::kFloat16}) {
      for (Rounding rd : {Rounding::kNearest, Rounding::kCompensated, Rounding::kStochastic}) {
        CheckShape(s, dt, rd);
      }
    }
  }
}

// A step of 0.3 ulp on 2^16 equal bf16 weights of 1.0: stochastic rounding moves 30 % of them
// up one ulp (binomial, 4 sigma = 0.7 %), so the mean moves by the step; nearest moves none.
TEST(FusedApplyCpuTest, StochasticRoundingIsUnbiased) {
  const int64_t m = 64, n = 1024, d = 1;
  for (WeightDtype dt : {WeightDtype::kBFloat16, WeightDtype::kFloat16}) {
    const double ulp = Ulp16(1.0, dt);
    std::vector<uint16_t> w(m * n, Store(1.0f, dt));
    std::vector<float> e(n, static_cast<float>(0.3 * ulp));
    std::vector<int64_t> idx(m, 0);
    std::vector<float> val(m, 1.0f);
    FusedApplyArgs a = Args(w.data(), dt, m, n, e.data(), d, idx.data(),
                            val.data(), 1, Rounding::kStochastic, 2026);
    ASSERT_TRUE(FusedApplyCpu(a).ok());
    int64_t up = 0, other = 0;
    for (uint16_t b : w) {
      const double v = dt == WeightDtype::kBFloat16 ? Bf16ToFp32(b) : Fp16ToFp32(b);
      if (v == 1.0 + ulp) {
        ++up;
      } else if (v != 1.0) {
        ++other;
      }
    }
    EXPECT_EQ(other, 0);
    EXPECT_NEAR(static_cast<double>(up) / (m * n), 0.3, 0.007) << "dtype " << static_cast<int>(dt);
    // Nearest rounding loses the whole step.
    std::vector<uint16_t> near(m * n, Store(1.0f, dt));
    a.w = near.data();
    a.rounding = Rounding::kNearest;
    ASSERT_TRUE(FusedApplyCpu(a).ok());
    EXPECT_TRUE(std::all_of(near.begin(), near.end(),
                            [&](uint16_t b) { return b == Store(1.0f, dt); }));
  }
}

// The same seed gives the same bits at any thread count; another seed other bits.
TEST(FusedApplyCpuTest, StochasticRoundingIsDeterministic) {
  const Shape s{"SmolLM2-135M gate/up", 1536, 576, 384, 8};
  std::mt19937 rng(5);
  const Proj p = RandomProj(s.m, s.d, s.r, rng);
  std::normal_distribution<float> nd;
  std::vector<float> e(s.d * s.n);
  for (auto& v : e) v = 1e-3f * nd(rng);
  std::vector<uint16_t> start(s.m * s.n);
  for (auto& b : start) b = Fp32ToBf16(0.02f * nd(rng));
  auto run = [&](uint64_t seed, int threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    std::vector<uint16_t> w = start;
    FusedApplyArgs a = Args(w.data(), WeightDtype::kBFloat16, s.m, s.n, e.data(), s.d,
                            p.index.data(), p.value.data(), s.r, Rounding::kStochastic, seed);
    a.decay = 0.999f;
    EXPECT_TRUE(FusedApplyCpu(a).ok());
    return w;
  };
  const std::vector<uint16_t> one = run(9, 1);
  EXPECT_EQ(one, run(9, 2));
  const std::vector<uint16_t> other = run(10, 2);
  int64_t differ = 0;
  for (size_t k = 0; k < one.size(); ++k) differ += one[k] != other[k];
  EXPECT_GT(differ, static_cast<int64_t>(one.size() / 100));
}

// Bf16Stochastic between two neighbours: every 16-bit noise value, the count rounded up is
// exactly the dropped half of the pattern (the probability (x - lo) / ulp times 2^16).
TEST(RoundingTest, Bf16StochasticRoundsUpInProportionToTheRemainder) {
  for (uint32_t x : {0x3f801234u, 0xbf80ff00u, 0x00001000u, 0x7f7f8000u}) {
    int64_t up = 0;
    for (uint32_t noise = 0; noise < 65536; ++noise) {
      const uint16_t b = Bf16Stochastic(x, noise);
      ASSERT_TRUE(b == (x >> 16) || b == (x >> 16) + 1) << std::hex << x;
      up += b != (x >> 16);
    }
    if ((x & 0x7fffffffu) == 0x7f7f8000u) {
      EXPECT_EQ(up, 0) << "the largest bf16 never rounds up to inf";
    } else {
      EXPECT_EQ(up, static_cast<int64_t>(x & 0xffffu)) << std::hex << x;
    }
  }
  EXPECT_EQ(Bf16Stochastic(0x7fc00001u, 0xffffu) & 0x7fc0u, 0x7fc0u);  // NaN stays NaN
  EXPECT_EQ(Bf16Stochastic(0xff800000u, 0xffffu), 0xff80u);              // -inf stays -inf
}

// The branch-free fp16 conversions the fused apply uses give the exact scalar conversions'
// bits: every f16 pattern, and f32 patterns over every exponent (each with 4096 mantissas
// spread over the range, the ties and their neighbours).
TEST(RoundingTest, BranchlessFp16ConversionsMatchTheExactOnes) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = runtime::Fp16ToFp32(static_cast<uint16_t>(h));
    const float got = runtime::Fp16ToFp32Branchless(static_cast<uint16_t>(h));
    ASSERT_EQ(runtime::FloatBits(got), runtime::FloatBits(want)) << std::hex << h;
  }
  int64_t checked = 0;
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t exp = 0; exp < 256; ++exp) {
      for (uint32_t k = 0; k < 4096; ++k) {
        // Spread mantissas, plus the 13-bit rounding boundary (0x1000) and its neighbours.
        const uint32_t spread = k * 2048u + (k % 7);
        const uint32_t tie = ((k & 0x3ffu) << 13) | 0x1000u;
        for (uint32_t mant : {spread & 0x7fffffu, tie, tie - 1u, tie + 1u}) {
          const uint32_t x = (sign << 31) | (exp << 23) | (mant & 0x7fffffu);
          const float f = runtime::BitsToFloat(x);
          ASSERT_EQ(runtime::Fp32ToFp16Branchless(f), runtime::Fp32ToFp16(f)) << std::hex << x;
          ++checked;
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 256 * 4096 * 4);
}

TEST(RoundingTest, Fp16NeighbourStepsAcrossZeroAndBinades) {
  EXPECT_EQ(Fp16Neighbour(0x3c00u, true), 0x3c01u);   // 1 -> 1 + 2^-10
  EXPECT_EQ(Fp16Neighbour(0x3c00u, false), 0x3bffu);  // 1 -> 1 - 2^-11
  EXPECT_EQ(Fp16Neighbour(0xbc00u, true), 0xbbffu);   // -1 -> towards zero
  EXPECT_EQ(Fp16Neighbour(0x0000u, false), 0x8001u);  // +0 -> -2^-24
  EXPECT_EQ(Fp16Neighbour(0x8000u, true), 0x0001u);   // -0 -> +2^-24
}

TEST(RoundingTest, RoundStochasticMatchesTheFusedApply) {
  // A fused apply of W = 0 with E = t (r = 1, P = 1, decay 1) rounds the sums t themselves.
  const int64_t m = 32, n = 333;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  std::vector<float> t(m * n);
  for (auto& v : t) v = nd(rng);
  for (WeightDtype dt : {WeightDtype::kBFloat16, WeightDtype::kFloat16}) {
    std::vector<uint16_t> direct(m * n);
    ASSERT_TRUE(RoundStochastic(t.data(), direct.data(), m * n, dt, 42).ok());
    std::vector<uint16_t> w(m * n, 0);
    // Full matrix: E (m, n) = t, P row i = e_i (d = m, r = 1).
    std::vector<int64_t> idx(m);
    std::vector<float> val(m, 1.0f);
    for (int64_t i = 0; i < m; ++i) idx[i] = i;
    FusedApplyArgs a = Args(w.data(), dt, m, n, t.data(), m, idx.data(),
                            val.data(), 1, Rounding::kStochastic, 42);
    ASSERT_TRUE(FusedApplyCpu(a).ok());
    EXPECT_EQ(w, direct) << "dtype " << static_cast<int>(dt);
  }
  std::vector<uint16_t> out(1);
  std::vector<float> one(1, 1.0f);
  EXPECT_FALSE(RoundStochastic(one.data(), out.data(), 1, WeightDtype::kFloat32, 0).ok());
}

TEST(FusedApplyCpuTest, RejectsBadArguments) {
  std::vector<uint16_t> w(4, 0);
  std::vector<float> w32(4, 0), e(4, 0);
  std::vector<int64_t> idx(2, 0);
  std::vector<float> val(2, 1.0f);
  FusedApplyArgs a;
  a.w = w.data();
  a.dtype = WeightDtype::kBFloat16;
  a.m = 2;
  a.n = 2;
  a.e = e.data();
  a.d = 2;
  a.p_index = idx.data();
  a.p_value = val.data();
  a.r = 1;
  EXPECT_TRUE(FusedApplyCpu(a).ok());
  FusedApplyArgs b = a;
  b.rounding = Rounding::kCompensated;  // no C
  EXPECT_EQ(FusedApplyCpu(b).code(), absl::StatusCode::kInvalidArgument);
  b.c = w.data();
  b.w = w32.data();
  b.dtype = WeightDtype::kFloat32;  // fp32 has no residual
  EXPECT_EQ(FusedApplyCpu(b).code(), absl::StatusCode::kInvalidArgument);
  b = a;
  b.decay = std::nanf("");
  EXPECT_EQ(FusedApplyCpu(b).code(), absl::StatusCode::kInvalidArgument);
  b = a;
  b.r = 3;  // r > d
  EXPECT_EQ(FusedApplyCpu(b).code(), absl::StatusCode::kInvalidArgument);
  b = a;
  b.e = nullptr;
  EXPECT_EQ(FusedApplyCpu(b).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lspo::lsp
