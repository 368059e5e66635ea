// CPU Adam for LSP-Offload: the element-wise update kernel (used for full fp32 master weights
// in the ZeRO baseline and for the d x d subspace moments of LSP), a finiteness check, and the
// per-weight subspace optimizer. Torch-free (TBB only): it links without LibTorch (the
// sanitizer builds test it so). The CPU optimizer service itself does use LibTorch, for its
// master-weight tensors and the projector algebra of a refit.
//
// Dimension legend (shared by all lsp/ headers):
//   N  tokens in a batch             m  out features of a weight (rows of W)
//   n  in features of a weight       d  subspace dimension (S, D, M, V are (d, d))
//   r  non-zeros per projector row
// HF layout: W is (m, n) and a linear layer computes y = x W^T.
//
// Formula (Kingma & Ba 2015, "Adam", Algorithm 1; eps added AFTER the square root, as in
// torch.optim.Adam/AdamW, so the CPU and GPU paths agree):
//   m_t  = beta1 m_{t-1} + (1 - beta1) g
//   v_t  = beta2 v_{t-1} + (1 - beta2) g^2
//   mhat = m_t / (1 - beta1^t),  vhat = v_t / (1 - beta2^t)
//   delta = -lr * mhat / (sqrt(vhat) + eps)
// Weight decay is decoupled (Loshchilov & Hutter 2019, AdamW): delta -= lr * wd * param. It
// only exists where the parameter is known, i.e. with accumulate_into_out (out == param).
//
// Threading: AdamStep and CheckFinite use TBB parallel_for/parallel_reduce in the calling
// thread's task arena; cap the thread count with tbb::global_control or a tbb::task_arena
// when several processes share a host (docs/known-failures.md #16). SubspaceAdam is not
// thread-safe: one instance per weight, driven by one thread at a time.
#ifndef LSPO_LSP_ADAM_H_
#define LSPO_LSP_ADAM_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lspo::lsp {

// Adam hyper-parameters. Units: lr is in parameter units per step (the step D returned by
// the subspace optimizer already carries it, sign folded in); betas are decay rates in [0, 1);
// eps is added to sqrt(vhat); weight_decay is the decoupled AdamW coefficient (per step,
// multiplied by lr).
struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// Returns kInvalidArgument unless lr, eps, weight_decay are finite and >= 0 (eps > 0) and
// beta1, beta2 lie in [0, 1). The message names the field, the value seen and the valid range.
absl::Status ValidateAdamHyper(const AdamHyper& h);

// Operands of one fused Adam/AdamW step over `n` contiguous elements (any tensor shape: the
// caller passes numel, never size(0); docs/known-failures.md #3). One pass over memory reads the
// gradient, m, v (and the fp32 master) once and writes m, v, the master and the optional bf16
// copy once: 28 bytes per element for a bf16 gradient with bf16 output (2 + 4*6 + 2), 24 for
// the fp32 subspace step (4 + 4*4 + 4).
struct AdamOperands {
  // The gradient g, (n) fp32 OR (n) bf16 bits (exactly one non-null when n > 0). The kernel
  // uses g * grad_scale (grad_scale: the global-norm clip coefficient, 1 = none; the product is
  // one fp32 multiply, so clipping here equals scaling the gradient beforehand bit for bit).
  const float* grad_fp32 = nullptr;
  const uint16_t* grad_bf16 = nullptr;
  float grad_scale = 1.0f;
  float* m = nullptr;  // (n) fp32 first moment, updated in place
  float* v = nullptr;  // (n) fp32 second moment, updated in place
  // accumulate == false: out = delta (the subspace step D; weight_decay ignored).
  // accumulate == true : out = out * (1 - lr*wd) + delta (out is the fp32 master weight).
  float* out = nullptr;
  bool accumulate = false;
  // Optional (accumulate only): out_bf16[i] = bf16(out[i]) after the update, round to nearest
  // even (runtime/float16.h Fp32ToBf16, NaN kept quiet). Null = no bf16 copy.
  uint16_t* out_bf16 = nullptr;
  // Optional (zero-mode step only: grad_bf16, accumulate, out_bf16): 3 n floats that receive,
  // in the same pass, the state before the update: undo[i] = out[i] (the master), undo[n + i]
  // = m[i], undo[2 n + i] = v[i] (12 bytes written per parameter; RestoreAdamState undoes).
  float* undo = nullptr;
  int64_t n = 0;
};

// One fused Adam/AdamW step (formula at the top of this file), the single element kernel of
// the project: the LSP subspace step (d*d elements, fp32 S in, D out) and the ZeRO-style full
// update (bf16 G in, fp32 master + moments, bf16 parameter out) both run through it.
//   step: 1-based step count AFTER the increment for this update (int64; never a 16-bit
//         counter, docs/known-failures.md #13). Bias corrections are computed in float64 from it.
// Element math is fp32. The loop is compiled once per ISA (AVX-512, AVX2+FMA, baseline x86-64)
// and the best one for the running CPU is picked at load time (GCC target_clones); every n,
// including 1 and n not a multiple of the vector width, is handled (scalar tail inside the
// vectorised loop). Work is split across cores with oneTBB in chunks of 16384 elements; each
// element is computed by exactly one task, so results do not depend on the thread count.
// Preconditions (programmer invariants, CHECKed): step >= 1, n >= 0, exactly one gradient
// pointer and non-null m, v, out when n > 0, out_bf16 only with accumulate, the gradient does
// not alias out. Non-finite gradients are NOT filtered (no silent NaN-to-zero): call
// CheckFinite / GradientStats first.
void FusedAdamStep(const AdamHyper& h, int64_t step, const AdamOperands& ops);

// Copies an undo record (AdamOperands::undo: record[0, n) = w, [n, 2n) = m, [2n, 3n) = v, all
// fp32) back into w, m, v, in parallel chunks (oneTBB). Issue 43: the optimizer's zero mode
// keeps one per matrix it updates before the worker's verdict on the step, and restores it
// when the step is skipped. record holds 3 n floats, overlapping none of the others; n >= 0.
void RestoreAdamState(const float* record, float* w, float* m, float* v, int64_t n);

// Convenience form for fp32 gradients: FusedAdamStep with grad_fp32 = grad, grad_scale = 1,
// out_bf16 = null.
//   grad (n) fp32 in; m, v (n) fp32 in/out; out (n) fp32 out (delta) or in/out (master).
void AdamStep(const AdamHyper& h, int64_t step, const float* grad, float* m, float* v, float* out,
              int64_t n, bool accumulate_into_out);

// Finiteness and squared L2 norm of a gradient in one read-only pass (the fused pre-pass of
// the ZeRO-style update: the step must be rejected before any state is touched, and global-norm
// clipping needs sum g^2 before the first update).
struct GradientStats {
  int64_t first_non_finite = -1;  // index of the first NaN/Inf, -1 if all finite
  double sum_sq = 0;              // sum of g^2 in float64 (meaningless if non-finite)
};
// x: (n) fp32 or (n) bf16 bits. n >= 0; x may be null only when n == 0 (CHECKed).
GradientStats ComputeGradientStats(const float* x, int64_t n);
GradientStats ComputeGradientStats(const uint16_t* x_bf16, int64_t n);

// Returns OK if all n values are finite, else kInvalidArgument naming `what`, the first bad
// index, its value, and the fix. x may be null only when n == 0.
absl::Status CheckFinite(const float* x, int64_t n, absl::string_view what);

// The kInvalidArgument error CheckFinite returns, for callers that found the bad element with
// ComputeGradientStats: names `what`, the index, the count n, the value, and the fix.
absl::Status NonFiniteError(absl::string_view what, int64_t index, int64_t n, double value);

// Adam in the (d_p, d_q) subspace of one weight (docs/method.md: "The CPU runs Adam in the
// subspace with fp32 moments M, V (d x d) and returns the step D"; lsp/subspace.h gives each
// matrix its own (d_p, d_q), the identity side of a one-sided projection included). Holds M, V
// (d_p*d_q fp32, row-major) and an int64 step counter. weight_decay is ignored here (no
// parameter in the subspace; apply decoupled decay to the full weights). Not thread-safe.
class SubspaceAdam {
 public:
  // rows = d_p, cols = d_q (both > 0; a non-positive size makes every Step return
  // kInvalidArgument).
  SubspaceAdam(int64_t rows, int64_t cols);
  // A square (d, d) subspace.
  explicit SubspaceAdam(int64_t d) : SubspaceAdam(d, d) {}

  // One step. S: (d_p, d_q) fp32 row-major compressed gradient P^T G Q. D: (d_p, d_q) fp32
  // row-major output, D = -lr * mhat / (sqrt(vhat) + eps). Returns kInvalidArgument (and
  // leaves M, V, step and D untouched) if S has a non-finite element, the hyper-parameters
  // are invalid, or a size <= 0.
  absl::Status Step(const AdamHyper& h, const float* S, float* D);

  // Restores a checkpointed state (resume). m, v: d_p*d_q fp32; step >= 0. kInvalidArgument
  // (state untouched) on wrong sizes, negative step, non-finite m or v, or negative v.
  absl::Status Restore(int64_t step, std::vector<float> m, std::vector<float> v);

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  // Number of completed steps (int64, exact beyond 2^24).
  int64_t step() const { return step_; }
  // Moments, (d_p, d_q) fp32 row-major. Mutable so that a refit can write the transferred
  // state (docs/method.md, paper Alg. 1); callers keep them finite and v >= 0.
  std::vector<float>& m() { return m_; }
  std::vector<float>& v() { return v_; }
  const std::vector<float>& m() const { return m_; }
  const std::vector<float>& v() const { return v_; }

 private:
  int64_t numel() const { return rows_ > 0 && cols_ > 0 ? rows_ * cols_ : 0; }

  int64_t rows_;
  int64_t cols_;
  int64_t step_ = 0;
  std::vector<float> m_;  // (d_p, d_q) fp32
  std::vector<float> v_;  // (d_p, d_q) fp32
};

}  // namespace lspo::lsp

#endif  // LSPO_LSP_ADAM_H_
