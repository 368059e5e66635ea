// Projector fitting and Adam state transfer. See fit.h for the contract and the cost.
#include "lsp/fit.h"

#include <torch/optim/adam.h>
#include "third_party/torch/torch_api.h"

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "lsp/projector.h"
#include "runtime/status_macros.h"

namespace lspo::lsp {
namespace {

absl::Status ValidateOptions(const FitOptions& o) {
  auto bad = [](absl::string_view field, double value, absl::string_view range) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FitOptions.%s = %g is invalid: expected %s; fix the projector-fit configuration", field,
        value, range));
  };
  if (o.max_iters < 0) return bad("max_iters", o.max_iters, "an integer >= 0");
  if (!std::isfinite(o.lr) || o.lr <= 0) return bad("lr", o.lr, "a finite value > 0");
  if (o.patience < 0) return bad("patience", o.patience, "an integer >= 0");
  if (o.max_halvings < 0) return bad("max_halvings", o.max_halvings, "an integer >= 0");
  if (!std::isfinite(o.beta) || o.beta < 0) return bad("beta", o.beta, "a finite value >= 0");
  if (!std::isfinite(o.alpha) || o.alpha < 0) {
    return bad("alpha", o.alpha, "a finite value >= 0");
  }
  return absl::OkStatus();
}

absl::Status ValidateInputs(const at::Tensor& G, const SparseProjector* P,
                            const SparseProjector* Q) {
  if (P == nullptr || Q == nullptr) {
    return absl::InvalidArgumentError("FitProjectors: P and Q must be non-null");
  }
  absl::Status st = P->Validate();
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("FitProjectors: P: ", st.message()));
  st = Q->Validate();
  if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("FitProjectors: Q: ", st.message()));
  if (!G.defined() || G.dim() != 2 || !at::isFloatingType(G.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FitProjectors: G must be a 2-D floating (m, n) gradient, got %s; non-2-D parameters "
        "are not trained with LSP",
        G.defined()
            ? absl::StrCat(c10::str(G.sizes()), " ", std::string(c10::toString(G.scalar_type())))
            : std::string("an undefined tensor")));
  }
  if (G.size(0) != P->rows || G.size(1) != Q->rows) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FitProjectors: G is (%d, %d), P is (%d, %d), Q is (%d, %d); expected P (m, d_p) and "
        "Q (n, d_q) for G (m, n)",
        G.size(0), G.size(1), P->rows, P->d, Q->rows, Q->d));
  }
  if (G.device() != P->index.device() || G.device() != Q->index.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FitProjectors: G is on ", G.device().str(), " but P on ", P->index.device().str(),
        " and Q on ", Q->index.device().str(), "; move them to one device (SparseProjector::To)"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

FitTerms FitObjective(const at::Tensor& Gn, const at::Tensor& p_index, const at::Tensor& p_value,
                      const at::Tensor& q_index, const at::Tensor& q_value, int64_t d_p,
                      int64_t d_q, double beta, bool p_fixed, bool q_fixed) {
  const at::ScalarType ct = Gn.scalar_type();
  const at::Tensor pv = p_value.to(ct);                                       // (m, r)
  const at::Tensor qv = q_value.to(ct);                                       // (n, r)
  const at::Tensor ptg = ScatterRows(Gn, p_index, pv, d_p);                   // (d_p, n) = P^T Gn
  const at::Tensor st = ScatterRows(ptg.t().contiguous(), q_index, qv, d_q);  // (d_q, d_p) = S^T
  const at::Tensor s = st.t();                                         // (d_p, d_q) = P^T Gn Q
  const at::Tensor a = CrossGram(p_index, pv, d_p, p_index, pv, d_p);  // (d_p, d_p) = P^T P
  const at::Tensor b = CrossGram(q_index, qv, d_q, q_index, qv, d_q);  // (d_q, d_q) = Q^T Q
  // |P S Q^T - Gn|^2 = <A S, S B> - 2 |S|^2 + |Gn|^2, |Gn| = 1.
  const at::Tensor quad = (a.mm(s) * s.mm(b)).sum();
  const at::Tensor f2 = quad - 2.0 * s.pow(2).sum() + 1.0;
  // Clamp: rounding can push f2 slightly below 0 when the fit is near exact; the floor keeps
  // the sqrt's gradient finite.
  const at::Tensor error = f2.clamp_min(ct == at::kFloat ? 1e-30 : 1e-60).sqrt();
  at::Tensor objective = error;
  if (beta != 0) {
    // Only the learned values are regularised: an identity side is not a parameter.
    if (!p_fixed) objective = objective + beta * pv.norm();
    if (!q_fixed) objective = objective + beta * qv.norm();
  }
  return FitTerms{objective, error};
}

}  // namespace internal

namespace {

// FitProjectors' input check. Errors: kInvalidArgument naming the count and the first
// non-finite entry of the calibration gradient g (m, n).
absl::Status CheckFiniteGradient(const at::Tensor& g) {
  const at::Tensor bad = at::isfinite(g).logical_not();  // (m, n) bool
  const int64_t n_bad = bad.sum().item<int64_t>();
  if (n_bad == 0) return absl::OkStatus();
  const int64_t first = bad.reshape({-1}).nonzero()[0][0].item<int64_t>();
  return absl::InvalidArgumentError(absl::StrFormat(
      "FitProjectors: calibration gradient G (%d x %d) has %d non-finite entries (first "
      "at flat index %d); expected finite values. Fix: skip this calibration batch or "
      "lower the learning rate / use loss scaling",
      g.size(0), g.size(1), n_bad, first));
}

// The closed-form start of the fit: every learned value of P, Q scaled by the lambda that
// best fits the normalised gradient gn (m, n) in dtype `ct` (see the comment inside);
// `learned_sides` (1 or 2) of P, Q are not the identity. Leaves P, Q as they are when the
// terms are not finite and positive.
void RescaleToTheGradient(const at::Tensor& gn, int learned_sides, at::ScalarType ct,
                          SparseProjector* P, SparseProjector* Q) {
  // Closed-form start: scaling every learned value by lambda scales the reconstruction
  // P P^T G Q Q^T by lambda^(2k), k = number of learned sides (2, or 1 for a one-sided
  // subspace), so |lambda^(2k) R - Gn|^2 = lambda^(4k) |R|^2 - 2 lambda^(2k) <R, Gn> + 1
  // with |R|^2 = <A S, S B> and <R, Gn> = |S|^2 (S = P^T Gn Q, A = P^T P, B = Q^T Q) is
  // minimised at lambda^(2k) = |S|^2 / |R|^2, giving error^2 = 1 - |S|^4/|R|^2 <= 1.
  // Random N(0, 1/r) values start far above 1 (~6.7 on SmolLM2), so this one step removes
  // the scale mismatch that Adam would otherwise spend its iterations on.
  torch::NoGradGuard no_grad;
  const at::Tensor pv0 = P->value.to(ct), qv0 = Q->value.to(ct);
  const at::Tensor ptg = internal::ScatterRows(gn, P->index, pv0, P->d);  // (d_p, n)
  const at::Tensor st = internal::ScatterRows(ptg.t().contiguous(), Q->index, qv0, Q->d);
  const at::Tensor sm = st.t();  // (d_p, d_q)
  const at::Tensor a = internal::CrossGram(P->index, pv0, P->d, P->index, pv0, P->d);
  const at::Tensor b = internal::CrossGram(Q->index, qv0, Q->d, Q->index, qv0, Q->d);
  const double quad = (a.mm(sm) * sm.mm(b)).sum().item<double>();
  const double s2 = sm.pow(2).sum().item<double>();
  if (quad > 0 && s2 > 0 && std::isfinite(quad) && std::isfinite(s2)) {
    const double lambda = std::pow(s2 / quad, 1.0 / (2.0 * learned_sides));
    if (!P->identity) P->value = (P->value * lambda).to(at::kFloat);
    if (!Q->identity) Q->value = (Q->value * lambda).to(at::kFloat);
  }
}

}  // namespace

absl::StatusOr<FitResult> FitProjectors(const at::Tensor& G, SparseProjector* P, SparseProjector* Q,
                                        const FitOptions& options) {
  absl::Status st = ValidateOptions(options);
  if (!st.ok()) return st;
  st = ValidateInputs(G, P, Q);
  if (!st.ok()) return st;
  try {
    torch::AutoGradMode enable_grad(true);
    const at::Tensor g = G.detach();
    RETURN_IF_ERROR(CheckFiniteGradient(g));
    const double g_norm = g.to(at::kDouble).norm().item<double>();
    if (g_norm == 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "FitProjectors: gradient is all zero, nothing to fit (G is %d x %d). Fix: use "
          "calibration samples whose loss depends on this weight, or keep the current "
          "projectors",
          g.size(0), g.size(1)));
    }
    FitResult result;
    result.initial_error = RelativeBias(g, *P, *Q);
    // Identity sides (lsp/subspace.h) are exact and never fitted: only the other side's values
    // are parameters. With both sides the identity the bias is 0 and there is nothing to fit.
    const int learned_sides = (P->identity ? 0 : 1) + (Q->identity ? 0 : 1);
    if (learned_sides == 0) {
      result.final_error = result.initial_error;
      return result;
    }

    const at::ScalarType ct = options.float64 ? at::kDouble : at::kFloat;
    const at::Tensor gn = (g.to(at::kDouble) / g_norm).to(ct).contiguous();  // (m, n), |gn| = 1
    if (options.rescale && result.initial_error > options.alpha) {
      RescaleToTheGradient(gn, learned_sides, ct, P, Q);
    }
    at::Tensor pv = P->value.detach().to(at::kFloat).clone();  // (m, r_p)
    at::Tensor qv = Q->value.detach().to(at::kFloat).clone();  // (n, r_q)
    std::vector<at::Tensor> params;
    if (!P->identity) params.push_back(pv.set_requires_grad(true));
    if (!Q->identity) params.push_back(qv.set_requires_grad(true));
    double lr = options.lr;
    auto adam = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
    at::Tensor best_p = P->value.detach().to(at::kFloat).clone();
    at::Tensor best_q = Q->value.detach().to(at::kFloat).clone();
    double best_objective = std::numeric_limits<double>::infinity();
    int since_best = 0;  // consecutive iterates without a new best objective
    int halvings = 0;
    for (int it = 0;; ++it) {
      internal::FitTerms terms = internal::FitObjective(gn, P->index, pv, Q->index, qv, P->d, Q->d,
                                                        options.beta, P->identity, Q->identity);
      const double objective = terms.objective.item<double>();
      const double error = terms.error.item<double>();
      const bool finite = std::isfinite(objective);
      const bool accept = finite && error <= options.alpha;
      if ((finite && objective < best_objective) || accept) {
        best_objective = objective;
        best_p = pv.detach().clone();
        best_q = qv.detach().clone();
        since_best = 0;
      } else {
        ++since_best;
      }
      if (accept || it >= options.max_iters) break;
      if (!finite || (options.patience > 0 && since_best >= options.patience)) {
        // Step too large for this projector (FitOptions::patience): back to the best values,
        // half the learning rate, fresh Adam moments. A diverged iterate with no halving left
        // ends the fit (the best seen is kept).
        if (halvings >= options.max_halvings) {
          if (!finite) break;
        } else {
          torch::NoGradGuard no_grad;
          pv.copy_(best_p);
          qv.copy_(best_q);
          lr *= 0.5;
          ++halvings;
          since_best = 0;
          adam = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
          continue;  // re-evaluate at the best values for the gradient of the next step
        }
      }
      adam->zero_grad();
      terms.objective.backward();
      adam->step();
      ++result.iterations;
    }
    result.lr_halvings = halvings;
    P->value = best_p;
    Q->value = best_q;
    result.final_error = RelativeBias(g, *P, *Q);
    return result;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("FitProjectors: LibTorch error: ", e.what()));
  }
}

void TransferAdamState(const SparseProjector& P_old, const SparseProjector& Q_old,
                       const SparseProjector& P_new, const SparseProjector& Q_new, at::Tensor& M,
                       at::Tensor& V) {
  CHECK(P_old.rows == P_new.rows && Q_old.rows == Q_new.rows)
      << "TransferAdamState: projector rows differ: P " << P_old.rows << " -> " << P_new.rows
      << ", Q " << Q_old.rows << " -> " << Q_new.rows;
  CHECK(M.defined() && V.defined() && M.dim() == 2 && M.size(0) == P_old.d &&
        M.size(1) == Q_old.d && V.sizes() == M.sizes())
      << "TransferAdamState: M " << (M.defined() ? c10::str(M.sizes()) : "undefined") << ", V "
      << (V.defined() ? c10::str(V.sizes()) : "undefined") << "; expected (" << P_old.d << ", "
      << Q_old.d << ")";
  torch::NoGradGuard no_grad;
  const at::ScalarType ct = M.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor cp = internal::CrossGram(P_new.index, P_new.value.to(ct), P_new.d, P_old.index,
                                            P_old.value.to(ct), P_old.d);  // (d', d)
  const at::Tensor cq = internal::CrossGram(Q_old.index, Q_old.value.to(ct), Q_old.d, Q_new.index,
                                            Q_new.value.to(ct), Q_new.d);  // (d, d')
  const at::Tensor m_new = cp.mm(M.to(ct)).mm(cq);                         // (d', d')
  const at::Tensor v_new = cp.pow(2).mm(V.to(ct)).mm(cq.pow(2));           // (d', d')
  M = m_new.to(M.scalar_type());
  V = v_new.to(V.scalar_type());
}

}  // namespace lspo::lsp
