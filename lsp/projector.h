// Learned (d, r)-sparse projectors and the sparse kernels of LSP-Offload (docs/method.md "Math, per
// weight matrix W"; paper: Chen et al., AAAI 2025, arXiv 2406.10181, Sec. "Learned sparse
// projectors" and Alg. 1).
//
// Dimension legend (shared by all lsp/ headers):
//   N  tokens in a batch             m  out features of a weight (rows of W)
//   n  in features of a weight       d  subspace dimension (S, D are (d, d); in general
//                                       (d_p, d_q) with P (m, d_p), Q (n, d_q): lsp/subspace.h)
//   r  non-zeros per projector row
// HF layout: W is (m, n) and a linear layer computes y = x W^T, so the weight gradient is
// G = dY^T X (m, n) for X (N, n), dY (N, m). P is (m, d), Q is (n, d); the compressed gradient
// is S = P^T G Q (d, d) and a subspace step D (d, d) is applied as W <- W + P D Q^T.
//
// A projector is stored as two (rows, r) tensors (index, value): row i has non-zeros
// value[i, j] at columns index[i, j], j < r, all distinct. No kernel here ever forms the dense
// (rows, d) matrix; Dense() exists for tests and debugging only. All kernels run on the device
// of their inputs: on the CPU, fp32/fp64 data go through plain loops parallelised with
// at::parallel_for (each task owns disjoint outputs); elsewhere (CUDA, 16-bit data) through
// ATen index ops (index_add / index_select). They are differentiable where noted (custom
// autograd functions), which the projector fit (fit.h) relies on.
//
// Error handling: inputs that come from users or files are validated by the Status-returning
// functions (Random, FromTensors, Validate, CheckProjectorShapes). The tensor kernels are the
// hot path and take already-validated operands: a shape/dtype/device mismatch there is a
// programmer error and is CHECKed (the message names both shapes). No c10::Error escapes.
//
// Thread-safety: SparseProjector is a value type; concurrent const use is safe.
#ifndef LSPO_LSP_PROJECTOR_H_
#define LSPO_LSP_PROJECTOR_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lsp/rounding.h"

namespace lspo::lsp {

struct SparseProjector {
  at::Tensor index;  // (rows, r) int64, r DISTINCT columns in [0, d) per row
  at::Tensor value;  // (rows, r) fp32, the learned non-zeros
  int64_t rows = 0;  // m for P, n for Q
  int64_t d = 0;     // subspace dimension (columns of the dense projector)
  int64_t r = 0;     // non-zeros per row
  // The identity (rows == d, r == 1, index[i] = i, value 1): an exact, never-fitted side of a
  // one-sided or full subspace (lsp/subspace.h). FitProjectors leaves its values alone.
  bool identity = false;
  // A dense projector (r == d, row i's columns 0..d-1 in order: value IS the (rows, d)
  // matrix), e.g. GaLore's SVD projectors in GaLore-Offload (baselines/galore.h). The kernels
  // below then use dense matrix products (BLAS) instead of the row loops.
  bool dense = false;

  // A dense projector from the (rows, d) matrix M (any floating dtype, any device; stored as
  // fp32 on M's device): index row i = 0..d-1 (a stride-0 view: no (rows, d) index memory),
  // value = M. kInvalidArgument if M is not 2-D, has a zero size or a non-finite entry.
  static absl::StatusOr<SparseProjector> FromDense(const at::Tensor& M);

  // The identity projector (rows, rows) on the CPU: index (rows, 1) = 0..rows-1, value 1.
  // kInvalidArgument if rows <= 0.
  static absl::StatusOr<SparseProjector> Identity(int64_t rows);

  // The projector a side of a matrix's subspace calls for (lsp/subspace.h): Identity(rows)
  // when `identity`, else Random(rows, d, r, seed). Errors as those two.
  static absl::StatusOr<SparseProjector> ForSide(int64_t rows, int64_t d, int64_t r, bool identity,
                                                 uint64_t seed);

  // A fresh projector on the CPU: per row, r distinct columns drawn uniformly without
  // replacement (Floyd's algorithm, sorted ascending), values ~ N(0, 1/r) (std 1/sqrt(r)), so
  // E[P P^T] = I (docs/method.md). Deterministic for a given seed: positions are bit-identical on
  // every platform (mt19937_64 + own unbiased integer draws, no implementation-defined std
  // distributions); values use Box-Muller with std::log/cos, identical up to libm rounding.
  // kInvalidArgument if rows <= 0, d <= 0, r <= 0 or r > d.
  static absl::StatusOr<SparseProjector> Random(int64_t rows, int64_t d, int64_t r, uint64_t seed);

  // Wraps existing tensors (e.g. read from a checkpoint; docs/known-failures.md #11) after
  // Validate(). index (rows, r) integer, value (rows, r) floating (converted to int64 / fp32 on
  // the same device). `identity` is set when the tensors are exactly the identity projector
  // (d == rows, r == 1, index i at row i, value 1), and `dense` when r == d and every row's
  // index is 0..d-1 in order. kInvalidArgument on any violation of the invariants.
  static absl::StatusOr<SparseProjector> FromTensors(const at::Tensor& index,
                                                     const at::Tensor& value, int64_t d);

  // Checks the invariants: defined tensors, index int64 and value fp32 of shape (rows, r) on
  // one device, 1 <= r <= d, indices in [0, d) and distinct per row, finite values.
  // kInvalidArgument naming the violated invariant. Copies to the CPU for the checks (O(rows r)).
  absl::Status Validate() const;

  // The dense (rows, d) fp32 matrix on the projector's device. For tests/debugging only.
  at::Tensor Dense() const;

  // A copy with index and value on `device` (same sizes).
  SparseProjector To(const at::Device& device) const;
};

// The seed of a projector pair's draw (SparseProjector::Random: P takes the seed, Q seed + 1):
// distinct per job seed `base`, trained matrix `linear` (its index) and draw `draw` (the
// worker's projector check uses the optimizer step it runs at), reproducible everywhere.
// A fixed mix with primes: base * 1000003 + linear * 7919 + draw * 104729 (mod 2^64).
inline uint64_t ProjectorSeed(uint64_t base, int64_t linear, int64_t draw) {
  return base * 1000003ull + static_cast<uint64_t>(linear) * 7919ull +
         static_cast<uint64_t>(draw) * 104729ull;
}

// The kernels an operation runs on CUDA tensors (docs/gpu.md), chosen per job (JobSpec
// lsp.kernels) and passed with each call that has a choice; CPU tensors ignore it.
enum class CudaKernels {
  // The worker's environment LSPO_CUDA_KERNELS (custom / aten), read once per process; where
  // it is unset, the fused apply (lsp/cuda) with ATen's compression (cuSPARSE there until it
  // has been timed against ATen on a GPU).
  kDefault = 0,
  kAten = 1,    // ATen index ops for the compression and the apply
  kCustom = 2,  // lsp/cuda: cuSPARSE SpMM for X P and dY P, the fused apply, int32 positions
};

// X P without densifying P. X: (N, rows) any floating dtype, any device; P.rows == X.size(1).
// Returns (N, P.d) contiguous in X's dtype; sums are accumulated in fp32 (fp64 for fp64 X) and
// rounded once. Used for A = X Q in the forward pass. O(N rows r). Differentiable in X and
// P.value (when grad mode is on and either requires grad, the ATen path is taken).
// `kernels`: as ProjectRowsTransposed's.
at::Tensor ProjectRows(const at::Tensor& X, const SparseProjector& P,
                       CudaKernels kernels = CudaKernels::kDefault);

// (X P)^T for every projector of Ps over one input X: the token-minor layout the compression
// consumes (S = (dY P)^T (X Q) is then one GEMM with no transpose copy), and one pass over X
// for all the projectors of linears that share an input (q|k|v, gate|up). X: (N, rows) any
// floating dtype, any device; every P: P.rows == X.size(1). Returns, per P, (P.d, N)
// contiguous fp32 (fp64 for fp64 X). On the CPU with fp32 accumulation: the token-tiled kernel
// of lsp/project_kernel.h (sums over X's features in ascending order, products rounded before
// each add: deterministic, the same bits for any thread count); a dense projector by a BLAS
// GEMM. Elsewhere each P separately, as ProjectRows. Differentiable as ProjectRows. Empty Ps
// or mismatched operands are programmer errors (CHECKed). `kernels`: CUDA X only (kCustom:
// cuSPARSE, unless a gradient is needed).
std::vector<at::Tensor> ProjectRowsTransposed(const at::Tensor& X,
                                              const std::vector<const SparseProjector*>& Ps,
                                              CudaKernels kernels = CudaKernels::kDefault);

// The compressed weight gradient of a linear layer without materialising G (docs/method.md):
//   S = P^T G Q with G = dY^T X, computed as S = (dY P)^T (X Q).
// dY: (N, m) any floating dtype (cast to fp32 before the projection); XQ: (N, d_q) = X Q from
// ProjectRows, or the transposed view .t() of ProjectRowsTransposed's (d_q, N) (any floating
// dtype, any strides: the GEMM reads it in place); P: (m, d_p). dY P is formed token-minor
// (ProjectRowsTransposed), then S = (dY P)^T (X Q) by one GEMM. Returns (d_p, d_q) fp32 (fp64 if dY
// and XQ are both fp64). Cost O(N m r + N d_p d_q). `kernels`: as ProjectRowsTransposed's.
at::Tensor CompressFactored(const at::Tensor& dY, const at::Tensor& XQ, const SparseProjector& P,
                            CudaKernels kernels = CudaKernels::kDefault);

// The same S = P^T G Q (d, d) from a dense gradient G (m, n), e.g. calibration gradients. Two
// sparse passes, O(m n r + n d r). Returns fp32 (fp64 if G is fp64). Differentiable in G and
// the projector values.
at::Tensor CompressDense(const at::Tensor& G, const SparseProjector& P, const SparseProjector& Q);

// The full-space step P D Q^T (m, n) without densifying P or Q: first E = D Q^T (d, n) by
// gathering rows of D^T, then P E by gathering rows of E. D: (P.d, Q.d) any floating dtype.
// Returns (P.rows, Q.rows) fp32 (fp64 if D is fp64). Cost O(n d r + m n r).
at::Tensor ExpandStep(const SparseProjector& P, const at::Tensor& D, const SparseProjector& Q);

// The fused apply (docs/method.md "Apply on the GPU before the layer's next forward"), in place:
//   W <- round(decay (W + C) + P D Q^T),  C <- what the rounding dropped (compensated only).
// E = D Q^T (d_p, n) is formed once (small), then one pass over W reads and writes each
// element once (and C's): lsp/apply_kernel.h on the CPU, lsp::cuda::ApplyFused on CUDA, per
// element in fp32 in the order given there (fp64 W: the ATen path in fp64, nothing rounded).
// W: (m, n) fp32/bf16/fp16/fp64, contiguous, any device; C: nullptr, or (m, n) like W for
// Rounding::kCompensated (required then, 16-bit W only). P (m, d_p), D (d_p, d_q) any floating
// dtype on W's device, Q (n, d_q). decay: the decoupled weight-decay factor 1 - lr * wd (1 =
// none), applied to W (+ C) before the step is added (AdamW, Loshchilov & Hutter 2019).
// rounding: how the fp32 sum is stored into 16-bit W (lsp/rounding.h; fp32 W stores it as is);
// seed: the noise seed of kStochastic (the same seed gives the same bits on the CPU and CUDA).
// Dense projectors (GaLore-Offload) form P D Q^T by GEMMs, then round alike. CUDA: the fused
// kernel runs on the legacy default stream whenever the project's kernels are built, unless
// `kernels` resolves to ATen (kAten, or kDefault with LSPO_CUDA_KERNELS=aten: the ATen apply,
// for comparison). Mismatched operands are programmer errors (CHECKed).
void ApplyStepFused(at::Tensor& W, at::Tensor* C, const SparseProjector& P, const at::Tensor& D,
                    const SparseProjector& Q, double decay, Rounding rounding, uint64_t seed,
                    CudaKernels kernels = CudaKernels::kDefault);

// W <- W + P D Q^T: ApplyStepFused with decay 1 and round-to-nearest (one rounding into W's
// dtype, no double rounding of the step into bf16).
void ApplyStep(at::Tensor& W, const SparseProjector& P, const at::Tensor& D,
               const SparseProjector& Q);

// W <- round(decay (W + C) + P D Q^T), C <- the rounding residual, for 16-bit W (bf16/fp16):
// ApplyStepFused with Rounding::kCompensated, i.e. compensated (Kahan) summation of the steps
// into low-precision weights, so that updates smaller than half a ulp of W are carried in C
// instead of being lost. W + C tracks the fp32 master W0 + sum P D Q^T (decayed alike) to fp32
// rounding; |W - W_master| stays within half a ulp of W plus the rounding of C into its dtype
// (2^-9 of C's size per step). W, C: (m, n) bf16 or fp16, one dtype and device, contiguous.
void ApplyStepCompensated(at::Tensor& W, at::Tensor& C, const SparseProjector& P,
                          const at::Tensor& D, const SparseProjector& Q, double decay);

// The compensation C of ApplyStepCompensated for 16-bit weights W taken from fp32 values
// `master` (m, n): W = round(master) (written into W) and C = round(master - W), so that
// W + C == master to about 2^-17 relative. W: (m, n) bf16/fp16; returns C like W.
at::Tensor RoundWithResidual(at::Tensor& W, const at::Tensor& master);

// Per element, |W - round(M)| in units of the ulp of round(M) in W's dtype (bf16: 8
// significant bits, fp16: 11), the largest over the matrix: how many representable steps the
// worker's weights W (m, n) sit from the rounding of the fp32 master M (m, n). 0 when W is
// exactly round(M); 1 means one neighbour away. An element smaller than the matrix's RMS
// counts with the ulp of the RMS: its error reaches y = x W^T in absolute terms, and below the
// typical weight's ulp it is within the rounding every 16-bit matrix has (a per-element ulp
// would call a 1e-9 error on a weight crossing zero thousands of ulps). W: bf16/fp16/fp32
// (fp32: ulp of fp32); M: floating, same shape.
double MaxDriftUlps(const at::Tensor& W, const at::Tensor& M);

// Relative estimation bias of the pair on G (docs/method.md): |P P^T G Q Q^T - G|_F / |G|_F.
// G: (m, n) floating. Computed in fp64 over row blocks of G (memory O(d n + block n)), with S =
// P^T G Q and the residual P S Q^T - G formed block by block; never densifies P or Q.
// Returns 0 when |G|_F == 0 (a zero gradient has no bias, by convention); returns NaN if G has
// non-finite entries (callers reject such G first, see fit.h).
double RelativeBias(const at::Tensor& G, const SparseProjector& P, const SparseProjector& Q);

namespace internal {
// Building blocks (differentiable in every floating input). index: (rows, r) int64,
// value: (rows, r) floating in the compute dtype.
// Scatter: P^T X for X (rows, K) -> (d, K). Gather: P E for E (d, K) -> (rows, K).
at::Tensor ScatterRows(const at::Tensor& X, const at::Tensor& index, const at::Tensor& value,
                       int64_t d);
at::Tensor GatherRows(const at::Tensor& E, const at::Tensor& index, const at::Tensor& value);
// A^T B for two projectors over the same rows: (d_a, d_b), O(rows r_a r_b).
at::Tensor CrossGram(const at::Tensor& index_a, const at::Tensor& value_a, int64_t d_a,
                     const at::Tensor& index_b, const at::Tensor& value_b, int64_t d_b);
// Test hook: true routes every kernel through the generic ATen index ops (the CUDA path) even
// on the CPU, so tests can compare both execution paths. Process-wide; default false.
void SetForceAtenKernels(bool force);
// The kernels `kernels` selects for CUDA tensors, kDefault resolved: kAten or kCustom as given;
// kDefault from LSPO_CUDA_KERNELS (custom / aten) when set, else kDefault (the fused apply with
// ATen's compression). Without a CUDA toolkit at build time the project's kernels are absent
// (CudaKernelsAvailable() false) and the choice has no effect.
CudaKernels ResolveCudaKernels(CudaKernels kernels);
bool CudaKernelsAvailable();
}  // namespace internal

}  // namespace lspo::lsp

#endif  // LSPO_LSP_PROJECTOR_H_
