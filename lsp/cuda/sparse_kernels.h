// CUDA kernels of the method, torch-free (so nvcc compiles them in seconds). Legend:
//   N tokens, m out features, n in features, d subspace, r non-zeros per projector row.
// Projectors are (d,r)-sparse: row i of P (m x d) has r non-zeros at columns p_index[i*r+k]
// with values p_value[i*r+k] (int32 / fp32, row-major (m, r)); same for Q (n x d).
// All pointers are device pointers; every function is asynchronous on `stream` and returns
// the launch/cuSPARSE status as a cudaError_t-compatible int (0 = success).
//
// Built only when nvcc is found (CMake option LSPO_HAS_CUDA). At run time the callers check
// CudaDeviceCount() first; without a device the tests skip with a message.
#ifndef LSPO_LSP_CUDA_SPARSE_KERNELS_H_
#define LSPO_LSP_CUDA_SPARSE_KERNELS_H_

#include <cstdint>

namespace lspo::lsp::cuda {

// Number of visible CUDA devices; 0 when there is no device or no driver (never fails).
int CudaDeviceCount();

// Y (N, d) fp32 = X (N, rows) fp32 times the sparse projector (rows, d): Y = X P.
// Used for XQ = X Q in the forward pass and dY P in the backward pass (docs/method.md, "Math").
// Implemented with cuSPARSE SpMM: Y^T = op(P) X^T with P in CSR (rows x d, r non-zeros per
// row, so row_ptr[i] = i r) and op = transpose; CSR arrays are built on the device (stream-
// ordered allocations); the cuSPARSE handle is created once per host thread.
// Returns 0 on success, else a CUDA or cuSPARSE error code (negative for cuSPARSE).
int ProjectRows(const float* x, int64_t n_tokens, int64_t rows, const int32_t* index,
                const float* value, int64_t d, int64_t r, float* y, void* stream);

// W (m, n) fp32 row-major += P D Q^T with D (d, d) fp32, without densifying P or Q:
// W[i, j] += sum_{a<r, b<r} Pv[i,a] * D[Pi[i,a], Qi[j,b]] * Qv[j,b] (one thread per element).
int ApplyStep(float* w, int64_t m, int64_t n, const int32_t* p_index, const float* p_value,
              const int32_t* q_index, const float* q_value, const float* d_step, int64_t d,
              int64_t r, void* stream);

// The fused apply, lsp/apply_kernel.h's contract and per-element formula on the device:
// W <- round(decay (W + C) + P E), C <- what the rounding dropped (compensated only), with
// E = D Q^T (d, n) fp32 already formed, W (and C) (m, n) row-major in dtype 0 = fp32, 1 = bf16,
// 2 = fp16 (lsp::WeightDtype), rounding an lsp::Rounding (ignored for fp32 W), seed the noise
// seed of stochastic rounding (lsp::RoundingNoise: the CPU kernel draws the same noise, so
// bf16 results agree bit for bit). One read and one write of W (and C) per element.
// Returns cudaErrorInvalidValue for null operands, r < 1, an unknown dtype, or compensated
// rounding without C or with fp32 W; else the launch status.
int ApplyFused(void* w, void* c, int dtype, int64_t m, int64_t n, const float* e,
               const int32_t* p_index, const float* p_value, int64_t r, float decay, int rounding,
               uint64_t seed, void* stream);
}  // namespace lspo::lsp::cuda

#endif  // LSPO_LSP_CUDA_SPARSE_KERNELS_H_
