// Internal to the CPU kernels of lsp/ (project_kernel.cc, apply_kernel.cc): a 16 x 16 fp32
// transpose in AVX-512 registers. Callers check HasAvx512() at run time and fall back to
// scalar loops otherwise (or off x86-64 GCC, where LSPO_SIMD_TRANSPOSE16 is 0).
#ifndef LSPO_LSP_SIMD_TRANSPOSE_H_
#define LSPO_LSP_SIMD_TRANSPOSE_H_

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define LSPO_SIMD_TRANSPOSE16 1
#else
#define LSPO_SIMD_TRANSPOSE16 0
#endif

namespace lspo::lsp::simd {

#if LSPO_SIMD_TRANSPOSE16
// True when the running CPU has AVX-512F (cached after the first call).
inline bool HasAvx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

// In-register transpose of the 16 x 16 block v[row][col] -> v[col][row]: pairs of rows
// interleaved (unpack ps), then quads (unpack pd), then 128-bit lanes exchanged (shuffle f32x4).
__attribute__((target("avx512f"))) inline void Transpose16(__m512 v[16]) {
  __m512 a[16];
  for (int k = 0; k < 8; ++k) {
    a[2 * k] = _mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]);
    a[2 * k + 1] = _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]);
  }
  __m512 b[16];  // b[4q + j], 128-bit lane l: column 4l + j of rows 4q .. 4q + 3
  for (int q = 0; q < 4; ++q) {
    const __m512d a0 = _mm512_castps_pd(a[4 * q]), a1 = _mm512_castps_pd(a[4 * q + 1]);
    const __m512d a2 = _mm512_castps_pd(a[4 * q + 2]), a3 = _mm512_castps_pd(a[4 * q + 3]);
    b[4 * q + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
    b[4 * q + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
    b[4 * q + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
    b[4 * q + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
  }
  for (int j = 0; j < 4; ++j) {
    const __m512 lo01 = _mm512_shuffle_f32x4(b[j], b[4 + j], 0x44);       // x0 x1 y0 y1
    const __m512 lo23 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0x44);  // z0 z1 w0 w1
    const __m512 hi01 = _mm512_shuffle_f32x4(b[j], b[4 + j], 0xEE);       // x2 x3 y2 y3
    const __m512 hi23 = _mm512_shuffle_f32x4(b[8 + j], b[12 + j], 0xEE);  // z2 z3 w2 w3
    v[j] = _mm512_shuffle_f32x4(lo01, lo23, 0x88);                        // column j
    v[4 + j] = _mm512_shuffle_f32x4(lo01, lo23, 0xDD);                    // column 4 + j
    v[8 + j] = _mm512_shuffle_f32x4(hi01, hi23, 0x88);                    // column 8 + j
    v[12 + j] = _mm512_shuffle_f32x4(hi01, hi23, 0xDD);                   // column 12 + j
  }
}

// dst[k * dst_stride + t] = src[t * src_stride + k] for t, k < 16 (fp32, any alignment).
__attribute__((target("avx512f"))) inline void TransposeBlock16(const float* src,
                                                                int64_t src_stride, float* dst,
                                                                int64_t dst_stride) {
  __m512 v[16];
  for (int t = 0; t < 16; ++t) v[t] = _mm512_loadu_ps(src + t * src_stride);
  Transpose16(v);
  for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + k * dst_stride, v[k]);
}
#endif

}  // namespace lspo::lsp::simd

#endif  // LSPO_LSP_SIMD_TRANSPOSE_H_
