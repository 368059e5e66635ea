// CPU Adam kernel, finiteness check and subspace optimizer. See adam.h for the contract.
#include "lsp/adam.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "runtime/cpu_clones.h"
#include "runtime/float16.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/parallel_reduce.h"
#include "tbb/partitioner.h"

namespace lspo::lsp {
namespace {

// Elements per TBB task: ~64 KiB of each stream, big enough to amortise scheduling, small
// enough to split a 1M-element tensor across 16 cores.
constexpr int64_t kGrain = 16384;

// Per-step scalars shared by every element (fp32, derived in float64 from the int64 step).
struct StepScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size;     // lr / (1 - beta1^t)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float eps;
  float decay;  // 1 - lr * weight_decay (accumulate mode only)
};

StepScalars MakeScalars(const AdamHyper& h, int64_t step) {
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  StepScalars s;
  s.beta1 = h.beta1;
  s.one_minus_beta1 = static_cast<float>(1.0 - static_cast<double>(h.beta1));
  s.beta2 = h.beta2;
  s.one_minus_beta2 = static_cast<float>(1.0 - static_cast<double>(h.beta2));
  s.step_size = static_cast<float>(static_cast<double>(h.lr) / bc1);
  s.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  s.eps = h.eps;
  s.decay = static_cast<float>(1.0 - static_cast<double>(h.lr) * h.weight_decay);
  return s;
}

// Gradient loaders: fp32 as is, bf16 by widening the bits (exact).
struct Fp32Grad {
  __attribute__((always_inline)) static float Load(const float* g, int64_t i) { return g[i]; }
};
struct Bf16Grad {
  __attribute__((always_inline)) static float Load(const uint16_t* g, int64_t i) {
    return runtime::Bf16ToFp32(g[i]);
  }
};

// The element loop, inlined into one clone per ISA below. kAccumulate / kBf16Out are template
// parameters so the branches are hoisted out of the loop and every body vectorises (adam.cc is
// compiled with -fno-math-errno so sqrtf does; the bf16 rounding is branch-free bit math).
template <typename Load, typename GradT, bool kAccumulate, bool kBf16Out>
__attribute__((always_inline)) inline void AdamBody(const StepScalars& s, float grad_scale,
                                                    const GradT* __restrict grad,
                                                    float* __restrict m, float* __restrict v,
                                                    float* __restrict out,
                                                    uint16_t* __restrict out_bf16, int64_t begin,
                                                    int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = Load::Load(grad, i) * grad_scale;
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    // __builtin_sqrtf, not std::sqrt: the std wrapper is not inlined into the ISA clones.
    const float delta = -s.step_size * mi / (__builtin_sqrtf(vi) * s.inv_sqrt_bc2 + s.eps);
    if constexpr (kAccumulate) {
      const float w = out[i] * s.decay + delta;
      out[i] = w;
      if constexpr (kBf16Out) out_bf16[i] = runtime::Fp32ToBf16(w);
    } else {
      out[i] = delta;
    }
  }
}

// One function per (gradient dtype, mode) so that GCC can clone each for AVX-512, AVX2+FMA and
// baseline x86-64 and pick one at load time (ifunc). Non-x86 builds get the plain loop.

#define LSPO_DEFINE_ADAM_CHUNK(NAME, LOAD, GRADT, ACC, BF16OUT)                                  \
  LSPO_CPU_CLONES void NAME(const StepScalars& s, float grad_scale, const GRADT* grad, float* m, \
                            float* v, float* out, uint16_t* out_bf16, int64_t begin,             \
                            int64_t end) {                                                       \
    AdamBody<LOAD, GRADT, ACC, BF16OUT>(s, grad_scale, grad, m, v, out, out_bf16, begin, end);   \
  }
LSPO_DEFINE_ADAM_CHUNK(ChunkF32Delta, Fp32Grad, float, false, false)
LSPO_DEFINE_ADAM_CHUNK(ChunkF32Acc, Fp32Grad, float, true, false)
LSPO_DEFINE_ADAM_CHUNK(ChunkF32AccBf16, Fp32Grad, float, true, true)
LSPO_DEFINE_ADAM_CHUNK(ChunkBf16Delta, Bf16Grad, uint16_t, false, false)
LSPO_DEFINE_ADAM_CHUNK(ChunkBf16Acc, Bf16Grad, uint16_t, true, false)
LSPO_DEFINE_ADAM_CHUNK(ChunkBf16AccBf16, Bf16Grad, uint16_t, true, true)
#undef LSPO_DEFINE_ADAM_CHUNK

// The zero-mode step (bf16 gradient, fp32 master, bf16 parameter) that also writes the state
// it reads, before the update, into an undo record (record[i] = w, record[n + i] = m,
// record[2 n + i] = v): 12 bytes more written per parameter, in the same pass.
LSPO_CPU_CLONES void ChunkBf16AccBf16Undo(const StepScalars& s, float grad_scale,
                                          const uint16_t* __restrict grad, float* __restrict m,
                                          float* __restrict v, float* __restrict out,
                                          uint16_t* __restrict out_bf16, float* __restrict record,
                                          int64_t n, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    record[i] = out[i];
    record[n + i] = m[i];
    record[2 * n + i] = v[i];
  }
  AdamBody<Bf16Grad, uint16_t, true, true>(s, grad_scale, grad, m, v, out, out_bf16, begin, end);
}

// Sum of squares over [begin, end) with 8 float64 partial sums, and whether any element has
// an all-ones exponent (NaN/Inf). Branch-free, so it vectorises.
template <typename Load, typename GradT>
__attribute__((always_inline)) inline void StatsBody(const GradT* __restrict x, int64_t begin,
                                                     int64_t end, double* sum_sq, bool* any_bad) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t bad = 0;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    for (int u = 0; u < 8; ++u) {
      const float f = Load::Load(x, i + u);
      bad |= static_cast<uint32_t>((runtime::FloatBits(f) & 0x7f800000u) == 0x7f800000u);
      part[u] += static_cast<double>(f) * f;
    }
  }
  double total = 0;
  for (; i < end; ++i) {
    const float f = Load::Load(x, i);
    bad |= static_cast<uint32_t>((runtime::FloatBits(f) & 0x7f800000u) == 0x7f800000u);
    total += static_cast<double>(f) * f;
  }
  for (int u = 0; u < 8; ++u) total += part[u];
  *sum_sq = total;
  *any_bad = bad != 0;
}
LSPO_CPU_CLONES void StatsF32(const float* x, int64_t begin, int64_t end, double* sum_sq,
                              bool* any_bad) {
  StatsBody<Fp32Grad, float>(x, begin, end, sum_sq, any_bad);
}
LSPO_CPU_CLONES void StatsBf16(const uint16_t* x, int64_t begin, int64_t end, double* sum_sq,
                               bool* any_bad) {
  StatsBody<Bf16Grad, uint16_t>(x, begin, end, sum_sq, any_bad);
}

}  // namespace

absl::Status ValidateAdamHyper(const AdamHyper& h) {
  auto bad = [](absl::string_view field, float value, absl::string_view range) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AdamHyper.%s = %g is invalid: expected %s; fix the optimizer configuration", field, value,
        range));
  };
  if (!std::isfinite(h.lr) || h.lr < 0) return bad("lr", h.lr, "a finite value >= 0");
  if (!(h.beta1 >= 0 && h.beta1 < 1)) return bad("beta1", h.beta1, "a value in [0, 1)");
  if (!(h.beta2 >= 0 && h.beta2 < 1)) return bad("beta2", h.beta2, "a value in [0, 1)");
  if (!std::isfinite(h.eps) || h.eps <= 0) return bad("eps", h.eps, "a finite value > 0");
  if (!std::isfinite(h.weight_decay) || h.weight_decay < 0) {
    return bad("weight_decay", h.weight_decay, "a finite value >= 0");
  }
  return absl::OkStatus();
}

void FusedAdamStep(const AdamHyper& h, int64_t step, const AdamOperands& ops) {
  CHECK_GE(step, 1) << "FusedAdamStep: step is 1-based (after the increment)";
  CHECK_GE(ops.n, 0);
  if (ops.n == 0) return;
  CHECK((ops.grad_fp32 != nullptr) != (ops.grad_bf16 != nullptr))
      << "FusedAdamStep: pass exactly one of grad_fp32 / grad_bf16";
  CHECK(ops.m != nullptr && ops.v != nullptr && ops.out != nullptr);
  CHECK(ops.out_bf16 == nullptr || ops.accumulate)
      << "FusedAdamStep: out_bf16 needs accumulate (it is the rounded master weight)";
  CHECK(static_cast<const void*>(ops.grad_fp32) != static_cast<const void*>(ops.out))
      << "FusedAdamStep: grad and out must not alias";
  CHECK(ops.undo == nullptr || (ops.grad_bf16 != nullptr && ops.out_bf16 != nullptr))
      << "FusedAdamStep: undo is for the zero-mode step (bf16 gradient and parameter)";
  const StepScalars s = MakeScalars(h, step);
  const AdamOperands o = ops;
  if (o.undo != nullptr) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, o.n, kGrain),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        ChunkBf16AccBf16Undo(s, o.grad_scale, o.grad_bf16, o.m, o.v, o.out,
                                             o.out_bf16, o.undo, o.n, r.begin(), r.end());
                      });
    return;
  }
  // The variant (gradient dtype, accumulate, bf16 copy) is chosen once per call; its ISA clone
  // was chosen once per process (ifunc). The chunks only run it.
  auto run = [&](auto chunk, const auto* grad) {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, o.n, kGrain), [&](const tbb::blocked_range<int64_t>& r) {
          chunk(s, o.grad_scale, grad, o.m, o.v, o.out, o.out_bf16, r.begin(), r.end());
        });
  };
  using F32Chunk = void (*)(const StepScalars&, float, const float*, float*, float*, float*,
                            uint16_t*, int64_t, int64_t);
  using Bf16Chunk = void (*)(const StepScalars&, float, const uint16_t*, float*, float*, float*,
                             uint16_t*, int64_t, int64_t);
  if (o.grad_fp32 != nullptr) {
    const F32Chunk chunk = !o.accumulate           ? &ChunkF32Delta
                           : o.out_bf16 == nullptr ? &ChunkF32Acc
                                                   : &ChunkF32AccBf16;
    run(chunk, o.grad_fp32);
  } else {
    const Bf16Chunk chunk = !o.accumulate           ? &ChunkBf16Delta
                            : o.out_bf16 == nullptr ? &ChunkBf16Acc
                                                    : &ChunkBf16AccBf16;
    run(chunk, o.grad_bf16);
  }
}

void RestoreAdamState(const float* record, float* w, float* m, float* v, int64_t n) {
  CHECK_GE(n, 0);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kGrain),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      const size_t bytes = (r.end() - r.begin()) * sizeof(float);
                      std::memcpy(w + r.begin(), record + r.begin(), bytes);
                      std::memcpy(m + r.begin(), record + n + r.begin(), bytes);
                      std::memcpy(v + r.begin(), record + 2 * n + r.begin(), bytes);
                    });
}

void AdamStep(const AdamHyper& h, int64_t step, const float* grad, float* m, float* v, float* out,
              int64_t n, bool accumulate_into_out) {
  AdamOperands ops;
  ops.grad_fp32 = grad;
  ops.m = m;
  ops.v = v;
  ops.out = out;
  ops.accumulate = accumulate_into_out;
  ops.n = n;
  FusedAdamStep(h, step, ops);
}

namespace {
template <typename T, typename Chunk>
GradientStats Stats(const T* x, int64_t n, Chunk chunk) {
  CHECK_GE(n, 0);
  GradientStats out;
  if (n == 0) return out;
  CHECK(x != nullptr) << "ComputeGradientStats: null buffer for " << n << " elements";
  struct Partial {
    double sum_sq = 0;
    bool any_bad = false;
  };
  // Deterministic: fixed chunk boundaries and a fixed join order, so the norm (and the clip
  // coefficient derived from it) is bitwise reproducible run to run.
  const Partial total = tbb::parallel_deterministic_reduce(
      tbb::blocked_range<int64_t>(0, n, kGrain), Partial{},
      [&](const tbb::blocked_range<int64_t>& r, Partial acc) {
        double sq = 0;
        bool bad = false;
        chunk(x, r.begin(), r.end(), &sq, &bad);
        acc.sum_sq += sq;
        acc.any_bad = acc.any_bad || bad;
        return acc;
      },
      [](Partial a, const Partial& b) {
        a.sum_sq += b.sum_sq;
        a.any_bad = a.any_bad || b.any_bad;
        return a;
      },
      tbb::simple_partitioner());
  out.sum_sq = total.sum_sq;
  if (total.any_bad) {
    for (int64_t i = 0; i < n; ++i) {
      float f;
      if constexpr (sizeof(T) == 2) {
        f = runtime::BitsToFloat(static_cast<uint32_t>(x[i]) << 16);
      } else {
        f = x[i];
      }
      if (!std::isfinite(f)) {
        out.first_non_finite = i;
        break;
      }
    }
  }
  return out;
}
}  // namespace

GradientStats ComputeGradientStats(const float* x, int64_t n) { return Stats(x, n, StatsF32); }

GradientStats ComputeGradientStats(const uint16_t* x_bf16, int64_t n) {
  return Stats(x_bf16, n, StatsBf16);
}

absl::Status NonFiniteError(absl::string_view what, int64_t index, int64_t n, double value) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: element %d of %d is %g; expected only finite values. Fix: find the source of the "
      "overflow/NaN (lower the learning rate, use loss scaling or gradient clipping) and skip "
      "this step instead of applying it",
      what, index, n, value));
}

absl::Status CheckFinite(const float* x, int64_t n, absl::string_view what) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: element count %d is negative; expected >= 0", what, n));
  }
  if (n == 0) return absl::OkStatus();
  if (x == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: null buffer for %d elements; pass the data pointer", what, n));
  }
  // One mechanism for finiteness: the gradient statistics' scan (the norm comes with it).
  const GradientStats stats = ComputeGradientStats(x, n);
  if (stats.first_non_finite < 0) return absl::OkStatus();
  return NonFiniteError(what, stats.first_non_finite, n, x[stats.first_non_finite]);
}

SubspaceAdam::SubspaceAdam(int64_t rows, int64_t cols)
    : rows_(rows),
      cols_(cols),
      m_(static_cast<size_t>(numel()), 0.0f),
      v_(static_cast<size_t>(numel()), 0.0f) {}

absl::Status SubspaceAdam::Step(const AdamHyper& h, const float* S, float* D) {
  if (numel() == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SubspaceAdam: subspace (%d, %d); expected both sizes > 0. Construct it with the "
        "projectors' (d_p, d_q)",
        rows_, cols_));
  }
  if (S == nullptr || D == nullptr) {
    return absl::InvalidArgumentError(
        "SubspaceAdam::Step: S and D must be non-null (d_p, d_q) "
        "fp32 buffers");
  }
  absl::Status st = ValidateAdamHyper(h);
  if (!st.ok()) return st;
  st = CheckFinite(S, numel(), "compressed gradient S = P^T G Q");
  if (!st.ok()) return st;
  ++step_;
  AdamStep(h, step_, S, m_.data(), v_.data(), D, numel(), /*accumulate_into_out=*/false);
  return absl::OkStatus();
}

absl::Status SubspaceAdam::Restore(int64_t step, std::vector<float> m, std::vector<float> v) {
  const size_t want = static_cast<size_t>(numel());
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SubspaceAdam::Restore: step = %d; expected >= 0 (the checkpoint is corrupt)", step));
  }
  if (m.size() != want || v.size() != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SubspaceAdam::Restore: moment sizes m=%d v=%d; expected d_p*d_q = %d for (%d, %d). "
        "The checkpoint was written with another subspace size",
        m.size(), v.size(), want, rows_, cols_));
  }
  absl::Status st = CheckFinite(m.data(), static_cast<int64_t>(m.size()), "restored Adam m");
  if (!st.ok()) return st;
  st = CheckFinite(v.data(), static_cast<int64_t>(v.size()), "restored Adam v");
  if (!st.ok()) return st;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SubspaceAdam::Restore: v[%d] = %g is negative; expected v >= 0 (corrupt state)", i,
          v[i]));
    }
  }
  step_ = step;
  m_ = std::move(m);
  v_ = std::move(v);
  return absl::OkStatus();
}

}  // namespace lspo::lsp
