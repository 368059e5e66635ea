// IEEE-754 binary16 (f16) and bfloat16 (bf16) <-> binary32 (f32) conversions, scalar and
// exact. Header-only so that torch-free readers/writers (GGUF, safetensors) share them.
//
// Sources: IEEE 754-2008 §3.6 (binary16 layout: 1 sign, 5 exponent (bias 15), 10 mantissa);
// bf16 = the high 16 bits of an f32 (docs/formats.md §2: "f32 bits = b<<16").
// Thread-safety: pure functions.
#ifndef LSPO_RUNTIME_FLOAT16_H_
#define LSPO_RUNTIME_FLOAT16_H_

#include <cmath>
#include <cstdint>
#include <cstring>

namespace lspo::runtime {

// The bit helpers below are always_inline so that they also inline into the per-ISA clones of
// vectorised kernels (lsp/adam.cc: GCC does not inline plain functions across target arches).
#define LSPO_FLOAT16_INLINE __attribute__((always_inline)) inline

// Reinterprets the bits of a float / uint32 (no conversion).
LSPO_FLOAT16_INLINE uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
LSPO_FLOAT16_INLINE float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// f16 bits -> f32, exact for every input (subnormals normalised, inf kept, NaN payload kept).
inline float Fp16ToFp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return BitsToFloat(sign);  // +-0
    // Subnormal: value = mant * 2^-24. Normalise so that bit 10 is the implicit 1.
    uint32_t e = 113;  // f32 biased exponent of 2^-14, decremented once per shift.
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    mant &= 0x3ffu;
    return BitsToFloat(sign | (e << 23) | (mant << 13));
  }
  if (exp == 31) return BitsToFloat(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  return BitsToFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// f32 -> f16 bits, round to nearest, ties to even; overflow -> +-inf; NaN -> quiet NaN.
inline uint16_t Fp32ToFp16(float f) {
  uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((x >> 13) & 0x3ffu);
  if (x >= 0x47800000u) return sign | 0x7c00u;  // >= 65536 (and inf): rounds to inf
  if (x < 0x38800000u) {
    // Below 2^-14: half subnormal (or zero) = round(|f| / 2^-24); the scaling is exact and
    // std::nearbyint rounds ties to even in the default rounding mode.
    const float scaled = BitsToFloat(x) * 16777216.0f;
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t half_exp = (x >> 23) - 112u;
  uint32_t h = (half_exp << 10) | ((x & 0x7fffffu) >> 13);
  const uint32_t rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may reach inf: correct
  return sign | static_cast<uint16_t>(h);
}

// bf16 bits -> f32 (exact: f32 bits = b << 16).
LSPO_FLOAT16_INLINE float Bf16ToFp32(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

// f32 -> bf16 bits, round to nearest, ties to even; NaN -> quiet NaN with the same sign.
LSPO_FLOAT16_INLINE uint16_t Fp32ToBf16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  const uint32_t rounded = x + 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

// Branch-free twins of Fp16ToFp32 / Fp32ToFp16 with the same bits for every input (checked
// exhaustively for f16 -> f32 and on every f32 exponent for f32 -> f16 in
// tests/lsp/apply_kernel_test.cc): only selects, shifts, integer adds and one fp32 add or
// multiply, so that a loop of them vectorises (the fused apply's fp16 weights).
// f16 -> f32: exponent and mantissa shifted into place and rebiased (15 -> 127), with 112 more
// for an all-ones exponent (inf / NaN, payload kept); subnormals are em * 2^-24, exact in f32.
LSPO_FLOAT16_INLINE float Fp16ToFp32Branchless(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const uint32_t normal = (em << 13) + (112u << 23) + (em >= 0x7c00u ? (112u << 23) : 0u);
  const float sub = static_cast<float>(static_cast<int32_t>(em)) * 5.9604644775390625e-8f;
  return BitsToFloat(sign | (em < 0x400u ? FloatBits(sub) : normal));
}
// f32 -> f16, round to nearest, ties to even: normal values rebias (127 -> 15) and round the 13
// dropped bits (a carry into the exponent, up to inf, is correct); below 2^-14, |f| + 0.5
// rounds |f| to a multiple of 2^-24 (the ulp of 0.5) in the FPU's default rounding mode and the
// sum's low bits are that multiple; inf and overflow give inf, NaN a quiet NaN with its payload.
LSPO_FLOAT16_INLINE uint16_t Fp32ToFp16Branchless(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  const uint32_t normal = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t sub = FloatBits(BitsToFloat(a) + 0.5f) - 0x3f000000u;
  const uint32_t special = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : 0x7c00u;
  uint32_t h = a < 0x38800000u ? sub : normal;
  h = a >= 0x47800000u ? special : h;
  return static_cast<uint16_t>(sign | h);
}

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_FLOAT16_H_
