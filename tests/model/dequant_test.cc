// Tests of model/dequant.h and runtime/float16.h against float64 references written here
// independently from the formulas in docs/formats.md §2 (element-indexed, not block-loop form).
#include "model/dequant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/float16.h"

namespace lspo::model {
namespace {

// ---- float64 references ----

// binary16 value by the IEEE formula.
double HalfValue(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 31;
  const int m = h & 1023;
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -24);
  if (e == 31) {
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  }
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}

double HalfAt(const uint8_t* p) { return HalfValue(static_cast<uint16_t>(p[0] | (p[1] << 8))); }

// Reference value and magnitude bound (sum of |terms|) of element e of a block.
struct Ref {
  double value;
  double mag;
};

Ref RefQ4_0(const uint8_t* b, int e) {
  const double d = HalfAt(b);
  const uint8_t q = b[2 + e % 16];
  const int nib = e < 16 ? (q & 15) : (q >> 4);
  return {(nib - 8) * d, std::abs((nib - 8) * d)};
}

Ref RefQ4_1(const uint8_t* b, int e) {
  const double d = HalfAt(b), m = HalfAt(b + 2);
  const uint8_t q = b[4 + e % 16];
  const int nib = e < 16 ? (q & 15) : (q >> 4);
  return {nib * d + m, std::abs(nib * d) + std::abs(m)};
}

// Bit e of the u32 qh (bit j for element j, bit j+16 for element j+16).
int Q5HighBit(const uint8_t* qh, int e) { return (qh[e / 8] >> (e % 8)) & 1; }

Ref RefQ5_0(const uint8_t* b, int e) {
  const double d = HalfAt(b);
  const uint8_t q = b[6 + e % 16];
  const int nib = (e < 16 ? (q & 15) : (q >> 4)) + 16 * Q5HighBit(b + 2, e);
  return {(nib - 16) * d, std::abs((nib - 16) * d)};
}

Ref RefQ5_1(const uint8_t* b, int e) {
  const double d = HalfAt(b), m = HalfAt(b + 2);
  const uint8_t q = b[8 + e % 16];
  const int nib = (e < 16 ? (q & 15) : (q >> 4)) + 16 * Q5HighBit(b + 4, e);
  return {nib * d + m, std::abs(nib * d) + std::abs(m)};
}

Ref RefQ8_0(const uint8_t* b, int e) {
  const double v = static_cast<int8_t>(b[2 + e]) * HalfAt(b);
  return {v, std::abs(v)};
}

// K-quant 6-bit scale and min of sub-block j from the 12 packed bytes s.
void RefScaleMin(const uint8_t* s, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] % 64;
    *mn = s[j + 4] % 64;
  } else {
    *sc = (s[j + 4] % 16) + 16 * (s[j - 4] / 64);
    *mn = (s[j + 4] / 16) + 16 * (s[j] / 64);
  }
}

Ref RefQ4_K(const uint8_t* b, int e) {
  const double d = HalfAt(b), dmin = HalfAt(b + 2);
  const int c = e / 64, hi = (e % 64) / 32, l = e % 32;
  const uint8_t q = b[16 + 32 * c + l];
  const int nib = hi ? q / 16 : q % 16;
  int sc, mn;
  RefScaleMin(b + 4, 2 * c + hi, &sc, &mn);
  return {d * sc * nib - dmin * mn, std::abs(d * sc * nib) + std::abs(dmin * mn)};
}

Ref RefQ5_K(const uint8_t* b, int e) {
  const double d = HalfAt(b), dmin = HalfAt(b + 2);
  const int c = e / 64, hi = (e % 64) / 32, l = e % 32;
  const uint8_t q = b[48 + 32 * c + l];
  const int sub = 2 * c + hi;
  const int nib = (hi ? q / 16 : q % 16) + 16 * ((b[16 + l] >> sub) & 1);
  int sc, mn;
  RefScaleMin(b + 4, sub, &sc, &mn);
  return {d * sc * nib - dmin * mn, std::abs(d * sc * nib) + std::abs(dmin * mn)};
}

Ref RefQ6_K(const uint8_t* b, int e) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const double d = HalfAt(b + 208);
  const int n = e / 128, quarter = (e % 128) / 32, l = e % 32;
  const uint8_t low_byte = ql[64 * n + l + (quarter % 2 ? 32 : 0)];
  const int low = quarter < 2 ? low_byte % 16 : low_byte / 16;
  const int high = (qh[32 * n + l] >> (2 * quarter)) & 3;
  const int q = low + 16 * high - 32;
  const double v = d * sc[8 * n + l / 16 + 2 * quarter] * q;
  return {v, std::abs(v)};
}

// ---- random blocks ----

// A random finite f16 with exponent field in [lo_exp, hi_exp] (0 gives subnormals).
uint16_t RandomHalf(std::mt19937& rng, int lo_exp, int hi_exp) {
  std::uniform_int_distribution<int> e(lo_exp, hi_exp), m(0, 1023), s(0, 1);
  return static_cast<uint16_t>((s(rng) << 15) | (e(rng) << 10) | m(rng));
}

void PutHalf(uint8_t* p, uint16_t h) {
  p[0] = static_cast<uint8_t>(h & 0xff);
  p[1] = static_cast<uint8_t>(h >> 8);
}

// Random block bytes of `type` with valid finite f16 scales at their positions. Every 5th
// block uses a subnormal scale to exercise the f16 subnormal path.
std::vector<uint8_t> RandomBlocks(GgmlType type, int nblocks, uint32_t seed) {
  std::mt19937 rng(seed);
  const int ts = static_cast<int>(GgmlTypeSize(type));
  std::vector<uint8_t> v(static_cast<size_t>(ts) * nblocks);
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& x : v) x = static_cast<uint8_t>(byte(rng));
  for (int blk = 0; blk < nblocks; ++blk) {
    uint8_t* b = v.data() + static_cast<size_t>(blk) * ts;
    const bool sub = blk % 5 == 4;
    auto half = [&]() { return sub ? RandomHalf(rng, 0, 0) : RandomHalf(rng, 5, 20); };
    switch (type) {
      case GgmlType::kQ4_0:
      case GgmlType::kQ5_0:
      case GgmlType::kQ8_0:
        PutHalf(b, half());
        break;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_1:
      case GgmlType::kQ4_K:
      case GgmlType::kQ5_K:
        PutHalf(b, half());
        PutHalf(b + 2, half());
        break;
      case GgmlType::kQ6_K:
        PutHalf(b + 208, half());
        break;
      default:
        break;
    }
  }
  return v;
}

using RefFn = Ref (*)(const uint8_t*, int);

struct BlockCase {
  GgmlType type;
  RefFn ref;
};

class DequantBlockTest : public ::testing::TestWithParam<BlockCase> {};

TEST_P(DequantBlockTest, MatchesFloat64Reference) {
  const BlockCase c = GetParam();
  const int B = static_cast<int>(GgmlBlockSize(c.type));
  const int ts = static_cast<int>(GgmlTypeSize(c.type));
  for (int nblocks : {1, 7, 8, 33}) {
    const std::vector<uint8_t> src =
        RandomBlocks(c.type, nblocks, 1234u + static_cast<uint32_t>(c.type) * 31u + nblocks);
    std::vector<float> out(static_cast<size_t>(B) * nblocks, -12345.f);
    ASSERT_TRUE(
        DequantizeRow(c.type, src.data(), src.size(), int64_t{B} * nblocks, out.data()).ok());
    for (int blk = 0; blk < nblocks; ++blk) {
      for (int e = 0; e < B; ++e) {
        const Ref r = c.ref(src.data() + static_cast<size_t>(blk) * ts, e);
        const float got = out[static_cast<size_t>(blk) * B + e];
        // float rounding of d*sc, *q and -m: at most a few ulps of the largest term.
        EXPECT_NEAR(got, r.value, 4.0 * std::ldexp(r.mag, -24) + 1e-45)
            << GgmlTypeName(c.type) << " block " << blk << " element " << e;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllBlockTypes, DequantBlockTest,
    ::testing::Values(BlockCase{GgmlType::kQ4_0, RefQ4_0}, BlockCase{GgmlType::kQ4_1, RefQ4_1},
                      BlockCase{GgmlType::kQ5_0, RefQ5_0}, BlockCase{GgmlType::kQ5_1, RefQ5_1},
                      BlockCase{GgmlType::kQ8_0, RefQ8_0}, BlockCase{GgmlType::kQ4_K, RefQ4_K},
                      BlockCase{GgmlType::kQ5_K, RefQ5_K}, BlockCase{GgmlType::kQ6_K, RefQ6_K}),
    [](const ::testing::TestParamInfo<BlockCase>& info) {
      return std::string(GgmlTypeName(info.param.type));
    });

// Q4_0 and Q8_0 products of a small integer and an f16 are exact in f32.
TEST(DequantTest, Q4_0AndQ8_0AreExact) {
  for (GgmlType t : {GgmlType::kQ4_0, GgmlType::kQ8_0}) {
    const std::vector<uint8_t> src = RandomBlocks(t, 9, 77);
    std::vector<float> out(9 * 32);
    ASSERT_TRUE(DequantizeRow(t, src.data(), src.size(), 9 * 32, out.data()).ok());
    for (int i = 0; i < 9 * 32; ++i) {
      const Ref r = t == GgmlType::kQ4_0 ? RefQ4_0(src.data() + (i / 32) * 18, i % 32)
                                         : RefQ8_0(src.data() + (i / 32) * 34, i % 32);
      EXPECT_EQ(static_cast<double>(out[i]), r.value) << i;
    }
  }
}

// A hand-made Q4_1 block: d = 0.5 (0x3800), m = -1 (0xBC00), qs[j] = j | (15-j) << 4.
TEST(DequantTest, Q4_1HandBlock) {
  uint8_t b[20];
  PutHalf(b, 0x3800);
  PutHalf(b + 2, 0xBC00);
  for (int j = 0; j < 16; ++j) b[4 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[32];
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ4_1, b, sizeof(b), 32, y).ok());
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.5f * j - 1.0f);
    EXPECT_EQ(y[j + 16], 0.5f * (15 - j) - 1.0f);
  }
}

TEST(DequantTest, F32F16Bf16Rows) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> bits(0, 0xffff);
  for (int n : {1, 7, 8, 1023, 1025}) {
    std::vector<uint8_t> h(2 * n);
    for (auto& x : h) x = static_cast<uint8_t>(bits(rng) & 0xff);
    std::vector<float> f16(n), bf16(n);
    ASSERT_TRUE(DequantizeRow(GgmlType::kF16, h.data(), h.size(), n, f16.data()).ok());
    ASSERT_TRUE(DequantizeRow(GgmlType::kBF16, h.data(), h.size(), n, bf16.data()).ok());
    for (int i = 0; i < n; ++i) {
      const uint16_t u = static_cast<uint16_t>(h[2 * i] | (h[2 * i + 1] << 8));
      const double want = HalfValue(u);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(f16[i]));
      } else {
        EXPECT_EQ(static_cast<double>(f16[i]), want);
      }
      // bf16: sign, 8-bit exponent (bias 127), 7-bit mantissa.
      const int e = (u >> 7) & 255, m = u & 127, s = (u >> 15) ? -1 : 1;
      if (e == 255) {
        if (m == 0)
          EXPECT_EQ(bf16[i], s * std::numeric_limits<float>::infinity());
        else
          EXPECT_TRUE(std::isnan(bf16[i]));
      } else {
        const double bwant =
            e == 0 ? s * std::ldexp(m / 128.0, -126) : s * std::ldexp(1.0 + m / 128.0, e - 127);
        EXPECT_EQ(static_cast<double>(bf16[i]), bwant);
      }
    }
    std::vector<float> f(n), g(n);
    for (int i = 0; i < n; ++i) f[i] = static_cast<float>(i) * 0.37f - 3.f;
    ASSERT_TRUE(DequantizeRow(GgmlType::kF32, reinterpret_cast<const uint8_t*>(f.data()), 4 * n, n,
                              g.data())
                    .ok());
    EXPECT_EQ(f, g);
  }
}

TEST(Float16Test, AllHalfPatternsDecodeExactly) {
  for (uint32_t u = 0; u < 65536; ++u) {
    const double want = HalfValue(static_cast<uint16_t>(u));
    const float got = runtime::Fp16ToFp32(static_cast<uint16_t>(u));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << u;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << u;
      // Round trip back to the same bits (signed zeros included).
      ASSERT_EQ(runtime::Fp32ToFp16(got), u) << u;
    }
  }
}

// Fp32ToFp16 picks the nearest f16 (ties to even mantissa) among all finite halves; values
// at or above 65520 round to infinity.
TEST(Float16Test, Fp32ToFp16RoundsToNearestEven) {
  std::vector<std::pair<double, uint16_t>> halves;  // non-negative finite halves, sorted
  for (uint16_t u = 0; u < 0x7c00; ++u) halves.push_back({HalfValue(u), u});
  std::mt19937 rng(9);
  std::uniform_real_distribution<double> expo(-26.0, 16.5);
  std::vector<float> xs;
  for (int i = 0; i < 20000; ++i) xs.push_back(static_cast<float>(std::exp2(expo(rng))));
  // Exact midpoints between neighbours (ties) and the overflow boundary.
  for (size_t k = 0; k + 1 < halves.size(); k += 97) {
    xs.push_back(static_cast<float>((halves[k].first + halves[k + 1].first) / 2));
  }
  xs.push_back(65504.f);
  xs.push_back(65519.f);
  xs.push_back(65520.f);
  xs.push_back(1e9f);
  for (float x : xs) {
    for (float sx : {x, -x}) {
      const double a = std::abs(static_cast<double>(sx));
      uint16_t want;
      if (a >= 65520.0) {
        want = 0x7c00;
      } else {
        auto it = std::lower_bound(halves.begin(), halves.end(), std::make_pair(a, uint16_t{0}));
        if (it == halves.end()) --it;
        auto lo = it == halves.begin() ? it : it - 1;
        const double dlo = a - lo->first, dhi = it->first - a;
        if (it->first == a)
          want = it->second;
        else if (dlo < dhi)
          want = lo->second;
        else if (dhi < dlo)
          want = it->second;
        else
          want = (lo->second & 1) == 0 ? lo->second : it->second;
      }
      if (sx < 0) want |= 0x8000;
      ASSERT_EQ(runtime::Fp32ToFp16(sx), want) << sx;
    }
  }
  EXPECT_TRUE(std::isnan(runtime::Fp16ToFp32(runtime::Fp32ToFp16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(runtime::Fp32ToFp16(std::numeric_limits<float>::infinity()), 0x7c00);
}

// Fp32ToBf16: nearest bf16, ties to even, computed here from the float64 distance.
TEST(Float16Test, Fp32ToBf16RoundsToNearestEven) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits(0, 0xffffffffu);
  std::vector<uint32_t> xs;
  for (int i = 0; i < 50000; ++i) xs.push_back(bits(rng));
  xs.push_back(0x3f808000u);  // tie between 0x3f80 and 0x3f81 -> even 0x3f80
  xs.push_back(0x3f818000u);  // tie between 0x3f81 and 0x3f82 -> even 0x3f82
  xs.push_back(0x7f7fffffu);  // FLT_MAX rounds up to inf
  for (uint32_t u : xs) {
    const float x = runtime::BitsToFloat(u);
    const uint16_t got = runtime::Fp32ToBf16(x);
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(runtime::Bf16ToFp32(got)));
      continue;
    }
    if (std::isinf(x)) {
      EXPECT_EQ(got, static_cast<uint16_t>(u >> 16));
      continue;
    }
    const uint16_t lo = static_cast<uint16_t>(u >> 16);
    const uint16_t hi = static_cast<uint16_t>(lo + 1);
    const double dx = x;
    const double vlo = runtime::Bf16ToFp32(lo);
    // The upper neighbour is computed in double so that it may exceed FLT_MAX (-> inf).
    const int biased_exp = std::max(static_cast<int>((u >> 23) & 255), 1);
    const double step = std::ldexp(1.0, biased_exp - 127 - 7);
    const double vhi = vlo + (dx < 0 ? -step : step);
    const double dlo = std::abs(dx - vlo), dhi = std::abs(vhi - dx);
    uint16_t want = dlo < dhi ? lo : (dhi < dlo ? hi : ((lo & 1) == 0 ? lo : hi));
    ASSERT_EQ(got, want) << std::hex << u;
  }
}

TEST(DequantTest, TypeTablesMatchSpec) {
  // docs/formats.md §2 table: (id, block elements, bytes).
  const struct {
    uint32_t id;
    int64_t blk, bytes;
    const char* name;
  } kSpec[] = {{0, 1, 4, "F32"},       {1, 1, 2, "F16"},       {2, 32, 18, "Q4_0"},
               {3, 32, 20, "Q4_1"},    {6, 32, 22, "Q5_0"},    {7, 32, 24, "Q5_1"},
               {8, 32, 34, "Q8_0"},    {10, 256, 84, "Q2_K"},  {11, 256, 110, "Q3_K"},
               {12, 256, 144, "Q4_K"}, {13, 256, 176, "Q5_K"}, {14, 256, 210, "Q6_K"},
               {15, 256, 292, "Q8_K"}, {30, 1, 2, "BF16"}};
  for (const auto& s : kSpec) {
    EXPECT_TRUE(IsKnownGgmlType(s.id));
    const GgmlType t = static_cast<GgmlType>(s.id);
    EXPECT_EQ(GgmlBlockSize(t), s.blk) << s.name;
    EXPECT_EQ(GgmlTypeSize(t), s.bytes) << s.name;
    EXPECT_EQ(GgmlTypeName(t), s.name);
  }
  for (uint32_t id : {4u, 5u, 9u, 16u, 29u, 31u, 99u}) EXPECT_FALSE(IsKnownGgmlType(id)) << id;
  EXPECT_EQ(GgmlTypeName(static_cast<GgmlType>(99)), "UNKNOWN");
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ4_1, 576), 360u);  // docs/formats.md §3: 360 B rows
  EXPECT_EQ(*GgmlRowBytes(GgmlType::kQ8_0, 576), 612u);
  EXPECT_EQ(GgmlRowBytes(GgmlType::kQ4_1, 48).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GgmlRowBytes(static_cast<GgmlType>(99), 32).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DequantTest, BadArgumentsReturnStatus) {
  std::vector<uint8_t> src(2 * 292, 0);
  std::vector<float> dst(512);
  // Not a whole number of blocks.
  EXPECT_EQ(DequantizeRow(GgmlType::kQ4_1, src.data(), src.size(), 33, dst.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRow(GgmlType::kQ4_1, src.data(), src.size(), -32, dst.data()).code(),
            absl::StatusCode::kInvalidArgument);
  // Source too short: 2 Q4_1 blocks need 40 bytes.
  EXPECT_EQ(DequantizeRow(GgmlType::kQ4_1, src.data(), 39, 64, dst.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DequantizeRow(GgmlType::kQ4_1, src.data(), 40, 64, dst.data()).ok());
  for (GgmlType t : {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ8_K}) {
    EXPECT_FALSE(CanDequantize(t));
    const absl::Status s = DequantizeRow(t, src.data(), src.size(), 256, dst.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(s.message().find(GgmlTypeName(t)), absl::string_view::npos) << s;
  }
  EXPECT_EQ(DequantizeRow(static_cast<GgmlType>(99), src.data(), src.size(), 1, dst.data()).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(DequantizeRow(GgmlType::kQ4_1, nullptr, 0, 0, nullptr).ok());
}

}  // namespace
}  // namespace lspo::model
