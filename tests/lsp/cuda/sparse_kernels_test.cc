// Device kernels vs float64 CPU references. Skips (with a message) when no CUDA device is
// visible, as on the project's CPU-only machines and CI.
#include "lsp/cuda/sparse_kernels.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace lspo::lsp::cuda {
namespace {

struct Proj {
  std::vector<int32_t> index;
  std::vector<float> value;
};

Proj RandomProj(int64_t rows, int64_t d, int64_t r, std::mt19937& rng) {
  Proj p;
  std::normal_distribution<float> nd(0.f, 1.f / std::sqrt(static_cast<float>(r)));
  std::vector<int32_t> cols(d);
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < d; ++c) cols[c] = static_cast<int32_t>(c);
    std::shuffle(cols.begin(), cols.end(), rng);
    for (int64_t k = 0; k < r; ++k) {
      p.index.push_back(cols[k]);
      p.value.push_back(nd(rng));
    }
  }
  return p;
}

template <typename T>
T* ToDevice(const std::vector<T>& v) {
  T* ptr = nullptr;
  EXPECT_EQ(cudaMalloc(&ptr, v.size() * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(ptr, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return ptr;
}

TEST(CudaSparseKernelsTest, ProjectRowsMatchesFloat64Reference) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: kernels compiled, not run";
  const int64_t n_tok = 37, rows = 192, d = 64, r = 4;
  std::mt19937 rng(7);
  Proj p = RandomProj(rows, d, r, rng);
  std::vector<float> x(n_tok * rows);
  std::normal_distribution<float> nd;
  for (auto& v : x) v = nd(rng);
  float* dx = ToDevice(x);
  int32_t* di = ToDevice(p.index);
  float* dv = ToDevice(p.value);
  float* dy = nullptr;
  ASSERT_EQ(cudaMalloc(&dy, n_tok * d * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dy, 0xff, n_tok * d * 4), cudaSuccess);  // NaN: every output written?
  ASSERT_EQ(ProjectRows(dx, n_tok, rows, di, dv, d, r, dy, nullptr), 0);
  std::vector<float> y(n_tok * d);
  ASSERT_EQ(cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  // Y^T is column-major (d, N) = row-major (N, d).
  for (int64_t t = 0; t < n_tok; ++t) {
    std::vector<double> ref(d, 0.0);
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t k = 0; k < r; ++k) {
        ref[p.index[i * r + k]] += static_cast<double>(x[t * rows + i]) * p.value[i * r + k];
      }
    }
    for (int64_t c = 0; c < d; ++c) EXPECT_NEAR(y[t * d + c], ref[c], 1e-4) << t << "," << c;
  }
  cudaFree(dx);
  cudaFree(di);
  cudaFree(dv);
  cudaFree(dy);
}

TEST(CudaSparseKernelsTest, ApplyStepMatchesFloat64Reference) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: kernels compiled, not run";
  const int64_t m = 96, n = 80, d = 32, r = 4;
  std::mt19937 rng(11);
  Proj p = RandomProj(m, d, r, rng), q = RandomProj(n, d, r, rng);
  std::normal_distribution<float> nd;
  std::vector<float> w(m * n), dstep(d * d);
  for (auto& v : w) v = nd(rng);
  for (auto& v : dstep) v = nd(rng);
  float* dw = ToDevice(w);
  int32_t* dpi = ToDevice(p.index);
  float* dpv = ToDevice(p.value);
  int32_t* dqi = ToDevice(q.index);
  float* dqv = ToDevice(q.value);
  float* dd = ToDevice(dstep);
  ASSERT_EQ(ApplyStep(dw, m, n, dpi, dpv, dqi, dqv, dd, d, r, nullptr), 0);
  std::vector<float> out(m * n);
  ASSERT_EQ(cudaMemcpy(out.data(), dw, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = w[i * n + j];
      for (int64_t a = 0; a < r; ++a) {
        for (int64_t b = 0; b < r; ++b) {
          ref += static_cast<double>(p.value[i * r + a]) *
                 dstep[p.index[i * r + a] * d + q.index[j * r + b]] * q.value[j * r + b];
        }
      }
      ASSERT_NEAR(out[i * n + j], ref, 1e-4);
    }
  }
  for (void* ptr : {static_cast<void*>(dw), static_cast<void*>(dpi), static_cast<void*>(dpv),
                    static_cast<void*>(dqi), static_cast<void*>(dqv), static_cast<void*>(dd)}) {
    cudaFree(ptr);
  }
}

// ApplyRows on fp32 and bf16 W against a float64 reference of W + P E (E = D Q^T given).
void CheckApplyRows(bool bf16) {
  const int64_t m = 300, n = 517, d = 48, r = 6;  // n not a multiple of the block size
  std::mt19937 rng(bf16 ? 23 : 19);
  Proj p = RandomProj(m, d, r, rng);
  std::normal_distribution<float> nd;
  std::vector<float> w(m * n), e(d * n);
  for (auto& v : w) v = 0.05f * nd(rng);
  for (auto& v : e) v = 0.01f * nd(rng);
  std::vector<uint16_t> w16(m * n);
  if (bf16) {
    for (int64_t k = 0; k < m * n; ++k) {
      uint32_t bits;
      std::memcpy(&bits, &w[k], 4);
      w16[k] = static_cast<uint16_t>(bits >> 16);  // Truncate: exact bf16 inputs.
      bits = static_cast<uint32_t>(w16[k]) << 16;
      std::memcpy(&w[k], &bits, 4);
    }
  }
  void* dw = bf16 ? static_cast<void*>(ToDevice(w16)) : static_cast<void*>(ToDevice(w));
  int32_t* dpi = ToDevice(p.index);
  float* dpv = ToDevice(p.value);
  float* de = ToDevice(e);
  ASSERT_EQ(ApplyRows(dw, bf16, m, n, dpi, dpv, r, de, nullptr), 0);
  std::vector<float> out(m * n);
  if (bf16) {
    ASSERT_EQ(cudaMemcpy(w16.data(), dw, m * n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t k = 0; k < m * n; ++k) {
      uint32_t bits = static_cast<uint32_t>(w16[k]) << 16;
      std::memcpy(&out[k], &bits, 4);
    }
  } else {
    ASSERT_EQ(cudaMemcpy(out.data(), dw, m * n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  double err2 = 0, ref2 = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double ref = w[i * n + j];
      for (int64_t a = 0; a < r; ++a) {
        ref += static_cast<double>(p.value[i * r + a]) * e[p.index[i * r + a] * n + j];
      }
      ASSERT_TRUE(std::isfinite(out[i * n + j])) << i << "," << j;
      err2 += (out[i * n + j] - ref) * (out[i * n + j] - ref);
      ref2 += ref * ref;
    }
  }
  // fp32: far under 1e-5; bf16: one rounding of each output (2^-9 relative at most).
  EXPECT_LT(std::sqrt(err2 / ref2), bf16 ? 4e-3 : 1e-6);
  cudaFree(dw);
  cudaFree(dpi);
  cudaFree(dpv);
  cudaFree(de);
}

TEST(CudaSparseKernelsTest, ApplyRowsFp32MatchesFloat64Reference) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: kernels compiled, not run";
  CheckApplyRows(false);
}

TEST(CudaSparseKernelsTest, ApplyRowsBf16MatchesFloat64Reference) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: kernels compiled, not run";
  CheckApplyRows(true);
}

}  // namespace
}  // namespace lspo::lsp::cuda
