// Rounding of fp32 values into 16-bit weights for the fused apply (lsp/apply_kernel.h on the
// CPU, lsp/cuda/sparse_kernels.cu on CUDA): the rounding modes, a counter-based noise source
// and stochastic rounding. Header-only, torch-free, host and device (nvcc) alike, so that both
// kernels draw the same noise for the same (seed, element) and round it the same way.
//
// Stochastic rounding (Forsythe 1959; Gupta et al. 2015, "Deep Learning with Limited Numerical
// Precision", eq. 5): x between the neighbours lo < x < hi of the 16-bit format rounds to hi
// with probability (x - lo) / (hi - lo), else to lo, so that E[round(x)] = x: updates smaller
// than half a ulp survive in expectation without a per-weight residual.
//
// Thread-safety: pure functions.
#ifndef LSPO_LSP_ROUNDING_H_
#define LSPO_LSP_ROUNDING_H_

#include <cstdint>

#if defined(__CUDACC__)
#define LSPO_HD __host__ __device__ __forceinline__
#else
#define LSPO_HD __attribute__((always_inline)) inline
#endif

namespace lspo::lsp {

// How an fp32 sum is stored into a 16-bit weight (fp32 / fp64 weights take the sum as is).
//   kNearest:     round to nearest, ties to even (IEEE 754 default).
//   kCompensated: round to nearest and keep what the rounding dropped in a residual C of W's
//                 dtype, added back before the next step (Kahan 1965; one residual per weight).
//   kStochastic:  stochastic rounding with the noise below (no residual).
enum class Rounding : int { kNearest = 0, kCompensated = 1, kStochastic = 2 };

// 32 noise bits for element `index` of an apply seeded with `seed`: a bijection of the index
// for a fixed seed, so neighbouring elements get unrelated bits. The seed folds into two words
// (its low half offsets the index, its high half is mixed in before the finaliser); the mixer
// is MurmurHash3's 32-bit finaliser fmix32 (Appleby 2011, constants 0x85ebca6b, 0xc2b2ae35),
// and the index is spread by the golden-ratio constant 0x9e3779b1 (Knuth, TAOCP 3, 6.4).
// 32-bit integer arithmetic only, so the CPU loop vectorises it (pmulld) and CUDA is cheap.
// Elements of one matrix are numbered i * n + j below 2^32 (m n < 2^32 for every supported
// shape; a larger matrix repeats the noise pattern, which is still unbiased per element).
LSPO_HD uint32_t RoundingNoise(uint64_t seed, uint32_t index) {
  const uint32_t lo = static_cast<uint32_t>(seed);
  const uint32_t hi = static_cast<uint32_t>(seed >> 32);
  uint32_t h = index * 0x9e3779b1u + lo;
  h ^= hi * 0x85ebca6bu;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

// Stochastic rounding of the fp32 value with bits `x` to bf16 bits, with 16 of the noise bits:
// bf16 keeps the high 16 bits of the fp32 pattern, so adding a uniform 16-bit integer to the
// dropped half and truncating rounds the magnitude up with probability (dropped / 2^16), which
// is (|x| - |lo|) / ulp: exactly the stochastic rule for normal and subnormal values alike.
// Non-finite x keeps its class (NaN stays a quiet NaN, inf stays inf); a finite x that would
// round up past the largest bf16 is truncated instead (stays finite).
LSPO_HD uint16_t Bf16Stochastic(uint32_t x, uint32_t noise) {
  // Selects only (no branches), so that a loop of these vectorises.
  const uint32_t up = x + (noise & 0xffffu);
  const bool special = (x & 0x7f800000u) == 0x7f800000u;    // inf or NaN
  const bool overflow = (up & 0x7f800000u) == 0x7f800000u;  // finite, rounded past the largest
  const uint32_t kept = (x >> 16) | (special && (x & 0x007fffffu) != 0 ? 0x40u : 0u);
  return static_cast<uint16_t>(special || overflow ? kept : up >> 16);
}

// The fp16 neighbour of the finite fp16 value with bits h one step towards +inf (up) or -inf.
// -0 and +0 both step to the smallest subnormal of the direction's sign.
LSPO_HD uint16_t Fp16Neighbour(uint16_t h, bool up) {
  const bool negative = (h & 0x8000u) != 0;
  if ((h & 0x7fffu) == 0) return up ? uint16_t{0x0001u} : uint16_t{0x8001u};
  // Magnitude grows when moving away from zero: up for positive values, down for negative.
  return (up != negative) ? static_cast<uint16_t>(h + 1u) : static_cast<uint16_t>(h - 1u);
}

// The uniform number in [0, 1) of the top 24 noise bits (exact in fp32).
LSPO_HD float NoiseUniform(uint32_t noise) {
  return static_cast<float>(noise >> 8) * (1.0f / 16777216.0f);
}

}  // namespace lspo::lsp

#endif  // LSPO_LSP_ROUNDING_H_
