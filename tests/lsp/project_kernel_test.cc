// The token-tiled CPU projection (lsp/project_kernel.h) against a float64 reference of
// (X P)^T on the input shapes of the supported families, with token and feature counts off
// the tile sizes, every input dtype, several projectors per call; its bit-level promises (the
// documented summation order, independence of the thread count) and its argument checks.
#include "lsp/project_kernel.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/lsp/host_projector.h"
#include "runtime/float16.h"
#include "tbb/global_control.h"

namespace lspo::lsp {
namespace {

using Proj = HostProjector;

Proj RandomProj(int64_t rows, int64_t d, int64_t r, std::mt19937& rng) {
  return RandomHostProjector(rows, d, r, rng);
}

// X (n_tok, rows) as fp32 values exactly representable in `dt`, and its storage bits.
struct Input {
  std::vector<float> values;  // exact fp32 values
  std::vector<float> f32;     // fp32 storage
  std::vector<uint16_t> h16;  // bf16 / fp16 storage
  const void* Data(WeightDtype dt) const {
    return dt == WeightDtype::kFloat32 ? static_cast<const void*>(f32.data())
                                       : static_cast<const void*>(h16.data());
  }
};

Input RandomInput(int64_t n_tok, int64_t rows, WeightDtype dt, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  Input in;
  for (int64_t k = 0; k < n_tok * rows; ++k) {
    const float v = nd(rng);
    if (dt == WeightDtype::kFloat32) {
      in.values.push_back(v);
      in.f32.push_back(v);
    } else if (dt == WeightDtype::kBFloat16) {
      in.h16.push_back(runtime::Fp32ToBf16(v));
      in.values.push_back(runtime::Bf16ToFp32(in.h16.back()));
    } else {
      in.h16.push_back(runtime::Fp32ToFp16(v));
      in.values.push_back(runtime::Fp16ToFp32(in.h16.back()));
    }
  }
  return in;
}

// (X P)^T (d, n_tok) in float64.
std::vector<double> Reference(const std::vector<float>& x, int64_t n_tok, int64_t rows,
                              const Proj& p) {
  std::vector<double> out(static_cast<size_t>(p.d * n_tok), 0.0);
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t k = 0; k < p.r; ++k) {
        out[p.index[i * p.r + k] * n_tok + t] +=
            static_cast<double>(p.value[i * p.r + k]) * x[t * rows + i];
      }
    }
  }
  return out;
}

// The documented fp32 order: features ascending, product rounded, then added.
std::vector<float> OrderedFp32(const std::vector<float>& x, int64_t n_tok, int64_t rows,
                               const Proj& p) {
  std::vector<float> out(static_cast<size_t>(p.d * n_tok), 0.f);
  for (int64_t t = 0; t < n_tok; ++t) {
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t k = 0; k < p.r; ++k) {
        volatile float prod = p.value[i * p.r + k] * x[t * rows + i];
        float& o = out[p.index[i * p.r + k] * n_tok + t];
        o = o + prod;
      }
    }
  }
  return out;
}

// Runs the kernel for all of `ps` over x; returns each (d, n_tok) output.
std::vector<std::vector<float>> Project(const Input& in, WeightDtype dt, int64_t n_tok,
                                    int64_t rows, const std::vector<Proj>& ps) {
  std::vector<std::vector<float>> outs(ps.size());
  std::vector<ProjectTarget> targets(ps.size());
  for (size_t k = 0; k < ps.size(); ++k) {
    outs[k].assign(static_cast<size_t>(ps[k].d * n_tok), std::nanf(""));
    targets[k].index = ps[k].index.data();
    targets[k].value = ps[k].value.data();
    targets[k].d = ps[k].d;
    targets[k].r = ps[k].r;
    targets[k].out = outs[k].data();
  }
  ProjectArgs a;
  a.x = in.Data(dt);
  a.dtype = dt;
  a.n_tok = n_tok;
  a.rows = rows;
  a.targets = targets.data();
  a.n_targets = static_cast<int64_t>(targets.size());
  const absl::Status st = ProjectTokensCpu(a);
  EXPECT_TRUE(st.ok()) << st;
  return outs;
}

struct Case {
  int64_t n_tok, rows;
  std::vector<std::pair<int64_t, int64_t>> dr;  // (d, r) of each projector
};

std::string Name(const Case& c) {
  std::string s = std::to_string(c.n_tok) + "x" + std::to_string(c.rows);
  for (const auto& [d, r] : c.dr) s += " d" + std::to_string(d) + "r" + std::to_string(r);
  return s;
}

// Shapes: SmolLM2 (576, 1536), Llama-1B-class (2048, 5632), Qwen2-0.5B (896, 4864), a
// Mistral-class hidden 4096 (one token tile only, to stay fast), odd feature counts (tails
// of the 16 x 16 transposes), token counts off the 16-token tile, one-sided identity-like d.
const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {1024, 576, {{128, 4}, {128, 4}, {64, 8}}},  // q|k|v of SmolLM2 at d 128
      {130, 576, {{256, 8}, {256, 8}}},            // gate|up, a partial last tile
      {64, 1536, {{384, 4}}},                      // down
      {33, 2048, {{256, 8}}},                      // Llama-1B q
      {17, 5632, {{256, 8}}},                      // Llama-1B down
      {40, 896, {{256, 4}, {128, 16}}},            // Qwen2-0.5B q|k
      {16, 4096, {{512, 8}}},                      // Mistral-class q
      {7, 37, {{5, 3}}},                           // tiny, every tail
      {1, 19, {{19, 1}}},                          // one token, identity-sized
      {48, 100, {{32, 32}}},                       // r = d (a dense row pattern)
  };
  return cases;
}

class ProjectKernelTest : public ::testing::TestWithParam<WeightDtype> {};

TEST_P(ProjectKernelTest, MatchesFloat64ReferenceOnFamilyShapes) {
  const WeightDtype dt = GetParam();
  std::mt19937 rng(7);
  for (const Case& c : Cases()) {
    SCOPED_TRACE(Name(c));
    const Input in = RandomInput(c.n_tok, c.rows, dt, rng);
    std::vector<Proj> ps;
    for (const auto& [d, r] : c.dr) ps.push_back(RandomProj(c.rows, d, r, rng));
    const std::vector<std::vector<float>> got = Project(in, dt, c.n_tok, c.rows, ps);
    for (size_t k = 0; k < ps.size(); ++k) {
      const std::vector<double> ref = Reference(in.values, c.n_tok, c.rows, ps[k]);
      // Recursive fp32 summation of `count` rounded products: |error| <= (count + 1) u
      // sum |terms| to first order, u = 2^-24 (Higham, "Accuracy and Stability of Numerical
      // Algorithms", 2nd ed., eq. 4.4).
      std::vector<double> abs_sum(ref.size(), 0.0), count(ref.size(), 0.0);
      for (int64_t t = 0; t < c.n_tok; ++t) {
        for (int64_t i = 0; i < c.rows; ++i) {
          for (int64_t j = 0; j < ps[k].r; ++j) {
            abs_sum[ps[k].index[i * ps[k].r + j] * c.n_tok + t] +=
                std::fabs(static_cast<double>(ps[k].value[i * ps[k].r + j]) *
                          in.values[t * c.rows + i]);
            count[ps[k].index[i * ps[k].r + j] * c.n_tok + t] += 1.0;
          }
        }
      }
      int bad = 0;
      for (size_t e = 0; e < ref.size(); ++e) {
        const double tol = abs_sum[e] * (count[e] + 1.0) * 0x1p-24 + 1e-30;
        if (!(std::fabs(got[k][e] - ref[e]) <= tol) && bad++ < 5) {
          ADD_FAILURE() << "projector " << k << " element " << e << ": " << got[k][e]
                        << " vs float64 " << ref[e] << " (tol " << tol << ")";
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

TEST_P(ProjectKernelTest, GivesTheDocumentedFp32OrderBitForBit) {
  // Per element: features ascending, each product rounded to fp32, then added.
  const WeightDtype dt = GetParam();
  std::mt19937 rng(11);
  for (const Case& c : {Cases()[1], Cases()[5], Cases()[7]}) {
    SCOPED_TRACE(Name(c));
    const Input in = RandomInput(c.n_tok, c.rows, dt, rng);
    std::vector<Proj> ps;
    for (const auto& [d, r] : c.dr) ps.push_back(RandomProj(c.rows, d, r, rng));
    const std::vector<std::vector<float>> got = Project(in, dt, c.n_tok, c.rows, ps);
    for (size_t k = 0; k < ps.size(); ++k) {
      const std::vector<float> want = OrderedFp32(in.values, c.n_tok, c.rows, ps[k]);
      ASSERT_EQ(got[k].size(), want.size());
      int bad = 0;
      for (size_t e = 0; e < want.size(); ++e) {
        if (got[k][e] != want[e] && bad++ < 5) {
          ADD_FAILURE() << "projector " << k << " element " << e << ": " << got[k][e]
                        << " vs " << want[e];
        }
      }
      EXPECT_EQ(bad, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ProjectKernelTest,
                         ::testing::Values(WeightDtype::kFloat32, WeightDtype::kBFloat16,
                                           WeightDtype::kFloat16),
                         [](const ::testing::TestParamInfo<WeightDtype>& info) {
                           return info.param == WeightDtype::kFloat32    ? std::string("fp32")
                                  : info.param == WeightDtype::kBFloat16 ? std::string("bf16")
                                                                         : std::string("fp16");
                         });

TEST(ProjectKernel, OneThreadAndTwoGiveTheSameBits) {
  std::mt19937 rng(3);
  const Case& c = Cases()[0];
  const Input in = RandomInput(c.n_tok, c.rows, WeightDtype::kFloat32, rng);
  std::vector<Proj> ps;
  for (const auto& [d, r] : c.dr) ps.push_back(RandomProj(c.rows, d, r, rng));
  std::vector<std::vector<float>> one;
  {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, 1);
    one = Project(in, WeightDtype::kFloat32, c.n_tok, c.rows, ps);
  }
  const std::vector<std::vector<float>> many = Project(in, WeightDtype::kFloat32, c.n_tok, c.rows, ps);
  EXPECT_EQ(one, many);
}

TEST(ProjectKernel, EveryTargetEqualsItsOwnCall) {
  // Sharing the input's pass changes nothing: q|k|v in one call equals three calls.
  std::mt19937 rng(5);
  const Case& c = Cases()[0];
  const Input in = RandomInput(c.n_tok, c.rows, WeightDtype::kFloat32, rng);
  std::vector<Proj> ps;
  for (const auto& [d, r] : c.dr) ps.push_back(RandomProj(c.rows, d, r, rng));
  const std::vector<std::vector<float>> together =
      Project(in, WeightDtype::kFloat32, c.n_tok, c.rows, ps);
  for (size_t k = 0; k < ps.size(); ++k) {
    EXPECT_EQ(Project(in, WeightDtype::kFloat32, c.n_tok, c.rows, {ps[k]})[0], together[k]) << k;
  }
}

TEST(ProjectKernel, RejectsBadArguments) {
  std::mt19937 rng(1);
  const Proj p = RandomProj(8, 4, 2, rng);
  std::vector<float> x(16 * 8, 1.f), out(4 * 16);
  ProjectTarget t{p.index.data(), p.value.data(), 4, 2, out.data()};
  ProjectArgs a;
  a.x = x.data();
  a.n_tok = 16;
  a.rows = 8;
  a.targets = &t;
  a.n_targets = 1;
  EXPECT_TRUE(ProjectTokensCpu(a).ok());
  ProjectArgs bad = a;
  bad.x = nullptr;
  EXPECT_EQ(ProjectTokensCpu(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = a;
  bad.n_tok = 0;
  EXPECT_EQ(ProjectTokensCpu(bad).code(), absl::StatusCode::kInvalidArgument);
  bad = a;
  bad.n_targets = 0;
  EXPECT_EQ(ProjectTokensCpu(bad).code(), absl::StatusCode::kInvalidArgument);
  ProjectTarget bt = t;
  bt.r = 5;  // r > d
  bad = a;
  bad.targets = &bt;
  const absl::Status st = ProjectTokensCpu(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("1 <= r <= d"), std::string::npos) << st;
  bt = t;
  bt.out = nullptr;
  bad.targets = &bt;
  EXPECT_EQ(ProjectTokensCpu(bad).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lspo::lsp
