// The fused apply on the CPU. See apply_kernel.h for the contract.
#include "lsp/apply_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "lsp/rounding.h"
#include "lsp/simd_transpose.h"
#include "runtime/cpu_clones.h"
#include "runtime/float16.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace lspo::lsp {
namespace {

// Rows per TBB task: at the main job's widths (576-1536 columns) ~16-48 KiB of W per task.
constexpr int64_t kRowGrain = 8;

#define LSPO_APPLY_INLINE __attribute__((always_inline)) inline

// Loads of one storage type into fp32 and nearest rounding back (always inlined, so that they
// vectorise inside the per-ISA clones).
struct F32 {
  using T = float;
  static LSPO_APPLY_INLINE float Load(const T* p, int64_t c) { return p[c]; }
};
struct Bf16 {
  using T = uint16_t;
  static LSPO_APPLY_INLINE float Load(const T* p, int64_t c) { return runtime::Bf16ToFp32(p[c]); }
  static LSPO_APPLY_INLINE uint16_t Nearest(float f) { return runtime::Fp32ToBf16(f); }
};
struct F16 {
  using T = uint16_t;
  static LSPO_APPLY_INLINE float Load(const T* p, int64_t c) {
    return runtime::Fp16ToFp32Branchless(p[c]);
  }
  static LSPO_APPLY_INLINE uint16_t Nearest(float f) { return runtime::Fp32ToFp16Branchless(f); }
};

// Stochastic rounding of fp32 t to fp16 bits (lsp/rounding.h): the nearest value and its
// neighbour on t's other side bracket t; the upper one is taken with probability
// (t - lo) / (hi - lo). Exact values, non-finite t and overflow keep the nearest rounding.
LSPO_APPLY_INLINE uint16_t Fp16Stochastic(float t, uint32_t noise) {
  const uint16_t near = runtime::Fp32ToFp16Branchless(t);
  const float nf = runtime::Fp16ToFp32Branchless(near);
  const uint16_t other = Fp16Neighbour(near, nf < t);
  const float of = runtime::Fp16ToFp32Branchless(other);
  const bool near_is_lo = nf < of;
  const float lo = near_is_lo ? nf : of;
  const float hi = near_is_lo ? of : nf;
  const bool take_hi = NoiseUniform(noise) < (t - lo) / (hi - lo);
  // Finite t strictly between two finite neighbours; anything else keeps the nearest.
  const bool bracketed = nf != t && std::isfinite(t) && std::isfinite(nf) && std::isfinite(of);
  return bracketed && take_hi == near_is_lo ? other : near;
}

// Columns per chunk: the partial sums of a chunk stay in vector registers (4 x 16 fp32 with
// AVX-512) while the row's r rows of E stream through, then update W in place.
constexpr int64_t kChunk = 64;

// Updates columns [c0, c0 + len) of row i from their sums acc (len <= kChunk; kLen = len when
// fixed at compile time, 0 otherwise).
template <typename S, Rounding kRound, int64_t kLen>
LSPO_APPLY_INLINE void UpdateChunk(const FusedApplyArgs& a, int64_t i, int64_t c0, int64_t len,
                                   const float* __restrict acc) {
  using T = typename S::T;
  const int64_t count = kLen > 0 ? kLen : len;
  const float decay = a.decay;
  T* __restrict w = static_cast<T*>(a.w) + i * a.n + c0;
  if constexpr (kRound == Rounding::kCompensated) {
    T* __restrict cres = static_cast<T*>(a.c) + i * a.n + c0;
    for (int64_t c = 0; c < count; ++c) {
      const float kept = (S::Load(w, c) + S::Load(cres, c)) * decay;
      const float t = kept + acc[c];
      const uint16_t wr = S::Nearest(t);
      w[c] = wr;
      cres[c] = S::Nearest(t - S::Load(&wr, 0));
    }
  } else if constexpr (std::is_same_v<S, F32>) {
    for (int64_t c = 0; c < count; ++c) w[c] = w[c] * decay + acc[c];
  } else if constexpr (kRound == Rounding::kStochastic) {
    const uint32_t base = static_cast<uint32_t>(i * a.n + c0);
    for (int64_t c = 0; c < count; ++c) {
      const float t = S::Load(w, c) * decay + acc[c];
      const uint32_t noise = RoundingNoise(a.seed, base + static_cast<uint32_t>(c));
      if constexpr (std::is_same_v<S, Bf16>) {
        w[c] = Bf16Stochastic(runtime::FloatBits(t), noise);
      } else {
        w[c] = Fp16Stochastic(t, noise);
      }
    }
  } else {
    for (int64_t c = 0; c < count; ++c) w[c] = S::Nearest(S::Load(w, c) * decay + acc[c]);
  }
}

// acc[0, len) = sum_k val[k] * E[idx[k], c0 + (0, len)], k ascending (the summation order of
// lsp::GatherRows on the CPU, so that fp32 W gets the bits of W + P E).
template <int64_t kLen>
LSPO_APPLY_INLINE void SumChunk(const FusedApplyArgs& a, const int64_t* idx, const float* val,
                                int64_t c0, int64_t len, float* __restrict acc) {
  const int64_t count = kLen > 0 ? kLen : len;
  const float* __restrict e0 = a.e + idx[0] * a.n + c0;
  const float v0 = val[0];
  for (int64_t c = 0; c < count; ++c) acc[c] = v0 * e0[c];
  for (int64_t k = 1; k < a.r; ++k) {
    const float* __restrict ek = a.e + idx[k] * a.n + c0;
    const float v = val[k];
    for (int64_t c = 0; c < count; ++c) acc[c] += v * ek[c];
  }
}

// Rows [i0, i1) of the apply.
template <typename S, Rounding kRound>
LSPO_APPLY_INLINE void RowsBody(const FusedApplyArgs& a, int64_t i0, int64_t i1) {
  alignas(64) float acc[kChunk];
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t* idx = a.p_index + i * a.r;
    const float* val = a.p_value + i * a.r;
    int64_t c0 = 0;
    for (; c0 + kChunk <= a.n; c0 += kChunk) {
      SumChunk<kChunk>(a, idx, val, c0, kChunk, acc);
      UpdateChunk<S, kRound, kChunk>(a, i, c0, kChunk, acc);
    }
    if (c0 < a.n) {
      SumChunk<0>(a, idx, val, c0, a.n - c0, acc);
      UpdateChunk<S, kRound, 0>(a, i, c0, a.n - c0, acc);
    }
  }
}

// One function per (storage, rounding) so that GCC clones each for AVX-512, AVX2 and baseline
// x86-64 and picks one at load time, as lsp/adam.cc does.

#define LSPO_DEFINE_APPLY_ROWS(NAME, STORAGE, ROUND)                           \
  LSPO_CPU_CLONES void NAME(const FusedApplyArgs& a, int64_t i0, int64_t i1) { \
    RowsBody<STORAGE, ROUND>(a, i0, i1);                                       \
  }
LSPO_DEFINE_APPLY_ROWS(RowsF32, F32, Rounding::kNearest)
LSPO_DEFINE_APPLY_ROWS(RowsBf16Nearest, Bf16, Rounding::kNearest)
LSPO_DEFINE_APPLY_ROWS(RowsBf16Compensated, Bf16, Rounding::kCompensated)
LSPO_DEFINE_APPLY_ROWS(RowsBf16Stochastic, Bf16, Rounding::kStochastic)
LSPO_DEFINE_APPLY_ROWS(RowsF16Nearest, F16, Rounding::kNearest)
LSPO_DEFINE_APPLY_ROWS(RowsF16Compensated, F16, Rounding::kCompensated)
LSPO_DEFINE_APPLY_ROWS(RowsF16Stochastic, F16, Rounding::kStochastic)
#undef LSPO_DEFINE_APPLY_ROWS

using RowsFn = void (*)(const FusedApplyArgs&, int64_t, int64_t);

RowsFn PickRows(WeightDtype dtype, Rounding rounding) {
  if (dtype == WeightDtype::kFloat32) return &RowsF32;
  const bool bf16 = dtype == WeightDtype::kBFloat16;
  switch (rounding) {
    case Rounding::kCompensated:
      return bf16 ? &RowsBf16Compensated : &RowsF16Compensated;
    case Rounding::kStochastic:
      return bf16 ? &RowsBf16Stochastic : &RowsF16Stochastic;
    case Rounding::kNearest:
      break;
  }
  return bf16 ? &RowsBf16Nearest : &RowsF16Nearest;
}

}  // namespace

absl::Status FusedApplyCpu(const FusedApplyArgs& a) {
  if (a.w == nullptr || a.e == nullptr || a.p_index == nullptr || a.p_value == nullptr) {
    return absl::InvalidArgumentError(
        "FusedApplyCpu: W, E, P's index and P's value must all be given");
  }
  if (a.m <= 0 || a.n <= 0 || a.d <= 0 || a.r < 1 || a.r > a.d) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FusedApplyCpu: sizes m=%d n=%d d=%d r=%d; expected m, n, d > 0 and 1 <= r <= d", a.m, a.n,
        a.d, a.r));
  }
  if (!std::isfinite(a.decay) || a.decay < 0.0f) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FusedApplyCpu: decay %g; expected a finite factor >= 0 (1 - lr * weight_decay)", a.decay));
  }
  if (a.rounding == Rounding::kCompensated &&
      (a.c == nullptr || a.dtype == WeightDtype::kFloat32)) {
    return absl::InvalidArgumentError(
        "FusedApplyCpu: compensated rounding needs 16-bit W and its residual C");
  }
  const RowsFn rows = PickRows(a.dtype, a.rounding);
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, a.m, kRowGrain),
      [&](const tbb::blocked_range<int64_t>& range) { rows(a, range.begin(), range.end()); });
  return absl::OkStatus();
}

namespace {

constexpr int64_t kColTile = 16;  // columns of E per tile of StepTimesQtCpu

// out[0, len) = v[0] * rows[idx[0]][0, len) + ... + v[r-1] * rows[idx[r-1]][0, len), in that
// order, each product rounded before its add (the compiler vectorises the unit-stride loops).
LSPO_CPU_CLONES void CombineDtRows(const float* __restrict dt, int64_t stride,
                                   const int64_t* __restrict idx, const float* __restrict v,
                                   int64_t r, int64_t len, float* __restrict out) {
  const float* __restrict row = dt + idx[0] * stride;
  const float v0 = v[0];
  for (int64_t a = 0; a < len; ++a) out[a] = v0 * row[a];
  for (int64_t k = 1; k < r; ++k) {
    const float* __restrict rk = dt + idx[k] * stride;
    const float vk = v[k];
    for (int64_t a = 0; a < len; ++a) out[a] += vk * rk[a];
  }
}

// Columns [j0, j0 + jb) of E from their rows of E^T in et (jb, ld): by 16 x 16 register
// transposes for full blocks, scalar otherwise.
void StoreColumns(const float* et, int64_t ld, int64_t j0, int64_t jb, int64_t d_p, int64_t n,
                  float* e) {
  int64_t a0 = 0;
#if LSPO_SIMD_TRANSPOSE16
  if (jb == kColTile && simd::HasAvx512()) {
    for (; a0 + 16 <= d_p; a0 += 16) simd::TransposeBlock16(et + a0, ld, e + a0 * n + j0, n);
  }
#endif
  for (int64_t a = a0; a < d_p; ++a) {
    for (int64_t jj = 0; jj < jb; ++jj) e[a * n + j0 + jj] = et[jj * ld + a];
  }
}

}  // namespace

absl::Status StepTimesQtCpu(const float* dt, int64_t d_p, int64_t d_q, const int64_t* q_index,
                            const float* q_value, int64_t n, int64_t r, float* e) {
  if (dt == nullptr || q_index == nullptr || q_value == nullptr || e == nullptr) {
    return absl::InvalidArgumentError("StepTimesQtCpu: D^T, Q's index and value, E must be given");
  }
  if (d_p <= 0 || d_q <= 0 || n <= 0 || r < 1 || r > d_q) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "StepTimesQtCpu: d_p=%d d_q=%d n=%d r=%d; expected positive sizes and 1 <= r <= d_q", d_p,
        d_q, n, r));
  }
  const int64_t tiles = (n + kColTile - 1) / kColTile;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, tiles, 4), [&](const tbb::blocked_range<int64_t>& range) {
        std::vector<float> et(static_cast<size_t>(kColTile * d_p));  // (16, d_p)
        for (int64_t tile = range.begin(); tile < range.end(); ++tile) {
          const int64_t j0 = tile * kColTile;
          const int64_t jb = std::min(kColTile, n - j0);
          for (int64_t jj = 0; jj < jb; ++jj) {
            const int64_t j = j0 + jj;
            CombineDtRows(dt, d_p, q_index + j * r, q_value + j * r, r, d_p, et.data() + jj * d_p);
          }
          StoreColumns(et.data(), d_p, j0, jb, d_p, n, e);
        }
      });
  return absl::OkStatus();
}

absl::Status RoundStochastic(const float* t, uint16_t* out, int64_t count, WeightDtype dtype,
                             uint64_t seed) {
  if (dtype == WeightDtype::kFloat32) {
    return absl::InvalidArgumentError("RoundStochastic: fp32 has nothing to round into");
  }
  if (count <= 0) return absl::OkStatus();
  if (t == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("RoundStochastic: null input or output");
  }
  const bool bf16 = dtype == WeightDtype::kBFloat16;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, count, 16384), [&](const tbb::blocked_range<int64_t>& range) {
        for (int64_t k = range.begin(); k < range.end(); ++k) {
          const uint32_t noise = RoundingNoise(seed, static_cast<uint32_t>(k));
          out[k] =
              bf16 ? Bf16Stochastic(runtime::FloatBits(t[k]), noise) : Fp16Stochastic(t[k], noise);
        }
      });
  return absl::OkStatus();
}

}  // namespace lspo::lsp
