// The fused apply on the CPU: W <- round(decay (W + C) + P E) in one pass over W, for the
// worker's weights after each optimizer step (docs/method.md, "Apply"). Torch-free (TBB only);
// lsp::ApplyStepFused (lsp/projector.h) forms E = D Q^T and calls it for CPU tensors, and the
// CUDA kernel lsp::cuda::ApplyFused does the same on the device.
//
// Legend (lsp/adam.h): m rows (out features) and n columns (in features) of W; d the subspace
// dimension of P; r non-zeros per row of P.
//
// Per element (i, j), in fp32 with the operations in this order (no fused multiply-add: the
// file is compiled with -ffp-contract=off so that every CPU clone gives the same bits):
//   a = sum_{k < r} p_value[i, k] * E[p_index[i, k], j]     (k ascending)
//   w = W[i, j] (+ C[i, j] when compensated);  w = w * decay (when decay != 1)
//   t = w + a
//   W[i, j] = round(t) by `rounding`; compensated: C[i, j] = round_nearest(t - W[i, j]).
// Memory: one read and one write of W (and of C when compensated) per element; E (d n fp32)
// and P's row are re-read from cache. 8 bytes per element for fp32 W, 4 for bf16/fp16 W with
// nearest or stochastic rounding, 8 with compensated.
//
// Threading: TBB parallel_for over row blocks in the caller's task arena; each task owns its
// rows, so the result does not depend on the thread count or the split. Vectorised per CPU
// (GCC target_clones: AVX-512, AVX2, baseline).
#ifndef LSPO_LSP_APPLY_KERNEL_H_
#define LSPO_LSP_APPLY_KERNEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "lsp/rounding.h"

namespace lspo::lsp {

// The storage type of W (and C): fp32, bf16 bits or IEEE fp16 bits.
enum class WeightDtype : int { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

// Operands of one fused apply. All pointers are host memory, row-major, contiguous.
struct FusedApplyArgs {
  void* w = nullptr;  // W (m, n) in `dtype`, updated in place.
  void* c = nullptr;  // C (m, n) in `dtype`: the residual, kCompensated only.
  WeightDtype dtype = WeightDtype::kFloat32;
  int64_t m = 0;                           // Rows of W (= rows of P).
  int64_t n = 0;                           // Columns of W (= columns of E).
  const float* e = nullptr;                // E = D Q^T, (d, n) fp32.
  int64_t d = 0;                           // Rows of E (= columns of P).
  const int64_t* p_index = nullptr;        // (m, r) column of P for each non-zero, in [0, d).
  const float* p_value = nullptr;          // (m, r) value of each non-zero.
  int64_t r = 0;                           // Non-zeros per row of P (>= 1).
  float decay = 1.0f;                      // Decoupled weight-decay factor 1 - lr * wd (1 = none).
  Rounding rounding = Rounding::kNearest;  // Ignored for fp32 W except kCompensated (error).
  uint64_t seed = 0;                       // Noise seed of kStochastic (lsp::RoundingNoise).
};

// Runs the fused apply. Errors (nothing is written): kInvalidArgument for null operands, non-
// positive sizes, r < 1, a non-finite or negative decay, kCompensated without C or with fp32 W.
// P's indices are trusted (validated when the projector was built, SparseProjector::Validate).
absl::Status FusedApplyCpu(const FusedApplyArgs& args);

// E = D Q^T (d_p, n) fp32 row-major, the first stage of the fused apply, from Dt = D^T
// (d_q, d_p) fp32 row-major and Q's (n, r) index / value. Per element, in fp32 with no fused
// multiply-add: E[a, j] = q_value[j, 0] * Dt[q_index[j, 0], a], then + q_value[j, k] *
// Dt[q_index[j, k], a] for k = 1 .. r - 1 ascending (the order of lsp::GatherRows, so E has
// the bits of the ATen path's gather). Method: per tile of 16 columns j, the 16 rows of E^T
// are summed from rows of Dt (unit stride), then written into E by 16 x 16 register
// transposes. Reads Dt (cache-resident) r times per column, writes E once. TBB over column
// tiles; the result does not depend on the thread count. Errors (nothing written):
// kInvalidArgument for null pointers, non-positive sizes or r outside [1, d_q]. Q's indices
// are trusted (each in [0, d_q)).
absl::Status StepTimesQtCpu(const float* dt, int64_t d_p, int64_t d_q, const int64_t* q_index,
                            const float* q_value, int64_t n, int64_t r, float* e);

// Stochastic rounding of `count` fp32 values t (a whole matrix, row-major, element k numbered
// k as in the fused apply) into 16-bit bits `out` of `dtype` (bf16 or fp16) with the noise of
// `seed`: the same bits the fused applies (CPU and CUDA) write for the same sums. The fallback
// of lsp::ApplyStepFused on devices without the project's kernels. Errors: kInvalidArgument for
// fp32 `dtype` or null pointers with count > 0.
absl::Status RoundStochastic(const float* t, uint16_t* out, int64_t count, WeightDtype dtype,
                             uint64_t seed);

}  // namespace lspo::lsp

#endif  // LSPO_LSP_APPLY_KERNEL_H_
