// Learning the sparse projectors of one weight from a calibration gradient, and carrying the
// subspace Adam state across a refit (docs/method.md "Learning the projectors"; paper: Chen et al.,
// AAAI 2025, arXiv 2406.10181, Alg. 1).
//
// Dimension legend (shared by all lsp/ headers):
//   N  tokens in a batch             m  out features of a weight (rows of W)
//   n  in features of a weight       d_p, d_q  subspace sizes (S, M, V are (d_p, d_q);
//                                    d_p = d_q = d unless lsp/subspace.h says otherwise)
//   r  non-zeros per projector row
// HF layout: W is (m, n) (y = x W^T); G (m, n); P (m, d_p); Q (n, d_q). A side may be the
// identity (SparseProjector::identity, a one-sided subspace): it is exact and never fitted.
//
// Cost of the fit. The objective needs |P S Q^T - G|_F with S = P^T G Q, but an (m, n) product
// is never formed in the loop; it uses
//   |P S Q^T - G|_F^2 = tr(S^T (P^T P) S (Q^T Q)) - 2 <S, P^T G Q> + |G|_F^2
//                     = tr(S^T A S B) - 2 |S|_F^2 + |G|_F^2,   A = P^T P, B = Q^T Q (d, d),
// with P^T G (d, n) by a differentiable sparse scatter over the values, S = (P^T G) Q by a
// second scatter, A and B from the r x r products of each row. Per iteration:
// O(m n r + n d r + (m + n) r^2 + d^3) time and O(d n + d^2) memory beyond G.
//
// Thread-safety: free functions; the projectors passed in are mutated and must not be shared.
#ifndef LSPO_LSP_FIT_H_
#define LSPO_LSP_FIT_H_

#include <ATen/ATen.h>

#include "absl/status/statusor.h"
#include "lsp/projector.h"

namespace lspo::lsp {

struct FitOptions {
  // Adam steps at most (docs/method.md: ~100). 0 = only measure the error.
  int max_iters = 100;
  // Adam learning rate on the projector values (docs/method.md: 0.05-0.1).
  double lr = 0.05;
  // Regulariser weight on |P|_F + |Q|_F (the Frobenius norms of the values).
  double beta = 0.0;
  // Stop as soon as the relative error <= alpha (docs/method.md: 0.2 code, 0.3 GLUE, 0.8 default).
  double alpha = 0.0;
  // Evaluate the objective in float64 (default): the identity above subtracts terms of size
  // ~|P S Q^T|^2 that can exceed |G|^2 by 10^3 at initialisation, so fp32 would lose ~4 digits.
  // false: fp32 (faster on GPUs with slow fp64).
  bool float64 = true;
  // Before the Adam iterations, rescale all values of P and Q by the closed-form optimal
  // common factor (see fit.cc), which guarantees a relative error <= 1 at iteration 0.
  // Skipped when the initial error is already <= alpha (the projectors are kept as they are).
  bool rescale = true;
  // Step-size control: after `patience` consecutive Adam iterates without a new best objective
  // (or one non-finite iterate), the values go back to the best seen and the lr is halved with
  // fresh Adam moments, at most `max_halvings` times. patience = 0 turns off the halving on
  // non-improving iterates only; max_halvings = 0 turns off every halving (a non-finite
  // iterate then ends the fit, as before 2026-12-03). Adam moves every value by
  // about lr per step whatever the values' scale, so a fixed lr that suits r = 4 overshoots at
  // r = 16, where each value is ~1/sqrt(r) smaller (docs/projector_bias.md "r = 16 and the
  // learning rate": 40 iterations at lr 0.05 kept the rescaled draw, bias 0.98). A restart
  // re-evaluates the best values and so uses one of the max_iters evaluations.
  int patience = 3;
  int max_halvings = 8;
};

struct FitResult {
  double initial_error = 0;  // RelativeBias(G, P, Q) before the fit (fp64, exact)
  double final_error = 0;    // RelativeBias(G, P, Q) of the kept values (fp64, exact)
  int iterations = 0;        // Adam steps taken
  int lr_halvings = 0;       // step-size halvings (FitOptions::patience)
};

// Fits the non-zero values of P and Q (positions fixed) by Adam (torch::optim::Adam, autograd)
// to minimise  |P P^T G Q Q^T - G|_F / |G|_F + beta (|P|_F + |Q|_F)  (docs/method.md). Keeps the
// values with the lowest objective seen (or the first whose error <= alpha, where the loop
// stops); a non-finite or non-improving iterate halves the step (FitOptions::patience), a
// non-finite one past the last halving ends the loop. On success P->value and Q->value hold the
// kept values (fp32, same device, requires_grad false). Only the non-identity sides are
// fitted (and regularised); with both sides the identity nothing is fitted (error 0,
// 0 iterations). The closed-form rescale at the start scales the learned sides only.
//   G: (m, n) floating, same device as the projectors; P: (m, d_p); Q: (n, d_q).
// Errors (projectors untouched):
//   kInvalidArgument    null/invalid projectors, G not 2-D floating, shape or device mismatch,
//                       bad options (max_iters, patience or max_halvings < 0, lr <= 0,
//                       beta < 0, alpha < 0, non-finite),
//                       non-finite G (docs/known-failures.md #12; the count and first index named).
//   kFailedPrecondition G is all zero ("gradient is all zero, nothing to fit").
//   kInternal           a LibTorch error during the fit.
absl::StatusOr<FitResult> FitProjectors(const at::Tensor& G, SparseProjector* P, SparseProjector* Q,
                                        const FitOptions& options);

// Carries the subspace Adam moments into a new subspace after a refit (paper Alg. 1;
// docs/method.md "On a refit, carry the Adam state"):
//   M <- (P'^T P) M (Q^T Q'),    V <- (P'^T P)^2 V (Q^T Q')^2   (squares element-wise),
// with P, Q the old and P', Q' the new projectors. The step counter is not touched (callers
// keep it). P'^T P (d', d) and Q^T Q' (d, d') are formed sparsely in O(m r r' + n r r').
// An identity side contributes the identity (P'^T P = I when both are the identity of the same
// rows), so a one-sided or full subspace keeps its moments on that side as they are.
//   M, V: (d_p, d_q) floating (fp32 in the optimizer), replaced by (d_p', d_q') in the same
//   dtype and
//   device; computed in fp32 (fp64 for fp64 M). V stays >= 0 when it was.
// Preconditions (programmer invariants, CHECKed): P_old.rows == P_new.rows, Q_old.rows ==
// Q_new.rows, M and V are (P_old.d, Q_old.d), all on one device.
void TransferAdamState(const SparseProjector& P_old, const SparseProjector& Q_old,
                       const SparseProjector& P_new, const SparseProjector& Q_new, at::Tensor& M,
                       at::Tensor& V);

namespace internal {
struct FitTerms {
  at::Tensor objective;  // 0-dim: error + beta (|p_value|_F + |q_value|_F), differentiable
  at::Tensor error;      // 0-dim: |P P^T Gn Q Q^T - Gn|_F from the trace identity
};
// The fit objective on a unit-norm gradient. Gn: (m, n) = G / |G|_F in the compute dtype
// (fp32 or fp64); p_index (m, r_p), p_value (m, r_p) of P (m, d_p); q_index (n, r_q),
// q_value (n, r_q) of Q (n, d_q); values are cast to Gn's dtype differentiably. A side marked
// fixed (an identity side) is left out of the beta term. Exposed for tests.
FitTerms FitObjective(const at::Tensor& Gn, const at::Tensor& p_index, const at::Tensor& p_value,
                      const at::Tensor& q_index, const at::Tensor& q_value, int64_t d_p,
                      int64_t d_q, double beta, bool p_fixed = false, bool q_fixed = false);
}  // namespace internal

}  // namespace lspo::lsp

#endif  // LSPO_LSP_FIT_H_
