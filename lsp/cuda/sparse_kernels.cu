#include "lsp/cuda/sparse_kernels.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cusparse.h>

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

// W[i, j] += sum_{a<r} Pv[i, a] E[Pi[i, a], j] for E (d, n) fp32 row-major; one thread per
// element, x over columns (coalesced reads of E's rows and of W), grid-stride over rows.
template <typename T>
__device__ inline float ToF(T v);
template <>
__device__ inline float ToF<float>(float v) { return v; }
template <>
__device__ inline float ToF<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ inline T FromF(float v);
template <>
__device__ inline float FromF<float>(float v) { return v; }
template <>
__device__ inline __nv_bfloat16 FromF<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void ApplyRowsKernel(T* w, int64_t m, int64_t n, const int32_t* pi, const float* pv,
                                int64_t r, const float* e) {
  const int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  for (int64_t i = blockIdx.y; i < m; i += gridDim.y) {
    float acc = 0.f;
    for (int64_t a = 0; a < r; ++a) {
      acc += pv[i * r + a] * e[static_cast<int64_t>(pi[i * r + a]) * n + j];
    }
    T* out = w + i * n + j;
    *out = FromF<T>(ToF<T>(*out) + acc);  // One rounding into T.
  }
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
    BuildCsr<<<static_cast<unsigned>((rows + 256) / 256), 256, 0, stream>>>(index, value, rows,
                                                                           r, row_ptr, col, val);
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
                      &alpha, mat, xt, &beta, yt, CUDA_R_32F, CUSPARSE_SPMM_ALG_DEFAULT,
                      buffer));
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
  dim3 grid(static_cast<unsigned>((n + 255) / 256),
            static_cast<unsigned>(m < 65535 ? m : 65535));
  ApplyKernel<<<grid, block, 0, stream>>>(w, m, n, p_index, p_value, q_index, q_value, d_step,
                                          d, r);
  return static_cast<int>(cudaGetLastError());
}

int ApplyRows(void* w, bool w_bf16, int64_t m, int64_t n, const int32_t* p_index,
              const float* p_value, int64_t r, const float* e, void* stream_ptr) {
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (m <= 0 || n <= 0) return 0;
  dim3 block(256);
  dim3 grid(static_cast<unsigned>((n + 255) / 256),
            static_cast<unsigned>(m < 65535 ? m : 65535));
  if (w_bf16) {
    ApplyRowsKernel<__nv_bfloat16><<<grid, block, 0, stream>>>(
        static_cast<__nv_bfloat16*>(w), m, n, p_index, p_value, r, e);
  } else {
    ApplyRowsKernel<float><<<grid, block, 0, stream>>>(static_cast<float*>(w), m, n, p_index,
                                                       p_value, r, e);
  }
  return static_cast<int>(cudaGetLastError());
}

}  // namespace lspo::lsp::cuda
