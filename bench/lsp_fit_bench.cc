// Projector fit cost per weight matrix (SmolLM2 shapes), fp64 vs fp32 objective.
// Run: build/bench/lsp_fit_bench --benchmark_min_time=1
#include <benchmark/benchmark.h>
#include "third_party/torch/torch_api.h"

#include "lsp/fit.h"
#include "lsp/projector.h"

namespace {

void BM_Fit(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), d = state.range(2), r = 4;
  const bool f64 = state.range(3) != 0;
  at::set_num_threads(1);
  at::manual_seed(0);
  // A low-rank-plus-noise gradient, like a real one.
  at::Tensor g = at::matmul(at::randn({m, 8}), at::randn({8, n})) + 0.1 * at::randn({m, n});
  lspo::lsp::FitOptions opts;
  opts.max_iters = 10;
  opts.float64 = f64;
  for (auto _ : state) {
    auto p = *lspo::lsp::SparseProjector::Random(m, d, r, 1);
    auto q = *lspo::lsp::SparseProjector::Random(n, d, r, 2);
    auto res = lspo::lsp::FitProjectors(g, &p, &q, opts);
    benchmark::DoNotOptimize(res);
  }
  state.counters["iters_per_s"] = benchmark::Counter(10.0 * state.iterations(),
                                                     benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Fit)
    ->Args({576, 576, 128, 1})
    ->Args({576, 576, 128, 0})
    ->Args({1536, 576, 128, 1})
    ->Args({1536, 576, 128, 0})
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
