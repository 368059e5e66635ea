// The kernels behind the operations of projector.h (internal to lsp/): the operand checks, the
// compute dtype, the ATen-forcing test hook, the sparse products P^T X
// and P E on any device, and (X P)^T for several projectors at once. Dimension legend:
// projector.h. Operands are already validated (projector.h "Error handling"): a mismatch is a
// programmer error and is CHECKed.
//
// Thread-safety: the kernels are pure functions of their operands and of the CUDA kernel choice
// passed with them; the test hook internal::SetForceAtenKernels is process-wide.
#ifndef LSPO_LSP_PROJECTOR_KERNELS_H_
#define LSPO_LSP_PROJECTOR_KERNELS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "lsp/apply_kernel.h"
#include "lsp/projector.h"

namespace lspo::lsp::kernels {

// Compute dtype of the kernels: fp64 stays fp64, everything else is accumulated in fp32.
at::ScalarType AccumType(at::ScalarType t);

// CHECKs that `t`, operand `name` of function `fn`, is a defined 2-D floating tensor.
void CheckOperand(const at::Tensor& t, const char* fn, const char* name);

// CHECKs that projector `name` of function `fn` is non-empty, on `operand`'s device, and that
// its index and value are both (P.rows, P.r).
void CheckProjector(const SparseProjector& P, const char* fn, const char* name,
                    const at::Tensor& operand);

// True when every kernel must use ATen index ops (internal::SetForceAtenKernels(true)).
bool ForceAten();

// The kernels' storage code of a weight or input dtype in `out`; false for dtypes they do not
// take (fp64 and non-floating types).
bool KernelDtype(at::ScalarType t, WeightDtype* out);

// P^T X (d, K) in X's dtype for X (rows, K), index (rows, r) int64, value (rows, r); no
// autograd. CPU loops for fp32/fp64 on the CPU, ATen index ops elsewhere.
at::Tensor ScatterKernel(const at::Tensor& X, const at::Tensor& index, const at::Tensor& value,
                         int64_t d);

// P E (rows, K) in E's dtype for E (d, K), index (rows, r) int64, value (rows, r); no
// autograd. CPU loops for fp32/fp64 on the CPU, ATen index ops elsewhere.
at::Tensor GatherKernel(const at::Tensor& E, const at::Tensor& index, const at::Tensor& value);

// (X P)^T (P.d, N), contiguous in `acc` (fp32 or fp64), for X (N, rows) and each projector of
// `ps` (all with P.rows == rows, checked by the caller). A dense projector: one GEMM (BLAS /
// cuBLAS), any device. CPU, fp32 accumulation, nothing needing a gradient: one token-tiled pass
// over X for all the sparse ones (lsp/project_kernel.h). Otherwise per projector: the CUDA
// kernel (`kernels` resolving to kCustom) or the differentiable scatter on X^T (ATen index ops;
// the CPU loops for fp64).
std::vector<at::Tensor> RowsTimesPT(const at::Tensor& X,
                                    const std::vector<const SparseProjector*>& ps,
                                    at::ScalarType acc, CudaKernels kernels);

}  // namespace lspo::lsp::kernels

#endif  // LSPO_LSP_PROJECTOR_KERNELS_H_
