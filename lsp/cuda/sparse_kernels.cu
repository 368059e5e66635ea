#include "lsp/cuda/sparse_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cusparse.h>

#include "lsp/rounding.h"

namespace lspo::lsp::cuda {
namespace {

// CSR of P itself (rows x d): every row has exactly r non-zeros, so row_ptr[i] = i * r and no
// global sort is needed; each row's r (column, value) pairs are insertion-sorted by column.
__global__ void BuildCsr(const int32_t* index, const float* value, int64_t rows, int64_t r,
                         int32_t* row_ptr, int32_t* col, float* val) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i > rows) return;
  row_ptr[i] = static_cast<int32_t>(i * r);
  if (i == rows) return;
  for (int64_t k = 0; k < r; ++k) {
    int32_t c = index[i * r + k];
    float v = value[i * r + k];
    int64_t j = k;
    while (j > 0 && col[i * r + j - 1] > c) {
      col[i * r + j] = col[i * r + j - 1];
      val[i * r + j] = val[i * r + j - 1];
      --j;
    }
    col[i * r + j] = c;
    val[i * r + j] = v;
  }
}

__global__ void ApplyKernel(float* w, int64_t m, int64_t n, const int32_t* pi, const float* pv,
                            const int32_t* qi, const float* qv, const float* dstep, int64_t d,
                            int64_t r) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  for (int64_t i = blockIdx.y; i < m; i += gridDim.y) {  // grid.y is capped at 65535
    float acc = 0.f;
    for (int64_t a = 0; a < r; ++a) {
      const float p = pv[i * r + a];
      const float* drow = dstep + static_cast<int64_t>(pi[i * r + a]) * d;
      float inner = 0.f;
      for (int64_t b = 0; b < r; ++b) inner += drow[qi[j * r + b]] * qv[j * r + b];
      acc += p * inner;
    }
    w[i * n + j] += acc;
  }
}

// The fused apply (lsp/apply_kernel.h's per-element formula, in the same order, fp32, no
// contraction into FMA: __fmul_rn / __fadd_rn). Storage: S::T with Load/Round below.
struct DevF32 {
  using T = float;
  __device__ static float Load(const T* p, int64_t k) { return p[k]; }
};
struct DevBf16 {
  using T = uint16_t;
  __device__ static float Load(const T* p, int64_t k) {
    return __uint_as_float(static_cast<uint32_t>(p[k]) << 16);
  }
  __device__ static uint16_t Nearest(float t) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(t));
  }
  __device__ static uint16_t Stochastic(float t, uint32_t noise) {
    return Bf16Stochastic(__float_as_uint(t), noise);
  }
};
struct DevF16 {
  using T = uint16_t;
  __device__ static float Load(const T* p, int64_t k) {
    return __half2float(__ushort_as_half(p[k]));
  }
  __device__ static uint16_t Nearest(float t) { return __half_as_ushort(__float2half_rn(t)); }
  // As lsp/apply_kernel.cc's Fp16Stochastic.
  __device__ static uint16_t Stochastic(float t, uint32_t noise) {
    const uint16_t near = Nearest(t);
    const float nf = __half2float(__ushort_as_half(near));
    if (nf == t || !isfinite(t) || !isfinite(nf)) return near;
    const uint16_t other = Fp16Neighbour(near, nf < t);
    const float of = __half2float(__ushort_as_half(other));
    if (!isfinite(of)) return near;
    const bool near_is_lo = nf < of;
    const float lo = near_is_lo ? nf : of;
    const float hi = near_is_lo ? of : nf;
    const bool take_hi = NoiseUniform(noise) < __fdiv_rn(__fsub_rn(t, lo), __fsub_rn(hi, lo));
    return take_hi == near_is_lo ? other : near;
  }
};

// One thread per element: x over columns (coalesced W, C and E rows), grid-stride over rows;
// P's row (r pairs) is the same for a whole block (broadcast loads).
template <typename S, int kRound>
__global__ void ApplyFusedKernel(typename S::T* w, typename S::T* cres, int64_t m, int64_t n,
                                 const float* e, const int32_t* pi, const float* pv, int64_t r,
                                 float decay, uint64_t seed) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  for (int64_t i = blockIdx.y; i < m; i += gridDim.y) {
    float acc = __fmul_rn(pv[i * r], e[static_cast<int64_t>(pi[i * r]) * n + j]);
    for (int64_t k = 1; k < r; ++k) {
      acc =
          __fadd_rn(acc, __fmul_rn(pv[i * r + k], e[static_cast<int64_t>(pi[i * r + k]) * n + j]));
    }
    const int64_t at = i * n + j;
    if constexpr (kRound == static_cast<int>(Rounding::kCompensated)) {
      const float kept = __fmul_rn(__fadd_rn(S::Load(w, at), S::Load(cres, at)), decay);
      const float t = __fadd_rn(kept, acc);
      const uint16_t wr = S::Nearest(t);
      w[at] = wr;
      cres[at] = S::Nearest(__fsub_rn(t, S::Load(&wr, 0)));
    } else if constexpr (sizeof(typename S::T) == 4) {
      w[at] = __fadd_rn(__fmul_rn(S::Load(w, at), decay), acc);
    } else if constexpr (kRound == static_cast<int>(Rounding::kStochastic)) {
      const float t = __fadd_rn(__fmul_rn(S::Load(w, at), decay), acc);
      w[at] = S::Stochastic(t, RoundingNoise(seed, static_cast<uint32_t>(at)));
    } else {
      w[at] = S::Nearest(__fadd_rn(__fmul_rn(S::Load(w, at), decay), acc));
    }
  }
}

template <typename S, int kRound>
int LaunchApplyFused(void* w, void* c, int64_t m, int64_t n, const float* e, const int32_t* pi,
                     const float* pv, int64_t r, float decay, uint64_t seed, cudaStream_t stream) {
  dim3 block(256);
  dim3 grid(static_cast<unsigned>((n + 255) / 256), static_cast<unsigned>(m < 65535 ? m : 65535));
  ApplyFusedKernel<S, kRound><<<grid, block, 0, stream>>>(static_cast<typename S::T*>(w),
                                                          static_cast<typename S::T*>(c), m, n, e,
                                                          pi, pv, r, decay, seed);
  return static_cast<int>(cudaGetLastError());
}

// One cuSPARSE handle per host thread and device-visible context (creating one costs ~ms).
cusparseStatus_t ThreadHandle(cusparseHandle_t* out) {
  thread_local cusparseHandle_t handle = nullptr;
  if (handle == nullptr) {
    cusparseStatus_t s = cusparseCreate(&handle);
    if (s != CUSPARSE_STATUS_SUCCESS) {
      handle = nullptr;
      return s;
    }
  }
  *out = handle;
  return CUSPARSE_STATUS_SUCCESS;
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // Clear the sticky "no driver/device" error.
    return 0;
  }
  return n;
}

int ProjectRows(const float* x, int64_t n_tokens, int64_t rows, const int32_t* index,
                const float* value, int64_t d, int64_t r, float* y, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const int64_t nnz = rows * r;
  int32_t *row_ptr = nullptr, *col = nullptr;
  float* val = nullptr;
  void* buffer = nullptr;
  cusparseHandle_t handle = nullptr;
  cusparseSpMatDescr_t mat = nullptr;
  cusparseDnMatDescr_t xt = nullptr, yt = nullptr;
  int err = 0;
  auto sp = [&err](cusparseStatus_t s) {
    if (s != CUSPARSE_STATUS_SUCCESS && err == 0) err = -static_cast<int>(s);
    return err == 0;
  };
  auto cu = [&err](cudaError_t s) {
    if (s != cudaSuccess && err == 0) err = static_cast<int>(s);
    return err == 0;
  };
  if (cu(cudaMallocAsync(reinterpret_cast<void**>(&row_ptr), (rows + 1) * 4, stream)) &&
      cu(cudaMallocAsync(reinterpret_cast<void**>(&col), nnz * 4, stream)) &&
      cu(cudaMallocAsync(reinterpret_cast<void**>(&val), nnz * 4, stream))) {
    BuildCsr<<<static_cast<unsigned>((rows + 256) / 256), 256, 0, stream>>>(index, value, rows, r,
                                                                            row_ptr, col, val);
    cu(cudaGetLastError());
  }
  // Y^T (d, N) = P^T (d, rows) X^T (rows, N): opA = transpose of the CSR P (rows, d).
  // Row-major X (N, rows) is column-major X^T; row-major Y (N, d) is column-major Y^T.
  if (err == 0 && sp(ThreadHandle(&handle)) && sp(cusparseSetStream(handle, stream)) &&
      sp(cusparseCreateCsr(&mat, rows, d, nnz, row_ptr, col, val, CUSPARSE_INDEX_32I,
                           CUSPARSE_INDEX_32I, CUSPARSE_INDEX_BASE_ZERO, CUDA_R_32F)) &&
      sp(cusparseCreateDnMat(&xt, rows, n_tokens, rows, const_cast<float*>(x), CUDA_R_32F,
                             CUSPARSE_ORDER_COL)) &&
      sp(cusparseCreateDnMat(&yt, d, n_tokens, d, y, CUDA_R_32F, CUSPARSE_ORDER_COL))) {
    const float alpha = 1.f, beta = 0.f;
    size_t bytes = 0;
    if (sp(cusparseSpMM_bufferSize(handle, CUSPARSE_OPERATION_TRANSPOSE,
                                   CUSPARSE_OPERATION_NON_TRANSPOSE, &alpha, mat, xt, &beta, yt,
                                   CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, &bytes)) &&
        cu(cudaMallocAsync(&buffer, bytes + 1, stream))) {
      sp(cusparseSpMM(handle, CUSPARSE_OPERATION_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
                      &alpha, mat, xt, &beta, yt, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT, buffer));
    }
  }
  if (mat) cusparseDestroySpMat(mat);
  if (xt) cusparseDestroyDnMat(xt);
  if (yt) cusparseDestroyDnMat(yt);
  if (buffer) cudaFreeAsync(buffer, stream);
  if (row_ptr) cudaFreeAsync(row_ptr, stream);
  if (col) cudaFreeAsync(col, stream);
  if (val) cudaFreeAsync(val, stream);
  return err;
}

int ApplyStep(float* w, int64_t m, int64_t n, const int32_t* p_index, const float* p_value,
              const int32_t* q_index, const float* q_value, const float* d_step, int64_t d,
              int64_t r, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  dim3 block(256);
  dim3 grid(static_cast<unsigned>((n + 255) / 256), static_cast<unsigned>(m < 65535 ? m : 65535));
  ApplyKernel<<<grid, block, 0, stream>>>(w, m, n, p_index, p_value, q_index, q_value, d_step, d,
                                          r);
  return static_cast<int>(cudaGetLastError());
}

int ApplyFused(void* w, void* c, int dtype, int64_t m, int64_t n, const float* e,
               const int32_t* p_index, const float* p_value, int64_t r, float decay, int rounding,
               uint64_t seed, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (m <= 0 || n <= 0) return 0;
  if (w == nullptr || e == nullptr || p_index == nullptr || p_value == nullptr || r < 1) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  constexpr int kNear = static_cast<int>(Rounding::kNearest);
  constexpr int kComp = static_cast<int>(Rounding::kCompensated);
  constexpr int kStoch = static_cast<int>(Rounding::kStochastic);
  if (rounding == kComp && (c == nullptr || dtype == 0)) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  // One launch per (storage, rounding); fp32 W has nothing to round.
  auto launch = [&](auto storage) -> int {
    using S = decltype(storage);
    if constexpr (sizeof(typename S::T) == 4) {
      return LaunchApplyFused<S, kNear>(w, c, m, n, e, p_index, p_value, r, decay, seed, stream);
    } else {
      if (rounding == kComp) {
        return LaunchApplyFused<S, kComp>(w, c, m, n, e, p_index, p_value, r, decay, seed, stream);
      }
      if (rounding == kStoch) {
        return LaunchApplyFused<S, kStoch>(w, c, m, n, e, p_index, p_value, r, decay, seed, stream);
      }
      return LaunchApplyFused<S, kNear>(w, c, m, n, e, p_index, p_value, r, decay, seed, stream);
    }
  };
  switch (dtype) {
    case 0:
      return launch(DevF32{});
    case 1:
      return launch(DevBf16{});
    case 2:
      return launch(DevF16{});
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
}

}  // namespace lspo::lsp::cuda
