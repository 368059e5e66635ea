// Device kernels vs float64 CPU references. Skips (with a message) when no CUDA device is
// visible, as on the project's CPU-only machines and CI.
#include "lsp/cuda/sparse_kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "lsp/apply_kernel.h"
#include "runtime/float16.h"

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

// ApplyFused on the device against the CPU kernel (lsp::FusedApplyCpu, the same per-element
// formula without FMA contraction and the same noise): bit for bit, for every storage dtype
// and rounding, with weight decay; plus a float64 reference of the fp32 case.
void CheckApplyFused(WeightDtype dtype, Rounding rounding) {
  const int64_t m = 300, n = 517, d = 48, r = 6;  // n not a multiple of the block size
  std::mt19937 rng(19 + static_cast<int>(dtype) * 3 + static_cast<int>(rounding));
  Proj p = RandomProj(m, d, r, rng);
  std::normal_distribution<float> nd;
  const int64_t bytes = dtype == WeightDtype::kFloat32 ? 4 : 2;
  std::vector<float> w(m * n), e(d * n);
  for (auto& v : w) v = 0.05f * nd(rng);
  for (auto& v : e) v = 0.01f * nd(rng);
  std::vector<uint8_t> w_bytes(m * n * bytes), c_bytes(m * n * bytes, 0);
  if (dtype == WeightDtype::kFloat32) {
    std::memcpy(w_bytes.data(), w.data(), w_bytes.size());
  } else {
    auto* w16 = reinterpret_cast<uint16_t*>(w_bytes.data());
    auto* c16 = reinterpret_cast<uint16_t*>(c_bytes.data());
    for (int64_t k = 0; k < m * n; ++k) {
      const bool bf16 = dtype == WeightDtype::kBFloat16;
      w16[k] = bf16 ? runtime::Fp32ToBf16(w[k]) : runtime::Fp32ToFp16(w[k]);
      const float back = bf16 ? runtime::Bf16ToFp32(w16[k]) : runtime::Fp16ToFp32(w16[k]);
      c16[k] = bf16 ? runtime::Fp32ToBf16(w[k] - back) : runtime::Fp32ToFp16(w[k] - back);
    }
  }
  const bool comp = rounding == Rounding::kCompensated;
  const float decay = 0.999f;
  const uint64_t seed = 0x1234abcd5678ull;
  // The CPU kernel's result.
  std::vector<uint8_t> cpu_w = w_bytes, cpu_c = c_bytes;
  std::vector<int64_t> index64(p.index.begin(), p.index.end());
  FusedApplyArgs args;
  args.w = cpu_w.data();
  args.c = comp ? cpu_c.data() : nullptr;
  args.dtype = dtype;
  args.m = m;
  args.n = n;
  args.e = e.data();
  args.d = d;
  args.p_index = index64.data();
  args.p_value = p.value.data();
  args.r = r;
  args.decay = decay;
  args.rounding = rounding;
  args.seed = seed;
  ASSERT_TRUE(FusedApplyCpu(args).ok());
  // The device's.
  uint8_t* dw = ToDevice(w_bytes);
  uint8_t* dc = ToDevice(c_bytes);
  int32_t* dpi = ToDevice(p.index);
  float* dpv = ToDevice(p.value);
  float* de = ToDevice(e);
  ASSERT_EQ(ApplyFused(dw, comp ? dc : nullptr, static_cast<int>(dtype), m, n, de, dpi, dpv, r,
                       decay, static_cast<int>(rounding), seed, nullptr),
            0);
  std::vector<uint8_t> gpu_w(w_bytes.size()), gpu_c(c_bytes.size());
  ASSERT_EQ(cudaMemcpy(gpu_w.data(), dw, gpu_w.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(gpu_c.data(), dc, gpu_c.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  int64_t differ = 0;
  for (size_t k = 0; k < gpu_w.size(); ++k) differ += gpu_w[k] != cpu_w[k];
  for (size_t k = 0; comp && k < gpu_c.size(); ++k) differ += gpu_c[k] != cpu_c[k];
  EXPECT_EQ(differ, 0) << "bytes that differ between the CUDA and CPU applies";
  if (dtype == WeightDtype::kFloat32) {
    const float* out = reinterpret_cast<const float*>(gpu_w.data());
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double ref = static_cast<double>(w[i * n + j]) * decay;
        for (int64_t a = 0; a < r; ++a) {
          ref += static_cast<double>(p.value[i * r + a]) * e[p.index[i * r + a] * n + j];
        }
        err2 += (out[i * n + j] - ref) * (out[i * n + j] - ref);
        ref2 += ref * ref;
      }
    }
    EXPECT_LT(std::sqrt(err2 / ref2), 1e-6);
  }
  for (void* ptr : {static_cast<void*>(dw), static_cast<void*>(dc), static_cast<void*>(dpi),
                    static_cast<void*>(dpv), static_cast<void*>(de)}) {
    cudaFree(ptr);
  }
}

TEST(CudaSparseKernelsTest, ApplyFusedMatchesTheCpuKernelBitForBit) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: kernels compiled, not run";
  CheckApplyFused(WeightDtype::kFloat32, Rounding::kNearest);
  for (WeightDtype dt : {WeightDtype::kBFloat16, WeightDtype::kFloat16}) {
    for (Rounding rd : {Rounding::kNearest, Rounding::kCompensated, Rounding::kStochastic}) {
      SCOPED_TRACE(testing::Message() << "dtype " << static_cast<int>(dt) << " rounding "
                                      << static_cast<int>(rd));
      CheckApplyFused(dt, rd);
    }
  }
}

TEST(CudaSparseKernelsTest, ApplyFusedRejectsCompensatedWithoutResidual) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device: kernels compiled, not run";
  EXPECT_EQ(ApplyFused(reinterpret_cast<void*>(16), nullptr, 1, 4, 4,
                       reinterpret_cast<const float*>(16), reinterpret_cast<const int32_t*>(16),
                       reinterpret_cast<const float*>(16), 1, 1.0f,
                       static_cast<int>(Rounding::kCompensated), 0, nullptr),
            static_cast<int>(cudaErrorInvalidValue));
}

}  // namespace
}  // namespace lspo::lsp::cuda
