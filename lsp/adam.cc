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
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"
#include "tbb/parallel_reduce.h"

namespace lspo::lsp {
namespace {

// Elements per TBB task: ~64 KiB of each stream, big enough to amortise scheduling, small
// enough to split a 1M-element tensor across 16 cores.
constexpr int64_t kGrain = 16384;

// Per-step scalars shared by every element (fp32, derived in float64 from the int64 step).
struct StepScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size;       // lr / (1 - beta1^t)
  float inv_sqrt_bc2;    // 1 / sqrt(1 - beta2^t)
  float eps;
  float decay;           // 1 - lr * weight_decay (accumulate mode only)
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

// The element loop. `kAccumulate` is a template parameter so the branch is hoisted out of the
// loop and both bodies vectorise (adam.cc is compiled with -fno-math-errno so sqrtf does).
template <bool kAccumulate>
void AdamChunk(const StepScalars& s, const float* __restrict grad, float* __restrict m,
               float* __restrict v, float* __restrict out, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = grad[i];
    const float mi = s.beta1 * m[i] + s.one_minus_beta1 * g;
    const float vi = s.beta2 * v[i] + s.one_minus_beta2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    const float delta = -s.step_size * mi / (std::sqrt(vi) * s.inv_sqrt_bc2 + s.eps);
    if constexpr (kAccumulate) {
      out[i] = out[i] * s.decay + delta;
    } else {
      out[i] = delta;
    }
  }
}

bool IsFiniteBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return (bits & 0x7f800000u) != 0x7f800000u;
}

// Index of the first non-finite element in [begin, end), or `end` if none. The first pass is
// a branch-free OR over exponent bits (vectorises); only a bad chunk is scanned again.
int64_t FirstNonFinite(const float* x, int64_t begin, int64_t end) {
  uint32_t any_bad = 0;
  for (int64_t i = begin; i < end; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    any_bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (any_bad == 0) return end;
  for (int64_t i = begin; i < end; ++i) {
    if (!IsFiniteBits(x[i])) return i;
  }
  return end;
}

}  // namespace

absl::Status ValidateAdamHyper(const AdamHyper& h) {
  auto bad = [](absl::string_view field, float value, absl::string_view range) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AdamHyper.%s = %g is invalid: expected %s; fix the optimizer configuration", field,
        value, range));
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

void AdamStep(const AdamHyper& h, int64_t step, const float* grad, float* m, float* v,
              float* out, int64_t n, bool accumulate_into_out) {
  CHECK_GE(step, 1) << "AdamStep: step is 1-based (after the increment)";
  CHECK_GE(n, 0);
  if (n == 0) return;
  CHECK(grad != nullptr && m != nullptr && v != nullptr && out != nullptr);
  CHECK(static_cast<const void*>(grad) != static_cast<const void*>(out))
      << "AdamStep: grad and out must not alias";
  const StepScalars s = MakeScalars(h, step);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kGrain),
                    [&](const tbb::blocked_range<int64_t>& range) {
                      if (accumulate_into_out) {
                        AdamChunk<true>(s, grad, m, v, out, range.begin(), range.end());
                      } else {
                        AdamChunk<false>(s, grad, m, v, out, range.begin(), range.end());
                      }
                    });
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
  const int64_t first = tbb::parallel_reduce(
      tbb::blocked_range<int64_t>(0, n, kGrain), n,
      [&](const tbb::blocked_range<int64_t>& range, int64_t best) {
        if (range.begin() >= best) return best;  // an earlier bad element is already known
        const int64_t found = FirstNonFinite(x, range.begin(), range.end());
        return found < range.end() ? std::min(best, found) : best;
      },
      [](int64_t a, int64_t b) { return std::min(a, b); });
  if (first == n) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s: element %d of %d is %g; expected only finite values. Fix: find the source of the "
      "overflow/NaN (lower the learning rate, use loss scaling or gradient clipping) and skip "
      "this step instead of applying it",
      what, first, n, x[first]));
}

SubspaceAdam::SubspaceAdam(int64_t d)
    : d_(d),
      m_(static_cast<size_t>(d > 0 ? d * d : 0), 0.0f),
      v_(static_cast<size_t>(d > 0 ? d * d : 0), 0.0f) {}

absl::Status SubspaceAdam::Step(const AdamHyper& h, const float* S, float* D) {
  if (d_ <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SubspaceAdam: subspace dimension d = %d; expected d > 0. Construct it with the "
        "projectors' d",
        d_));
  }
  if (S == nullptr || D == nullptr) {
    return absl::InvalidArgumentError("SubspaceAdam::Step: S and D must be non-null (d, d) "
                                      "fp32 buffers");
  }
  absl::Status st = ValidateAdamHyper(h);
  if (!st.ok()) return st;
  st = CheckFinite(S, d_ * d_, "compressed gradient S = P^T G Q");
  if (!st.ok()) return st;
  ++step_;
  AdamStep(h, step_, S, m_.data(), v_.data(), D, d_ * d_, /*accumulate_into_out=*/false);
  return absl::OkStatus();
}

absl::Status SubspaceAdam::Restore(int64_t step, std::vector<float> m, std::vector<float> v) {
  const size_t want = static_cast<size_t>(d_ > 0 ? d_ * d_ : 0);
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SubspaceAdam::Restore: step = %d; expected >= 0 (the checkpoint is corrupt)", step));
  }
  if (m.size() != want || v.size() != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SubspaceAdam::Restore: moment sizes m=%d v=%d; expected d*d = %d for d = %d. The "
        "checkpoint was written with another subspace dimension",
        m.size(), v.size(), want, d_));
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
