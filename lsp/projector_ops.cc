// The operations on projectors: the compression (X P, (dY P)^T (X Q), P^T G Q), the expansion
// P D Q^T and the applies W += P D Q^T (fused, compensated, stochastic rounding), the master
// weights' rounding and drift, the estimation bias. Kernels: projector_kernels.h. Contract and
// dimension legend: projector.h.
#include "lsp/projector.h"

#include "third_party/torch/torch_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "glog/logging.h"
#include "lsp/apply_kernel.h"
#include "lsp/projector_kernels.h"

#if LSPO_HAS_CUDA_KERNELS
#include "lsp/cuda/sparse_kernels.h"
#endif

namespace lspo::lsp {
namespace {

using kernels::AccumType;
using kernels::CheckOperand;
using kernels::CheckProjector;
using kernels::ForceAten;
using kernels::GatherKernel;
using kernels::KernelDtype;
using kernels::RowsTimesPT;
using kernels::ScatterKernel;

// Rows of G per block in RelativeBias: 2^21 fp64 elements (16 MiB) per temporary.
constexpr int64_t kBiasBlockElems = int64_t{1} << 21;

}  // namespace

// ---------------------------------------------------------------------------------------------
// The operations

at::Tensor ProjectRows(const at::Tensor& X, const SparseProjector& P, CudaKernels kernels) {
  CheckOperand(X, "ProjectRows", "X");
  CheckProjector(P, "ProjectRows", "P", X);
  CHECK_EQ(X.size(1), P.rows) << "ProjectRows: X " << X.sizes() << " vs P rows " << P.rows;
  return RowsTimesPT(X, {&P}, AccumType(X.scalar_type()), kernels)[0]
      .t()
      .to(X.scalar_type())
      .contiguous();
}

std::vector<at::Tensor> ProjectRowsTransposed(const at::Tensor& X,
                                              const std::vector<const SparseProjector*>& Ps,
                                              CudaKernels kernels) {
  CheckOperand(X, "ProjectRowsTransposed", "X");
  CHECK(!Ps.empty()) << "ProjectRowsTransposed: no projectors";
  for (const SparseProjector* P : Ps) {
    CHECK(P != nullptr) << "ProjectRowsTransposed: null projector";
    CheckProjector(*P, "ProjectRowsTransposed", "P", X);
    CHECK_EQ(X.size(1), P->rows) << "ProjectRowsTransposed: X " << X.sizes() << " vs P rows "
                                 << P->rows;
  }
  return RowsTimesPT(X, Ps, AccumType(X.scalar_type()), kernels);
}

at::Tensor CompressFactored(const at::Tensor& dY, const at::Tensor& XQ, const SparseProjector& P,
                            CudaKernels kernels) {
  CheckOperand(dY, "CompressFactored", "dY");
  CheckOperand(XQ, "CompressFactored", "XQ");
  CheckProjector(P, "CompressFactored", "P", dY);
  CHECK(XQ.device() == dY.device()) << "CompressFactored: dY and XQ on different devices";
  CHECK(dY.size(1) == P.rows && XQ.size(0) == dY.size(0))
      << "CompressFactored: dY " << dY.sizes() << ", XQ " << XQ.sizes() << ", P (" << P.rows << ", "
      << P.d << ")";
  const at::ScalarType ct = (dY.scalar_type() == at::kDouble && XQ.scalar_type() == at::kDouble)
                                ? at::kDouble
                                : at::kFloat;
  const at::Tensor dyp_t = RowsTimesPT(dY, {&P}, ct, kernels)[0];  // (d_p, N) = (dY P)^T
  return dyp_t.mm(XQ.to(ct));                                      // (d_p, d_q) = (dY P)^T (X Q)
}

at::Tensor CompressDense(const at::Tensor& G, const SparseProjector& P, const SparseProjector& Q) {
  CheckOperand(G, "CompressDense", "G");
  CheckProjector(P, "CompressDense", "P", G);
  CheckProjector(Q, "CompressDense", "Q", G);
  CHECK(G.size(0) == P.rows && G.size(1) == Q.rows)
      << "CompressDense: G " << G.sizes() << " vs P rows " << P.rows << ", Q rows " << Q.rows;
  const at::ScalarType ct = AccumType(G.scalar_type());
  const at::Tensor ptg = internal::ScatterRows(G.to(ct), P.index, P.value, P.d);  // (dP, n)
  const at::Tensor st =
      internal::ScatterRows(ptg.t().contiguous(), Q.index, Q.value, Q.d);  // (dQ, dP) = S^T
  return st.t().contiguous();                                              // (dP, dQ)
}

namespace {
// P D Q^T (m, n) in dtype ct by dense matrix products when a side is dense and the other is
// dense or the identity (GaLore-Offload's projectors); undefined otherwise. The identity
// side costs nothing; a dense side one GEMM (BLAS on the CPU, cuBLAS on CUDA).
at::Tensor DenseExpand(const SparseProjector& P, const at::Tensor& D, const SparseProjector& Q,
                       at::ScalarType ct) {
  if (!(P.dense || Q.dense) || !(P.dense || P.identity) || !(Q.dense || Q.identity)) {
    return at::Tensor();
  }
  at::Tensor e = D.to(ct);                                     // (dP, dQ)
  if (Q.dense) e = at::mm(e, Q.value.to(ct).t());              // (dP, n) = D Q^T
  if (P.dense) return at::mm(P.value.to(ct), e).contiguous();  // (m, n) = P D Q^T
  return e.contiguous();
}
}  // namespace

at::Tensor ExpandStep(const SparseProjector& P, const at::Tensor& D, const SparseProjector& Q) {
  CheckOperand(D, "ExpandStep", "D");
  CheckProjector(P, "ExpandStep", "P", D);
  CheckProjector(Q, "ExpandStep", "Q", D);
  CHECK(D.size(0) == P.d && D.size(1) == Q.d)
      << "ExpandStep: D " << D.sizes() << " vs (P.d, Q.d) = (" << P.d << ", " << Q.d << ")";
  const at::ScalarType ct = AccumType(D.scalar_type());
  if (at::Tensor dense = DenseExpand(P, D, Q, ct); dense.defined()) return dense;
  const at::Tensor dt = D.to(ct).t().contiguous();                     // (dQ, dP)
  const at::Tensor et = internal::GatherRows(dt, Q.index, Q.value);    // (n, dP) = Q D^T
  return internal::GatherRows(et.t().contiguous(), P.index, P.value);  // (m, n)
}

namespace {
// E = D Q^T (P.d, n) fp32 contiguous, by gathering rows of D^T: the first stage of the fused
// apply W += P E (CPU loops and the CUDA row kernel alike). On the CPU one kernel forms E in
// place of the gather and its transpose (lsp/apply_kernel.h StepTimesQtCpu, the same bits).
at::Tensor StepTimesQt(const at::Tensor& D, const SparseProjector& Q) {
  const at::Tensor dt = D.to(at::kFloat).t().contiguous();  // (dQ, dP)
  if (dt.device().is_cpu() && !ForceAten()) {
    const at::Tensor idx = Q.index.contiguous();
    const at::Tensor val = Q.value.to(at::kFloat).contiguous();
    at::Tensor e = at::empty({D.size(0), Q.rows}, dt.options());  // (dP, n)
    const absl::Status st =
        StepTimesQtCpu(dt.data_ptr<float>(), D.size(0), D.size(1), idx.data_ptr<int64_t>(),
                       val.data_ptr<float>(), Q.rows, Q.r, e.data_ptr<float>());
    CHECK(st.ok()) << "StepTimesQt: " << st;
    return e;
  }
  return GatherKernel(dt, Q.index, Q.value).t().contiguous();  // (dP, n)
}
}  // namespace

namespace {

// CUDA applies use the fused kernel unless the ATen kernels were chosen (lsp.kernels: aten).
bool UseCudaFusedApply(CudaKernels kernels) {
  return internal::ResolveCudaKernels(kernels) != CudaKernels::kAten && !ForceAten();
}

// Stores the sum t (m, n) (fp32, or fp64 for fp64 W) into W (and C) with `rounding`: the ATen
// path's last stage, the same rule as the kernels (stochastic: lsp::RoundStochastic on the
// host, then one copy back).
void RoundInto(at::Tensor& W, at::Tensor* C, at::Tensor t, Rounding rounding, uint64_t seed) {
  WeightDtype dtype;
  const bool sixteen = KernelDtype(W.scalar_type(), &dtype) && dtype != WeightDtype::kFloat32;
  if (!sixteen || rounding == Rounding::kNearest) {
    W.copy_(t);
    return;
  }
  if (rounding == Rounding::kCompensated) {
    W.copy_(t);                               // one rounding into W's dtype
    C->copy_(t.sub_(W.to(t.scalar_type())));  // what that rounding dropped
    return;
  }
  const at::Tensor host = t.to(at::kCPU, at::kFloat).contiguous();
  at::Tensor bits = at::empty(host.sizes(), host.options().dtype(at::kShort));
  const absl::Status st =
      RoundStochastic(host.data_ptr<float>(), reinterpret_cast<uint16_t*>(bits.data_ptr<int16_t>()),
                      host.numel(), dtype, seed);
  CHECK(st.ok()) << "ApplyStepFused: " << st;
  W.copy_(bits.view(W.scalar_type()).to(W.device()));
}

}  // namespace

void ApplyStepFused(at::Tensor& W, at::Tensor* C, const SparseProjector& P, const at::Tensor& D,
                    const SparseProjector& Q, double decay, Rounding rounding, uint64_t seed,
                    CudaKernels kernels) {
  CheckOperand(W, "ApplyStepFused", "W");
  CHECK(W.size(0) == P.rows && W.size(1) == Q.rows)
      << "ApplyStepFused: W " << W.sizes() << " vs P rows " << P.rows << ", Q rows " << Q.rows;
  CHECK(W.device() == D.device()) << "ApplyStepFused: W on " << W.device() << ", D on "
                                  << D.device();
  CHECK(D.size(0) == P.d && D.size(1) == Q.d)
      << "ApplyStepFused: D " << D.sizes() << " vs (P.d, Q.d) = (" << P.d << ", " << Q.d << ")";
  WeightDtype dtype;
  const bool kernel_dtype = KernelDtype(W.scalar_type(), &dtype);
  if (rounding == Rounding::kCompensated) {
    CHECK(kernel_dtype && dtype != WeightDtype::kFloat32)
        << "ApplyStepFused: compensated rounding needs bf16 or fp16 W, got " << W.scalar_type();
    CHECK(C != nullptr && C->defined() && C->sizes() == W.sizes() &&
          C->scalar_type() == W.scalar_type() && C->device() == W.device() && C->is_contiguous())
        << "ApplyStepFused: C must match W " << W.sizes() << " " << W.scalar_type();
  }
  torch::NoGradGuard no_grad;
  const bool sparse = !P.dense && !Q.dense;
  const bool fused = sparse && kernel_dtype && W.is_contiguous();
  at::Tensor* c = rounding == Rounding::kCompensated ? C : nullptr;
  if (fused && W.device().is_cpu() && !ForceAten()) {
    const at::Tensor e = StepTimesQt(D, Q);  // (dP, n) fp32
    const at::Tensor idx = P.index.contiguous();
    const at::Tensor val = P.value.to(at::kFloat).contiguous();
    FusedApplyArgs args;
    args.w = W.data_ptr();
    args.c = c != nullptr ? c->data_ptr() : nullptr;
    args.dtype = dtype;
    args.m = W.size(0);
    args.n = W.size(1);
    args.e = e.data_ptr<float>();
    args.d = P.d;
    args.p_index = idx.data_ptr<int64_t>();
    args.p_value = val.data_ptr<float>();
    args.r = P.r;
    args.decay = static_cast<float>(decay);
    args.rounding = rounding;
    args.seed = seed;
    const absl::Status st = FusedApplyCpu(args);
    CHECK(st.ok()) << "ApplyStepFused: " << st;
    return;
  }
#if LSPO_HAS_CUDA_KERNELS
  if (fused && W.is_cuda() && UseCudaFusedApply(kernels)) {
    const at::Tensor e = StepTimesQt(D, Q);                      // (dP, n) fp32 on the device
    const at::Tensor idx = P.index.to(at::kInt).contiguous();    // (m, r) int32
    const at::Tensor val = P.value.to(at::kFloat).contiguous();  // (m, r)
    const int rc = cuda::ApplyFused(
        W.data_ptr(), c != nullptr ? c->data_ptr() : nullptr, static_cast<int>(dtype), W.size(0),
        W.size(1), e.data_ptr<float>(), idx.data_ptr<int32_t>(), val.data_ptr<float>(), P.r,
        static_cast<float>(decay), static_cast<int>(rounding), seed, /*stream=*/nullptr);
    TORCH_CHECK(rc == 0, "lsp::ApplyStepFused: CUDA error ", rc);
    return;
  }
#endif
  // ATen: t = decay (W + C) + P D Q^T in fp32 (fp64 for fp64 W), then one rounding.
  const at::ScalarType ct = AccumType(W.scalar_type());
  at::Tensor kept = W.to(ct);
  if (c != nullptr) kept = kept.add(c->to(ct));
  if (decay != 1.0) kept = kept.mul(decay);
  at::Tensor t = ExpandStep(P, D.to(ct), Q).add_(kept);  // (m, n) in ct
  if (W.scalar_type() == ct) {
    W.copy_(t);
    return;
  }
  RoundInto(W, c, std::move(t), rounding, seed);
}

void ApplyStep(at::Tensor& W, const SparseProjector& P, const at::Tensor& D,
               const SparseProjector& Q) {
  ApplyStepFused(W, nullptr, P, D, Q, 1.0, Rounding::kNearest, 0);
}

void ApplyStepCompensated(at::Tensor& W, at::Tensor& C, const SparseProjector& P,
                          const at::Tensor& D, const SparseProjector& Q, double decay) {
  ApplyStepFused(W, &C, P, D, Q, decay, Rounding::kCompensated, 0);
}

at::Tensor RoundWithResidual(at::Tensor& W, const at::Tensor& master) {
  CHECK(W.sizes() == master.sizes())
      << "RoundWithResidual: W " << W.sizes() << " vs master " << master.sizes();
  torch::NoGradGuard no_grad;
  const at::Tensor m = master.to(W.device(), at::kFloat);
  W.copy_(m);
  return (m - W.to(at::kFloat)).to(W.scalar_type());
}

double MaxDriftUlps(const at::Tensor& W, const at::Tensor& M) {
  CHECK(W.sizes() == M.sizes()) << "MaxDriftUlps: W " << W.sizes() << " vs M " << M.sizes();
  torch::NoGradGuard no_grad;
  const at::ScalarType dt = W.scalar_type();
  // Significant bits and smallest normal exponent of W's dtype.
  const int bits = dt == at::kBFloat16 ? 8 : dt == at::kHalf ? 11 : 24;
  const int min_exp = dt == at::kHalf ? -14 : -126;
  const at::Tensor r = M.to(W.device()).to(dt).to(at::kDouble);  // round(M)
  const at::Tensor diff = (W.to(at::kDouble) - r).abs();
  // The scale of an element: its own magnitude, but at least the matrix's RMS (see the header)
  // and the smallest normal number. |s| = f 2^e with f in [0.5, 1): ulp = 2^(e - bits).
  const double rms = r.pow(2).mean().sqrt().item<double>();
  const at::Tensor scale = r.abs().clamp_min(std::max(rms, std::ldexp(1.0, min_exp)));
  const at::Tensor e = std::get<1>(at::frexp(scale));
  const at::Tensor ulp = at::pow(2.0, (e - bits).to(at::kDouble));
  return (diff / ulp).max().item<double>();
}

double RelativeBias(const at::Tensor& G, const SparseProjector& P, const SparseProjector& Q) {
  CheckOperand(G, "RelativeBias", "G");
  CheckProjector(P, "RelativeBias", "P", G);
  CheckProjector(Q, "RelativeBias", "Q", G);
  CHECK(G.size(0) == P.rows && G.size(1) == Q.rows)
      << "RelativeBias: G " << G.sizes() << " vs P rows " << P.rows << ", Q rows " << Q.rows;
  torch::NoGradGuard no_grad;
  const int64_t m = G.size(0);
  const int64_t n = G.size(1);
  const int64_t block = std::max<int64_t>(1, kBiasBlockElems / std::max<int64_t>(n, 1));
  const at::Tensor pv = P.value.to(at::kDouble);  // (m, r) fp64
  const at::Tensor qv = Q.value.to(at::kDouble);  // (n, r) fp64
  // Pass 1: P^T G (dP, n) and |G|^2, block by block.
  at::Tensor ptg = at::zeros({P.d, n}, G.options().dtype(at::kDouble));
  double g2 = 0;
  for (int64_t r0 = 0; r0 < m; r0 += block) {
    const int64_t r1 = std::min(m, r0 + block);
    const at::Tensor gb = G.slice(0, r0, r1).to(at::kDouble).contiguous();  // (b, n)
    ptg.add_(ScatterKernel(gb, P.index.slice(0, r0, r1), pv.slice(0, r0, r1), P.d));
    g2 += gb.pow(2).sum().item<double>();
  }
  if (g2 == 0) return 0.0;
  const at::Tensor st = internal::ScatterRows(ptg.t().contiguous(), Q.index, qv, Q.d);  // S^T
  const at::Tensor e = internal::GatherRows(st, Q.index, qv).t().contiguous();  // (dP, n) S Q^T
  // Pass 2: |P (S Q^T) - G|^2 block by block.
  double res2 = 0;
  for (int64_t r0 = 0; r0 < m; r0 += block) {
    const int64_t r1 = std::min(m, r0 + block);
    const at::Tensor gb = G.slice(0, r0, r1).to(at::kDouble);  // (b, n)
    const at::Tensor rb =
        internal::GatherRows(e, P.index.slice(0, r0, r1), pv.slice(0, r0, r1)) - gb;
    res2 += rb.pow(2).sum().item<double>();
  }
  return std::sqrt(res2 / g2);
}

}  // namespace lspo::lsp
