// The token-tiled sparse projection on the CPU. See project_kernel.h for the contract.
#include "lsp/project_kernel.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "lsp/simd_transpose.h"
#include "runtime/cpu_clones.h"
#include "runtime/float16.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace lspo::lsp {
namespace {

constexpr int64_t kTile = 16;      // Tokens per tile: one AVX-512 vector of fp32.
constexpr int64_t kTileGrain = 2;  // Tiles per TBB task (32 tokens).

// A 64-byte-aligned fp32 buffer of `count` elements.
struct AlignedFree {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
using AlignedBuffer = std::unique_ptr<float[], AlignedFree>;
AlignedBuffer MakeBuffer(int64_t count) {
  return AlignedBuffer(static_cast<float*>(
      ::operator new[](static_cast<size_t>(count) * sizeof(float), std::align_val_t(64))));
}

// Element (token t, feature i) of X as fp32.
inline float LoadScalar(const ProjectArgs& a, int64_t t, int64_t i) {
  const int64_t k = t * a.rows + i;
  switch (a.dtype) {
    case WeightDtype::kBFloat16:
      return runtime::Bf16ToFp32(static_cast<const uint16_t*>(a.x)[k]);
    case WeightDtype::kFloat16:
      return runtime::Fp16ToFp32Branchless(static_cast<const uint16_t*>(a.x)[k]);
    case WeightDtype::kFloat32:
      break;
  }
  return static_cast<const float*>(a.x)[k];
}

// xt[i * 16 + t] = X[t0 + t, i] for features [i0, rows), tokens t < tb; zero for t >= tb.
void LoadTileScalar(const ProjectArgs& a, int64_t t0, int64_t tb, int64_t i0, float* xt) {
  for (int64_t i = i0; i < a.rows; ++i) {
    for (int64_t t = 0; t < kTile; ++t) xt[i * kTile + t] = t < tb ? LoadScalar(a, t0 + t, i) : 0.f;
  }
}

#if LSPO_SIMD_TRANSPOSE16
// 16 consecutive features [i, i + 16) of token t as fp32 (bf16: the bits shifted into the high
// half; fp16: the hardware conversion, exact).
__attribute__((target("avx512f"))) inline __m512 Load16(const ProjectArgs& a, int64_t t,
                                                        int64_t i) {
  const int64_t k = t * a.rows + i;
  switch (a.dtype) {
    case WeightDtype::kBFloat16: {
      const __m256i h = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(a.x) + k));
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    case WeightDtype::kFloat16: {
      const __m256i h = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(a.x) + k));
      return _mm512_cvtph_ps(h);
    }
    case WeightDtype::kFloat32:
      break;
  }
  return _mm512_loadu_ps(static_cast<const float*>(a.x) + k);
}

// A full tile (16 tokens) by 16 x 16 register transposes; the features past the last multiple
// of 16 by the scalar loop.
__attribute__((target("avx512f"))) void LoadTileAvx512(const ProjectArgs& a, int64_t t0,
                                                       float* xt) {
  int64_t i0 = 0;
  for (; i0 + 16 <= a.rows; i0 += 16) {
    __m512 v[16];
    for (int t = 0; t < 16; ++t) v[t] = Load16(a, t0 + t, i0);
    simd::Transpose16(v);
    for (int k = 0; k < 16; ++k) _mm512_store_ps(xt + (i0 + k) * kTile, v[k]);
  }
  LoadTileScalar(a, t0, kTile, i0, xt);
}

#endif

// The transposed tile of tokens [t0, t0 + tb) into xt (rows, 16).
void LoadTile(const ProjectArgs& a, int64_t t0, int64_t tb, float* xt) {
#if LSPO_SIMD_TRANSPOSE16
  if (tb == kTile && simd::HasAvx512()) {
    LoadTileAvx512(a, t0, xt);
    return;
  }
#endif
  LoadTileScalar(a, t0, tb, 0, xt);
}

// 16 fp32 lanes (GCC vector extension): one zmm in the x86-64-v4 clone, two ymm in v3, four
// xmm in the baseline. Written out because GCC does not vectorise the 16-lane loop itself
// (it cannot rule out that acc aliases P's values and keeps the lanes scalar).
typedef float Lanes __attribute__((vector_size(kTile * sizeof(float))));

// acc (d, 16) = the tile's (X P)^T: for each feature i ascending, each non-zero k of P's row i,
// acc[index[i, k], :] += value[i, k] * xt[i, :]. One vector multiply and add per non-zero.
// xt and acc are 64-byte aligned.
LSPO_CPU_CLONES void ScatterTile(const float* xt, int64_t rows, const ProjectTarget& p,
                                 float* acc) {
  Lanes* out = reinterpret_cast<Lanes*>(acc);
  const Lanes* x = reinterpret_cast<const Lanes*>(xt);
  const Lanes zero = {};
  for (int64_t c = 0; c < p.d; ++c) out[c] = zero;
  const int64_t r = p.r;
  for (int64_t i = 0; i < rows; ++i) {
    const Lanes xi = x[i];
    const int64_t* idx = p.index + i * r;
    const float* val = p.value + i * r;
    for (int64_t k = 0; k < r; ++k) out[idx[k]] = out[idx[k]] + val[k] * xi;
  }
}

}  // namespace

absl::Status ProjectTokensCpu(const ProjectArgs& a) {
  if (a.x == nullptr || a.targets == nullptr) {
    return absl::InvalidArgumentError("ProjectTokensCpu: X and the targets must be given");
  }
  if (a.n_tok <= 0 || a.rows <= 0 || a.n_targets <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("ProjectTokensCpu: n_tok=%d rows=%d targets=%d; expected all > 0", a.n_tok,
                        a.rows, a.n_targets));
  }
  int64_t d_max = 0;
  for (int64_t k = 0; k < a.n_targets; ++k) {
    const ProjectTarget& p = a.targets[k];
    if (p.index == nullptr || p.value == nullptr || p.out == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrFormat("ProjectTokensCpu: target %d lacks its index, value or output", k));
    }
    if (p.d <= 0 || p.r < 1 || p.r > p.d) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ProjectTokensCpu: target %d has d=%d r=%d; expected d > 0 and 1 <= r <= d", k, p.d,
          p.r));
    }
    d_max = std::max(d_max, p.d);
  }
  const int64_t tiles = (a.n_tok + kTile - 1) / kTile;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, tiles, kTileGrain),
      [&](const tbb::blocked_range<int64_t>& range) {
        const AlignedBuffer xt = MakeBuffer(a.rows * kTile);  // (rows, 16)
        const AlignedBuffer acc = MakeBuffer(d_max * kTile);  // (d, 16)
        for (int64_t tile = range.begin(); tile < range.end(); ++tile) {
          const int64_t t0 = tile * kTile;
          const int64_t tb = std::min(kTile, a.n_tok - t0);
          LoadTile(a, t0, tb, xt.get());
          for (int64_t k = 0; k < a.n_targets; ++k) {
            const ProjectTarget& p = a.targets[k];
            ScatterTile(xt.get(), a.rows, p, acc.get());
            if (tb == kTile) {  // a constant size: one vector move per row, not a call
              for (int64_t c = 0; c < p.d; ++c) {
                std::memcpy(p.out + c * a.n_tok + t0, acc.get() + c * kTile, kTile * sizeof(float));
              }
            } else {
              for (int64_t c = 0; c < p.d; ++c) {
                std::memcpy(p.out + c * a.n_tok + t0, acc.get() + c * kTile,
                            static_cast<size_t>(tb) * sizeof(float));
              }
            }
          }
        }
      });
  return absl::OkStatus();
}

}  // namespace lspo::lsp
