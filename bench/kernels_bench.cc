// Kernel and data-plane benchmarks of LSP-Offload (issue 4; results in docs/bench.md, driven by
// scripts/bench, which turns the JSON output into ratios against the peers and limits).
//
// Every figure that matters is a ratio of two benchmarks of one run of this binary (the machine
// is noisy), so each group has its peer or limit next to it:
//   STREAM copy/triad        the measured DRAM bandwidth (STREAM convention: bytes named by the
//                            kernel, no write-allocate traffic; McCalpin, "STREAM", 1995)
//   Adam (ours, fp32/bf16)   vs torch::optim::Adam / AdamW (LibTorch C++) and vs STREAM;
//                            bytes per parameter: fp32 grad 4 + m 8 + v 8 + master 8 = 28,
//                            bf16 grad 2 + m 8 + v 8 + master 8 + bf16 out 2 = 28
//   Compress / Apply         vs the dense torch equivalent (mm with the densified projector);
//                            bytes: compress reads X (N, n) and dY (N, m) fp32 once (and
//                            does 2 N d^2 FLOPs for S = (dY P)^T (X Q): the bound is the
//                            larger of the two times, BM_FmaPeak the compute limit); apply
//                            reads and writes W (m, n) fp32 once
//   Arena slot               write + read through a POSIX shared-memory slot vs private memcpy
//   Layer round trip         one decoder layer's offload -> CPU update -> upload through the
//                            arena and completion flags, worker and optimizer on two threads
//   gRPC round trip          one unary control RPC on loopback (in-process optimizer service)
//
// Run: build/bench/kernels_bench --benchmark_format=json [--threads=N] [--benchmark_filter=RE]
// Counters: params_per_s (Adam), bytes_per_second (all memory-bound kernels), us_per_layer.
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>
#include "third_party/torch/torch_api.h"
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cpu_optimizer_service/optimizer_core.h"
#include "cpu_optimizer_service/optimizer_service.h"
#include "lsp/adam.h"
#include "lsp/projector.h"
#include "runtime/float16.h"
#include "proto/optimizer.pb.h"
#include "proto/peer.pb.h"
#include "proto/worker.pb.h"
#include "proto/optimizer.grpc.pb.h"
#include "runtime/completion_flags.h"
#include "runtime/cpu_blas.h"
#include "runtime/shm_arena.h"
#include "tbb/blocked_range.h"
#include "tbb/global_control.h"
#include "tbb/parallel_for.h"

namespace {

using lspo::lsp::AdamHyper;
using lspo::lsp::AdamOperands;
using lspo::lsp::SparseProjector;

constexpr int64_t kStreamElems = int64_t{32} << 20;  // 128 MiB per fp32 array (>> any LLC)
constexpr int64_t kGrain = 1 << 16;

// Fills x with small pseudo-random values in parallel (first touch on the threads that use it).
void Fill(float* x, int64_t n, float scale, uint32_t seed) {
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kGrain),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      uint32_t s = seed ^ static_cast<uint32_t>(r.begin() * 2654435761u);
                      for (int64_t i = r.begin(); i < r.end(); ++i) {
                        s = s * 1664525u + 1013904223u;
                        x[i] = scale * (static_cast<float>(s >> 8) * 0x1.0p-24f - 0.5f);
                      }
                    });
}

// Google Benchmark re-runs a function to size the iteration count; big sizes get a fixed count
// so that the 2-4 GiB of state is allocated and first-touched once per size.
#define LSPO_SIZED(BM)                                                                     \
  BENCHMARK(BM)->Arg(1000000)->Unit(benchmark::kMillisecond)->UseRealTime();               \
  BENCHMARK(BM)->Arg(16000000)->Iterations(16)->Unit(benchmark::kMillisecond)->UseRealTime(); \
  BENCHMARK(BM)->Arg(128000000)->Iterations(4)->Unit(benchmark::kMillisecond)->UseRealTime()

// ---------------------------------------------------------------------------------------------
// STREAM-like bandwidth (same binary, same thread count, same TBB splitting as the kernels).

void BM_StreamCopy(benchmark::State& state) {
  std::vector<float> a(kStreamElems), c(kStreamElems);
  Fill(a.data(), kStreamElems, 1.0f, 1);
  Fill(c.data(), kStreamElems, 1.0f, 2);
  for (auto _ : state) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, kStreamElems, kGrain),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        std::memcpy(c.data() + r.begin(), a.data() + r.begin(),
                                    sizeof(float) * (r.end() - r.begin()));
                      });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kStreamElems * 8);
}
BENCHMARK(BM_StreamCopy)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_StreamTriad(benchmark::State& state) {
  std::vector<float> a(kStreamElems), b(kStreamElems), c(kStreamElems);
  Fill(a.data(), kStreamElems, 1.0f, 1);
  Fill(b.data(), kStreamElems, 1.0f, 2);
  Fill(c.data(), kStreamElems, 1.0f, 3);
  const float s = 3.0f;
  for (auto _ : state) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, kStreamElems, kGrain),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        float* __restrict pa = a.data();
                        const float* __restrict pb = b.data();
                        const float* __restrict pc = c.data();
                        for (int64_t i = r.begin(); i < r.end(); ++i) pa[i] = pb[i] + s * pc[i];
                      });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kStreamElems * 12);
}
BENCHMARK(BM_StreamTriad)->Unit(benchmark::kMillisecond)->UseRealTime();

// In-place read-modify-write a += s * b: 12 bytes per element and, unlike triad, no
// write-allocate traffic, the access pattern of Adam (every written array is also read). The
// bandwidth limit the Adam rows are compared with.
void BM_StreamRmw(benchmark::State& state) {
  std::vector<float> a(kStreamElems), b(kStreamElems);
  Fill(a.data(), kStreamElems, 1.0f, 1);
  Fill(b.data(), kStreamElems, 1.0f, 2);
  const float s = 1e-7f;
  for (auto _ : state) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, kStreamElems, kGrain),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        float* __restrict pa = a.data();
                        const float* __restrict pb = b.data();
                        for (int64_t i = r.begin(); i < r.end(); ++i) pa[i] += s * pb[i];
                      });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kStreamElems * 12);
}
BENCHMARK(BM_StreamRmw)->Unit(benchmark::kMillisecond)->UseRealTime();

// ---------------------------------------------------------------------------------------------
// Adam: ours (fused, fp32 or bf16 gradient) vs LibTorch's C++ optimizers, same sizes.

void SetAdamCounters(benchmark::State& state, int64_t n, int64_t bytes_per_param) {
  state.counters["params_per_s"] =
      benchmark::Counter(static_cast<double>(n) * state.iterations(), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(state.iterations() * n * bytes_per_param);
}

// Ours, ZeRO-style full update: AdamW (wd 0.01) on the fp32 master; bf16 == true takes a bf16
// gradient and also writes the bf16 parameter (the mode-zero path), else an fp32 gradient.
void AdamOurs(benchmark::State& state, bool bf16, bool undo = false) {
  const int64_t n = state.range(0);
  std::vector<float> record(undo ? 3 * n : 0);
  std::vector<float> g(n), m(n), v(n), w(n);
  Fill(g.data(), n, 1e-2f, 1);
  Fill(w.data(), n, 1.0f, 2);
  Fill(m.data(), n, 0.0f, 3);
  Fill(v.data(), n, 0.0f, 4);
  std::vector<uint16_t> g16, out16;
  AdamOperands ops;
  if (bf16) {
    g16.resize(n);
    out16.resize(n);
    for (int64_t i = 0; i < n; ++i) g16[i] = lspo::runtime::Fp32ToBf16(g[i]);
    g = {};
    ops.grad_bf16 = g16.data();
    ops.out_bf16 = out16.data();
  } else {
    ops.grad_fp32 = g.data();
  }
  ops.m = m.data();
  ops.v = v.data();
  ops.out = w.data();
  ops.accumulate = true;
  ops.undo = undo ? record.data() : nullptr;  // the zero-mode record before the verdict
  ops.n = n;
  AdamHyper h;
  h.weight_decay = 0.01f;
  int64_t step = 0;
  for (auto _ : state) {
    lspo::lsp::FusedAdamStep(h, ++step, ops);
    benchmark::ClobberMemory();
  }
  SetAdamCounters(state, n, 28);  // the step's own bytes: the rate shows the record's cost
}
void BM_AdamOursFp32(benchmark::State& state) { AdamOurs(state, false); }
void BM_AdamOursBf16(benchmark::State& state) { AdamOurs(state, true); }
// Zero mode before the worker's verdict (issue 43): the same step writing the master, m and v
// it reads into an undo record in the same pass (AdamOperands::undo: 12 bytes more written).
void BM_AdamOursBf16Undo(benchmark::State& state) { AdamOurs(state, true, true); }
LSPO_SIZED(BM_AdamOursFp32);
LSPO_SIZED(BM_AdamOursBf16);
LSPO_SIZED(BM_AdamOursBf16Undo);

template <typename Opt, typename Options>
void TorchAdam(benchmark::State& state, Options options) {
  const int64_t n = state.range(0);
  torch::NoGradGuard no_grad;
  at::Tensor p = at::rand({n}) - 0.5;
  p.set_requires_grad(true);
  p.mutable_grad() = (at::rand({n}) - 0.5) * 1e-2;
  Opt opt(std::vector<at::Tensor>{p}, options);
  opt.step();  // allocates the moments outside the timed loop
  for (auto _ : state) {
    opt.step();
    benchmark::ClobberMemory();
  }
  SetAdamCounters(state, n, 28);
}
void BM_TorchAdam(benchmark::State& state) {
  TorchAdam<torch::optim::Adam>(state, torch::optim::AdamOptions(1e-3));
}
void BM_TorchAdamW(benchmark::State& state) {
  TorchAdam<torch::optim::AdamW>(state, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
}
LSPO_SIZED(BM_TorchAdam);
LSPO_SIZED(BM_TorchAdamW);

// ---------------------------------------------------------------------------------------------
// fp32 GEMM through LibTorch's BLAS (issue 46): C (M, N) = A (M, K) B (K, N), 2MKN FLOPs per
// product; SmolLM2-135M's linears at 1024 tokens (the main job's micro-batch 8 x 128), forward
// (tokens x in x out) and weight gradient (out x tokens x in). scripts/bench_cpu.py times the
// same shapes with torch 2.x (MKL / oneDNN) as the peer. The CPU BLAS and its kernel set are
// in the "cpu_blas" context line (runtime/cpu_blas.h).

void BM_TorchGemm(benchmark::State& state) {
  const int64_t m = state.range(0), k = state.range(1), n = state.range(2);
  torch::manual_seed(0);
  const at::Tensor a = at::randn({m, k});
  const at::Tensor b = at::randn({k, n});
  at::Tensor c = at::mm(a, b);
  for (auto _ : state) {
    at::mm_out(c, a, b);
    benchmark::DoNotOptimize(c.data_ptr<float>());
  }
  state.counters["flops_per_s"] = benchmark::Counter(
      2.0 * static_cast<double>(m * k * n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TorchGemm)
    ->Args({1024, 576, 576})    // q_proj / o_proj forward
    ->Args({1024, 576, 192})    // k_proj / v_proj forward
    ->Args({1024, 576, 1536})   // gate_proj / up_proj forward
    ->Args({1024, 1536, 576})   // down_proj forward
    ->Args({1536, 1024, 576})   // gate_proj / up_proj weight gradient
    ->Args({576, 1024, 1536})   // down_proj weight gradient
    ->Args({1024, 576, 49152})  // the tied LM head forward (vocabulary 49152)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// The fp32 FMA limit of the cores BM_TorchGemm runs on: each benchmark thread runs 16
// independent chains of vector FMAs (a, b, c registers: no memory traffic), 2 FLOPs per lane,
// 16 lanes with AVX-512 and 8 with AVX2 + FMA, whichever the CPU has (runtime/cpu_blas.h).
// Sixteen chains cover the FMA latency (4 cycles) times the two FMA ports of server cores.
// Registered in main() with --threads benchmark threads; flops_per_s is their total.

[[gnu::target("avx512f"), gnu::noinline]] double FmaAvx512(int64_t iters, float scale) {
  __m512 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  const __m512 x = _mm512_set1_ps(scale), y = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm512_fmadd_ps(x, acc[j], y);
  }
  __m512 sum = acc[0];
  for (int j = 1; j < 16; ++j) sum = _mm512_add_ps(sum, acc[j]);
  return _mm512_reduce_add_ps(sum);
}

[[gnu::target("avx2,fma"), gnu::noinline]] double FmaAvx2(int64_t iters, float scale) {
  __m256 acc[16];
  for (int j = 0; j < 16; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j));
  const __m256 x = _mm256_set1_ps(scale), y = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) acc[j] = _mm256_fmadd_ps(x, acc[j], y);
  }
  __m256 sum = acc[0];
  for (int j = 1; j < 16; ++j) sum = _mm256_add_ps(sum, acc[j]);
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  double t = 0;
  for (float f : lanes) t += f;
  return t;
}

void BM_FmaPeak(benchmark::State& state) {
  using lspo::runtime::SimdLevel;
  const SimdLevel level = lspo::runtime::DetectCpuSimdLevel();
  if (level < SimdLevel::kAvx2) {
    state.SkipWithError("no AVX2 + FMA on this CPU");
    return;
  }
  const bool wide = level == SimdLevel::kAvx512;
  constexpr int64_t kIters = 1 << 20;
  for (auto _ : state) {
    float scale = 0.999999f;
    benchmark::DoNotOptimize(scale);  // unknown to the compiler: every call runs
    benchmark::DoNotOptimize(wide ? FmaAvx512(kIters, scale) : FmaAvx2(kIters, scale));
  }
  state.counters["flops_per_s"] = benchmark::Counter(
      2.0 * 16 * (wide ? 16 : 8) * static_cast<double>(kIters),
      // kAvgThreads: with two threads the plain rate counter read 703 GFLOP/s where each
      // thread alone does 176 (Google Benchmark's multi-thread rate is per-thread time based).
      benchmark::Counter::Flags(benchmark::Counter::kIsIterationInvariantRate |
                                benchmark::Counter::kAvgThreads));
  state.SetLabel(wide ? "AVX-512" : "AVX2");
}

// ---------------------------------------------------------------------------------------------
// Compress / apply on SmolLM2 shapes. W is (m, n) in HF layout; N tokens per micro-batch.

constexpr int64_t kTokens = 1024;  // micro-batch 8 x seq_len 128, as in the example jobs

// The operands of one projector benchmark, from state.range = (m, n, d, r): a sparse P (m, d)
// and Q (n, d) with their dense copies (for the dense peers), a layer input X (N, n), an
// output gradient dY (N, m), a weight W (m, n) fp32 and a small step D (d, d) fp32.
class ProjectorFixture : public benchmark::Fixture {
 public:
  void SetUp(const benchmark::State& state) override {
    m = state.range(0);
    n = state.range(1);
    d = state.range(2);
    r = state.range(3);
    p = *SparseProjector::Random(m, d, r, 11);
    q = *SparseProjector::Random(n, d, r, 12);
    pd = p.Dense();
    qd = q.Dense();
    x = at::randn({kTokens, n});
    dy = at::randn({kTokens, m});
    w = at::randn({m, n});
    dd = at::randn({d, d}) * 1e-4;
  }
  // Frees the operands between benchmarks (the fixture object lives for the whole run).
  void TearDown(const benchmark::State&) override {
    p = q = SparseProjector();
    pd = qd = x = dy = w = dd = at::Tensor();
  }

  int64_t m = 0, n = 0, d = 0, r = 0;
  SparseProjector p, q;
  at::Tensor pd, qd;  // Dense (m, d), (n, d).
  at::Tensor x, dy, w, dd;
};

BENCHMARK_DEFINE_F(ProjectorFixture, CompressOurs)(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    // As the LSP linear does: (X Q)^T in the forward, S from dY in the backward.
    const at::Tensor xq_t = lspo::lsp::ProjectRowsTransposed(x, {&q})[0];  // (d, N)
    at::Tensor s = lspo::lsp::CompressFactored(dy, xq_t.t(), p);         // (d, d)
    benchmark::DoNotOptimize(s.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * kTokens * (m + n) * 4);
}
BENCHMARK_DEFINE_F(ProjectorFixture, CompressDense)(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    at::Tensor s = dy.mm(pd).t().mm(x.mm(qd));  // (d, d)
    benchmark::DoNotOptimize(s.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * kTokens * (m + n) * 4);
}
BENCHMARK_DEFINE_F(ProjectorFixture, ApplyOurs)(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    lspo::lsp::ApplyStep(w, p, dd, q);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * m * n * 8);
}
// The fused apply into bf16 weights: stochastic rounding (4 bytes per element: W read and
// written) and compensated (8: W and its residual C).
BENCHMARK_DEFINE_F(ProjectorFixture, ApplyOursBf16Stochastic)(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  at::Tensor w16 = w.to(at::kBFloat16);
  uint64_t seed = 1;
  for (auto _ : state) {
    lspo::lsp::ApplyStepFused(w16, nullptr, p, dd, q, 1.0, lspo::lsp::Rounding::kStochastic,
                              seed++);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * m * n * 4);
}
BENCHMARK_DEFINE_F(ProjectorFixture, ApplyOursBf16Compensated)(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  at::Tensor w16 = w.to(at::kBFloat16);
  at::Tensor c16 = at::zeros_like(w16);
  for (auto _ : state) {
    lspo::lsp::ApplyStepCompensated(w16, c16, p, dd, q, 1.0);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * m * n * 8);
}
BENCHMARK_DEFINE_F(ProjectorFixture, ApplyDense)(benchmark::State& state) {
  torch::NoGradGuard no_grad;
  for (auto _ : state) {
    w.add_(pd.mm(dd).mm(qd.t()));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * m * n * 8);
}

// SmolLM2-135M weight shapes (m, n): q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536;
// d in {128, 256, 512} where d < min(m, n) (both sides compressed), r in {4, 8, 16}. The dense
// peers do not depend on r and run with r = 4 only.
void ProjectorArgs(benchmark::internal::Benchmark* b, bool all_r) {
  const int64_t shapes[4][2] = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}};
  for (const auto& s : shapes) {
    for (int64_t d : {128, 256, 512}) {
      if (d >= std::min(s[0], s[1])) continue;
      for (int64_t r : {4, 8, 16}) {
        if (!all_r && r != 4) continue;
        b->Args({s[0], s[1], d, r});
      }
    }
  }
  b->ArgNames({"m", "n", "d", "r"})->Unit(benchmark::kMicrosecond)->UseRealTime();
}
BENCHMARK_REGISTER_F(ProjectorFixture, CompressOurs)->Apply([](benchmark::internal::Benchmark* b) {
  ProjectorArgs(b, true);
});
BENCHMARK_REGISTER_F(ProjectorFixture, CompressDense)->Apply([](benchmark::internal::Benchmark* b) {
  ProjectorArgs(b, false);
});
BENCHMARK_REGISTER_F(ProjectorFixture, ApplyOurs)->Apply([](benchmark::internal::Benchmark* b) {
  ProjectorArgs(b, true);
});
BENCHMARK_REGISTER_F(ProjectorFixture, ApplyDense)->Apply([](benchmark::internal::Benchmark* b) {
  ProjectorArgs(b, false);
});
BENCHMARK_REGISTER_F(ProjectorFixture, ApplyOursBf16Stochastic)
    ->Apply([](benchmark::internal::Benchmark* b) { ProjectorArgs(b, true); });
BENCHMARK_REGISTER_F(ProjectorFixture, ApplyOursBf16Compensated)
    ->Apply([](benchmark::internal::Benchmark* b) { ProjectorArgs(b, true); });

// ---------------------------------------------------------------------------------------------
// Data plane.

// Slot write (private -> shared arena) then read (arena -> private), state.range(0) bytes each.
void BM_ArenaSlotWriteRead(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  auto arena = lspo::runtime::ShmArena::Create(
      lspo::runtime::ShmArena::UniqueName("bench"), static_cast<size_t>(bytes));
  if (!arena.ok()) {
    state.SkipWithError(std::string(arena.status().message()).c_str());
    return;
  }
  std::vector<uint8_t> src(bytes + 4096, 1), dst(bytes + 4096, 0);
  uint8_t* s = src.data();
  uint8_t* d = dst.data() + 2176;  // see BM_MemcpyWriteRead
  uint8_t* slot = arena->data();
  std::memset(slot, 0, bytes);
  for (auto _ : state) {
    std::memcpy(slot, s, bytes);
    std::memcpy(d, slot, bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes * 2);
}
// The same two copies between private buffers (the peer: what a copy can do at all).
void BM_MemcpyWriteRead(benchmark::State& state) {
  const int64_t bytes = state.range(0);
  // Offsets keep the three buffers off the same 4 KiB page offset (4K aliasing would make
  // small copies between back-to-back heap blocks several times slower).
  std::vector<uint8_t> src(bytes + 4096, 1), mid(bytes + 4096, 0), dst(bytes + 4096, 0);
  uint8_t* s = src.data();
  uint8_t* m = mid.data() + 1088;
  uint8_t* d = dst.data() + 2176;
  for (auto _ : state) {
    std::memcpy(m, s, bytes);
    std::memcpy(d, m, bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes * 2);
}
// 64 KiB: one d=128 fp32 S; 1.7 MiB: one bf16 gate_proj gradient; 64 MiB: DRAM-bound.
BENCHMARK(BM_ArenaSlotWriteRead)->Arg(65536)->Arg(1769472)->Arg(64 << 20)->UseRealTime();
BENCHMARK(BM_MemcpyWriteRead)->Arg(65536)->Arg(1769472)->Arg(64 << 20)->UseRealTime();

// One SmolLM2 decoder layer's seven linears (HF order q, k, v, o, gate, up, down) as (m, n).
constexpr int64_t kLayerShapes[7][2] = {{576, 576},  {192, 576},  {192, 576}, {576, 576},
                                        {1536, 576}, {1536, 576}, {576, 1536}};

// Per-layer offload -> CPU update -> upload through a real shared-memory arena and completion
// flags, the worker (this thread) and the optimizer (a second thread) exchanging futex-waited
// sequence numbers exactly as in a training step. state.range(0) = d (lsp: S (d, d) fp32 out,
// subspace Adam, D (d, d) fp32 back); d == 0 means the ZeRO-style path (bf16 G (m, n) out,
// fused AdamW on fp32 master + moments, bf16 parameters back).
void BM_LayerRoundTrip(benchmark::State& state) {
  const int64_t d = state.range(0);
  const bool zero = d == 0;
  std::vector<int64_t> numel(7), offset(7);
  int64_t total = 0;
  for (int i = 0; i < 7; ++i) {
    numel[i] = zero ? kLayerShapes[i][0] * kLayerShapes[i][1] : d * d;
    offset[i] = total;
    total += numel[i] * (zero ? 2 : 4);
  }
  const int64_t flags_at = (2 * total + 63) / 64 * 64;  // grads, then steps, then flags
  auto arena = lspo::runtime::ShmArena::Create(
      lspo::runtime::ShmArena::UniqueName("bench-rt"),
      static_cast<size_t>(flags_at + lspo::runtime::CompletionFlags::Bytes(7)));
  if (!arena.ok()) {
    state.SkipWithError(std::string(arena.status().message()).c_str());
    return;
  }
  std::memset(arena->data(), 0, flags_at + lspo::runtime::CompletionFlags::Bytes(7));
  lspo::runtime::CompletionFlags flags(arena->data() + flags_at, 7);
  uint8_t* grads = arena->data();
  uint8_t* steps = arena->data() + total;
  // Worker-side tensors (the "device" copies) and optimizer state.
  std::vector<std::vector<float>> worker_f32(7), m(7), v(7), master(7);
  std::vector<std::vector<uint16_t>> worker_bf16(7);
  std::vector<std::unique_ptr<lspo::lsp::SubspaceAdam>> sub(7);
  for (int i = 0; i < 7; ++i) {
    if (zero) {
      worker_bf16[i].assign(numel[i], lspo::runtime::Fp32ToBf16(1e-3f));
      m[i].assign(numel[i], 0.0f);
      v[i].assign(numel[i], 0.0f);
      master[i].assign(numel[i], 0.5f);
    } else {
      worker_f32[i].assign(numel[i], 1e-3f);
      sub[i] = std::make_unique<lspo::lsp::SubspaceAdam>(d);
    }
  }
  AdamHyper h;
  const int64_t iterations = state.max_iterations;
  std::atomic<bool> failed{false};
  std::thread optimizer([&] {
    for (int64_t s = 1; s <= iterations; ++s) {
      for (int i = 6; i >= 0; --i) {  // the backward publishes the deepest linear first
        if (!flags.WaitGrad(i, static_cast<uint32_t>(s), absl::Seconds(60)).ok()) {
          failed = true;
          return;
        }
        if (zero) {
          AdamOperands ops;
          ops.grad_bf16 = reinterpret_cast<const uint16_t*>(grads + offset[i]);
          ops.m = m[i].data();
          ops.v = v[i].data();
          ops.out = master[i].data();
          ops.accumulate = true;
          ops.out_bf16 = reinterpret_cast<uint16_t*>(steps + offset[i]);
          ops.n = numel[i];
          lspo::lsp::FusedAdamStep(h, s, ops);
        } else {
          (void)sub[i]->Step(h, reinterpret_cast<const float*>(grads + offset[i]),
                             reinterpret_cast<float*>(steps + offset[i]));
        }
        flags.PublishStep(i, static_cast<uint32_t>(s));
      }
    }
  });
  int64_t s = 0;
  for (auto _ : state) {
    ++s;
    for (int i = 6; i >= 0; --i) {  // offload: gradient into the slot, then publish
      const size_t bytes = numel[i] * (zero ? 2 : 4);
      std::memcpy(grads + offset[i], zero ? static_cast<void*>(worker_bf16[i].data())
                                          : static_cast<void*>(worker_f32[i].data()),
                  bytes);
      flags.PublishGrad(i, static_cast<uint32_t>(s));
    }
    for (int i = 0; i < 7; ++i) {  // upload: wait for the update, copy it back
      if (!flags.WaitStep(i, static_cast<uint32_t>(s), absl::Seconds(60)).ok()) failed = true;
      const size_t bytes = numel[i] * (zero ? 2 : 4);
      std::memcpy(zero ? static_cast<void*>(worker_bf16[i].data())
                       : static_cast<void*>(worker_f32[i].data()),
                  steps + offset[i], bytes);
    }
  }
  optimizer.join();
  if (failed) state.SkipWithError("a completion-flag wait timed out");
  state.counters["us_per_layer"] = benchmark::Counter(
      static_cast<double>(state.iterations()) * 1e-6,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.SetBytesProcessed(state.iterations() * total * 2);
}
// d = 0: ZeRO-style; d = 64, 128: LSP. Fixed iteration counts (the helper thread must know it).
BENCHMARK(BM_LayerRoundTrip)->Arg(0)->Iterations(50)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayerRoundTrip)->Arg(64)->Iterations(2000)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LayerRoundTrip)->Arg(128)->Iterations(1000)->UseRealTime()->Unit(benchmark::kMicrosecond);

// One unary control RPC (Optimizer.AbortStep for an unknown job: a full request/response with
// an error status, no work) on 127.0.0.1 against the real service class, in-process.
void BM_GrpcRoundTrip(benchmark::State& state) {
  lspo::optimizer::OptimizerCore core;
  lspo::optimizer::OptimizerService service(&core);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    state.SkipWithError("cannot start a gRPC server on 127.0.0.1");
    return;
  }
  auto stub = lspo::v1::Optimizer::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  lspo::v1::AbortStepRequest req;
  req.set_job_id("bench-no-such-job");
  req.set_step(1);
  for (auto _ : state) {
    grpc::ClientContext ctx;
    lspo::v1::AbortStepReply reply;
    benchmark::DoNotOptimize(stub->AbortStep(&ctx, req, &reply));
  }
  server->Shutdown();
}
BENCHMARK(BM_GrpcRoundTrip)->UseRealTime()->Unit(benchmark::kMicrosecond);

}  // namespace

// --threads=N (default: all cores) caps both oneTBB and ATen, so every group runs on the same
// cores; the remaining flags go to Google Benchmark.
int main(int argc, char** argv) {
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<char*> rest;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      threads = std::max(1, std::atoi(argv[i] + 10));
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  at::set_num_threads(threads);
  tbb::global_control cap(tbb::global_control::max_allowed_parallelism, threads);
  benchmark::AddCustomContext("threads", std::to_string(threads));
  benchmark::AddCustomContext("cpu_blas", lspo::runtime::CpuBlas().Line());
  benchmark::RegisterBenchmark("BM_FmaPeak", BM_FmaPeak)
      ->Threads(threads)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::Initialize(&rest_argc, rest.data());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
