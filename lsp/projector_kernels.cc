// The kernels behind projector.h's operations and their choice: plain CPU loops (fp32/fp64,
// oneTBB), ATen index ops (CUDA, 16-bit data), the project's CUDA kernels (lsp/cuda), the
// token-tiled CPU projection (lsp/project_kernel.h); the autograd wrappers the projector fit
// differentiates through; the building blocks of projector.h's `internal` namespace.
// Declarations: projector_kernels.h.
#include "lsp/projector_kernels.h"

#include "third_party/torch/torch_api.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "glog/logging.h"
#include "lsp/project_kernel.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

#if LSPO_HAS_CUDA_KERNELS
#include "lsp/cuda/sparse_kernels.h"
#endif

namespace lspo::lsp::kernels {

// Compute dtype of the kernels: fp64 stays fp64, everything else is accumulated in fp32.
at::ScalarType AccumType(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

void CheckOperand(const at::Tensor& t, const char* fn, const char* name) {
  CHECK(t.defined()) << fn << ": " << name << " is undefined";
  CHECK_EQ(t.dim(), 2) << fn << ": " << name << " must be 2-D, got sizes " << t.sizes();
  CHECK(at::isFloatingType(t.scalar_type()))
      << fn << ": " << name << " must be floating, got " << t.scalar_type();
}

void CheckProjector(const SparseProjector& P, const char* fn, const char* name,
                    const at::Tensor& operand) {
  CHECK(P.index.defined() && P.value.defined()) << fn << ": projector " << name << " is empty";
  CHECK(P.index.device() == operand.device() && P.value.device() == operand.device())
      << fn << ": projector " << name << " is on " << P.index.device() << " but the operand on "
      << operand.device() << "; move it with SparseProjector::To";
  CHECK(P.index.dim() == 2 && P.index.size(0) == P.rows && P.index.size(1) == P.r)
      << fn << ": projector " << name << " index sizes " << P.index.sizes() << " vs rows=" << P.rows
      << " r=" << P.r;
  CHECK(P.value.sizes() == P.index.sizes()) << fn << ": projector " << name << " value "
                                            << P.value.sizes() << " vs index " << P.index.sizes();
}

namespace {

// ---------------------------------------------------------------------------------------------
// Raw CPU loops (fp32/fp64, contiguous operands), parallelised with oneTBB. Each parallel task
// owns disjoint outputs, so results do not depend on the thread count or the split.

// fn(begin, end) over [0, n) in TBB tasks of at least `grain` items.
template <typename Fn>
void ParallelFor(int64_t n, int64_t grain, const Fn& fn) {
  if (n <= 0) return;
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, std::max<int64_t>(1, grain)),
                    [&](const tbb::blocked_range<int64_t>& r) { fn(r.begin(), r.end()); });
}

constexpr int64_t kColGrain = 256;  // columns per task in the scatter
constexpr int64_t kRowGrain = 8;    // rows per task in the gathers / dots

std::atomic<bool> g_force_aten{false};

// The choice of LSPO_CUDA_KERNELS (custom / aten; anything else or unset: kDefault), read once.
CudaKernels EnvironmentCudaKernels() {
  static const CudaKernels choice = [] {
    const char* env = std::getenv("LSPO_CUDA_KERNELS");
    const std::string s = env != nullptr ? env : "";
    return s == "custom" ? CudaKernels::kCustom
           : s == "aten" ? CudaKernels::kAten
                         : CudaKernels::kDefault;
  }();
  return choice;
}

// out (d, K) += P^T X for X (rows, K). Parallel over column blocks of K.
template <typename T>
void ScatterCpu(const T* x, int64_t rows, int64_t k, const int64_t* idx, const T* val, int64_t r,
                T* out) {
  ParallelFor(k, kColGrain, [&](int64_t c0, int64_t c1) {
    for (int64_t i = 0; i < rows; ++i) {
      const T* __restrict xi = x + i * k;
      for (int64_t j = 0; j < r; ++j) {
        const T v = val[i * r + j];
        T* __restrict o = out + idx[i * r + j] * k;
        for (int64_t c = c0; c < c1; ++c) o[c] += v * xi[c];
      }
    }
  });
}

// o (K) = sum_j val[j] * E[idx[j], :] for E (d, K): one row of P E, summed in j order.
template <typename T>
void CombineRows(const T* e, int64_t k, const int64_t* idx, const T* val, int64_t r,
                 T* __restrict o) {
  const T v0 = val[0];
  const T* __restrict e0 = e + idx[0] * k;
  for (int64_t c = 0; c < k; ++c) o[c] = v0 * e0[c];
  for (int64_t j = 1; j < r; ++j) {
    const T v = val[j];
    const T* __restrict ej = e + idx[j] * k;
    for (int64_t c = 0; c < k; ++c) o[c] += v * ej[c];
  }
}

// out (rows, K) = P E for E (d, K). Parallel over rows.
template <typename T>
void GatherCpu(const T* e, int64_t k, const int64_t* idx, const T* val, int64_t rows, int64_t r,
               T* out) {
  ParallelFor(rows, kRowGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) CombineRows(e, k, idx + i * r, val + i * r, r, out + i * k);
  });
}

// Dot product with 8 independent partial sums (lets the compiler use vector registers).
template <typename T>
T Dot(const T* __restrict a, const T* __restrict b, int64_t k) {
  T part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 8 <= k; c += 8) {
    for (int u = 0; u < 8; ++u) part[u] += a[c + u] * b[c + u];
  }
  T total = 0;
  for (; c < k; ++c) total += a[c] * b[c];
  for (int u = 0; u < 8; ++u) total += part[u];
  return total;
}

// out (rows, r): out[i, j] = <A[idx[i, j], :], B[i, :]> for A (d, K), B (rows, K).
template <typename T>
void RowDotsCpu(const T* a, const int64_t* idx, const T* b, int64_t rows, int64_t r, int64_t k,
                T* out) {
  ParallelFor(rows, kRowGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      for (int64_t j = 0; j < r; ++j) out[i * r + j] = Dot(a + idx[i * r + j] * k, b + i * k, k);
    }
  });
}

}  // namespace

// The kernels' storage code of a weight or input dtype; false for dtypes they do not take (fp64).
bool KernelDtype(at::ScalarType t, WeightDtype* out) {
  switch (t) {
    case at::kFloat:
      *out = WeightDtype::kFloat32;
      return true;
    case at::kBFloat16:
      *out = WeightDtype::kBFloat16;
      return true;
    case at::kHalf:
      *out = WeightDtype::kFloat16;
      return true;
    default:
      return false;
  }
}

bool ForceAten() { return g_force_aten.load(std::memory_order_relaxed); }

namespace {

bool UseCpuLoops(const at::Tensor& t) {
  return t.device().is_cpu() && !g_force_aten.load(std::memory_order_relaxed) &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Kernels (no autograd): CPU loops for fp32/fp64 on the CPU, ATen index ops elsewhere (CUDA,
// 16-bit types). index: (rows, r) int64; value: (rows, r) in the data's dtype.

// P^T X: X (rows, K) -> (d, K).
at::Tensor ScatterKernel(const at::Tensor& X, const at::Tensor& index, const at::Tensor& value,
                         int64_t d) {
  const at::Tensor x = X.contiguous();
  const at::Tensor idx = index.contiguous();
  const at::Tensor val = value.to(x.scalar_type()).contiguous();
  at::Tensor out = at::zeros({d, x.size(1)}, x.options());
  if (UseCpuLoops(x)) {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "ScatterCpu", [&] {
      ScatterCpu<scalar_t>(x.data_ptr<scalar_t>(), x.size(0), x.size(1), idx.data_ptr<int64_t>(),
                           val.data_ptr<scalar_t>(), idx.size(1), out.data_ptr<scalar_t>());
    });
    return out;
  }
  const at::Tensor index_t = idx.t().contiguous();  // (r, rows)
  const at::Tensor value_t = val.t().contiguous();  // (r, rows)
  for (int64_t j = 0; j < idx.size(1); ++j) {
    out.index_add_(0, index_t[j], x * value_t[j].unsqueeze(1));  // (rows, K) source
  }
  return out;
}

// P E: E (d, K) -> (rows, K).
at::Tensor GatherKernel(const at::Tensor& E, const at::Tensor& index, const at::Tensor& value) {
  const at::Tensor e = E.contiguous();
  const at::Tensor idx = index.contiguous();
  const at::Tensor val = value.to(e.scalar_type()).contiguous();
  if (UseCpuLoops(e)) {
    at::Tensor out = at::empty({idx.size(0), e.size(1)}, e.options());
    AT_DISPATCH_FLOATING_TYPES(e.scalar_type(), "GatherCpu", [&] {
      GatherCpu<scalar_t>(e.data_ptr<scalar_t>(), e.size(1), idx.data_ptr<int64_t>(),
                          val.data_ptr<scalar_t>(), idx.size(0), idx.size(1),
                          out.data_ptr<scalar_t>());
    });
    return out;
  }
  const at::Tensor index_t = idx.t().contiguous();                           // (r, rows)
  const at::Tensor value_t = val.t().contiguous();                           // (r, rows)
  at::Tensor out = e.index_select(0, index_t[0]) * value_t[0].unsqueeze(1);  // (rows, K)
  for (int64_t j = 1; j < idx.size(1); ++j) {
    out.addcmul_(e.index_select(0, index_t[j]), value_t[j].unsqueeze(1));
  }
  return out;
}

namespace {

// (rows, r): out[i, j] = <A[index[i, j], :], B[i, :]> for A (d, K), B (rows, K).
at::Tensor RowDotsKernel(const at::Tensor& A, const at::Tensor& index, const at::Tensor& B) {
  const at::Tensor a = A.contiguous();
  const at::Tensor b = B.to(a.scalar_type()).contiguous();
  const at::Tensor idx = index.contiguous();
  if (UseCpuLoops(a)) {
    at::Tensor out = at::empty({idx.size(0), idx.size(1)}, a.options());
    AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "RowDotsCpu", [&] {
      RowDotsCpu<scalar_t>(a.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(), b.data_ptr<scalar_t>(),
                           idx.size(0), idx.size(1), a.size(1), out.data_ptr<scalar_t>());
    });
    return out;
  }
  const at::Tensor index_t = idx.t().contiguous();  // (r, rows)
  std::vector<at::Tensor> cols;
  for (int64_t j = 0; j < idx.size(1); ++j) {
    cols.push_back((a.index_select(0, index_t[j]) * b).sum(1));  // (rows)
  }
  return at::stack(cols, 1);  // (rows, r)
}

// ---------------------------------------------------------------------------------------------
// Autograd wrappers: the fit differentiates through P^T X w.r.t. both X and the values.

class ScatterRowsFn : public torch::autograd::Function<ScatterRowsFn> {
 public:
  // x (rows, K), value (rows, r) same dtype, index (rows, r) -> (d, K)
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& value, const at::Tensor& index, int64_t d) {
    ctx->save_for_backward({x, value, index});
    return ScatterKernel(x, index, value, d);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor g = grads[0].contiguous();  // (d, K)
    at::Tensor dx, dvalue;
    if (ctx->needs_input_grad(0)) dx = GatherKernel(g, saved[2], saved[1]);       // (rows, K)
    if (ctx->needs_input_grad(1)) dvalue = RowDotsKernel(g, saved[2], saved[0]);  // (rows, r)
    return {dx, dvalue, at::Tensor(), at::Tensor()};
  }
};

class GatherRowsFn : public torch::autograd::Function<GatherRowsFn> {
 public:
  // e (d, K), value (rows, r) same dtype, index (rows, r) -> (rows, K)
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& e,
                            const at::Tensor& value, const at::Tensor& index) {
    ctx->save_for_backward({e, value, index});
    return GatherKernel(e, index, value);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor g = grads[0].contiguous();  // (rows, K)
    at::Tensor de, dvalue;
    if (ctx->needs_input_grad(0)) de = ScatterKernel(g, saved[2], saved[1], saved[0].size(0));
    if (ctx->needs_input_grad(1)) dvalue = RowDotsKernel(saved[0], saved[2], g);
    return {de, dvalue, at::Tensor()};
  }
};

}  // namespace

// (X P)^T (P.d, N) contiguous in `acc` (fp32/fp64) for X (N, rows) and each projector of
// `ps` (all with P.rows == rows). A dense projector: one GEMM (BLAS / cuBLAS), any device.
// CPU, fp32 accumulation, nothing needing a gradient: one token-tiled pass over X for all the
// sparse ones (lsp/project_kernel.h). Otherwise per projector: the CUDA kernel (`kernels`
// resolving to kCustom) or the differentiable scatter on X^T (ATen index ops; the CPU loops
// for fp64).
std::vector<at::Tensor> RowsTimesPT(const at::Tensor& X,
                                    const std::vector<const SparseProjector*>& ps,
                                    at::ScalarType acc, CudaKernels kernels) {
  bool needs_grad = false;
  for (const SparseProjector* p : ps) needs_grad = needs_grad || p->value.requires_grad();
  needs_grad = at::GradMode::is_enabled() && (needs_grad || X.requires_grad());
  std::vector<at::Tensor> outs(ps.size());
  bool all_dense = true;
  for (size_t k = 0; k < ps.size(); ++k) {
    if (ps[k]->dense) {  // (d, N) = P^T X^T by one GEMM (BLAS / cuBLAS), any device
      outs[k] = at::mm(ps[k]->value.to(acc).t(), X.to(acc).t()).contiguous();
    } else {
      all_dense = false;
    }
  }
  if (all_dense) return outs;
  WeightDtype x_dtype;
  if (X.device().is_cpu() && !needs_grad && !g_force_aten.load(std::memory_order_relaxed) &&
      acc == at::kFloat && KernelDtype(X.scalar_type(), &x_dtype)) {
    const at::Tensor x = X.contiguous();  // (N, rows)
    std::vector<ProjectTarget> targets;
    std::vector<at::Tensor> keep;  // contiguous index / value operands
    for (size_t k = 0; k < ps.size(); ++k) {
      const SparseProjector& P = *ps[k];
      if (P.dense) continue;
      outs[k] = at::empty({P.d, x.size(0)}, x.options().dtype(at::kFloat));
      keep.push_back(P.index.contiguous());
      keep.push_back(P.value.to(at::kFloat).contiguous());
      ProjectTarget t;
      t.index = keep[keep.size() - 2].data_ptr<int64_t>();
      t.value = keep.back().data_ptr<float>();
      t.d = P.d;
      t.r = P.r;
      t.out = outs[k].data_ptr<float>();
      targets.push_back(t);
    }
    if (!targets.empty()) {
      ProjectArgs args;
      args.x = x.data_ptr();
      args.dtype = x_dtype;
      args.n_tok = x.size(0);
      args.rows = x.size(1);
      args.targets = targets.data();
      args.n_targets = static_cast<int64_t>(targets.size());
      const absl::Status st = ProjectTokensCpu(args);
      CHECK(st.ok()) << st;  // the operands were checked by the callers
    }
    return outs;
  }
  for (size_t k = 0; k < ps.size(); ++k) {
    const SparseProjector& P = *ps[k];
    if (P.dense) continue;
#if LSPO_HAS_CUDA_KERNELS
    if (X.is_cuda() && !needs_grad && acc == at::kFloat &&
        internal::ResolveCudaKernels(kernels) == CudaKernels::kCustom) {
      const at::Tensor x = X.to(at::kFloat).contiguous();          // (N, rows)
      const at::Tensor idx = P.index.to(at::kInt).contiguous();    // (rows, r) int32
      const at::Tensor val = P.value.to(at::kFloat).contiguous();  // (rows, r)
      at::Tensor out = at::empty({x.size(0), P.d}, x.options());   // (N, d)
      const int rc = cuda::ProjectRows(x.data_ptr<float>(), x.size(0), x.size(1),
                                       idx.data_ptr<int32_t>(), val.data_ptr<float>(), P.d, P.r,
                                       out.data_ptr<float>(), /*stream=*/nullptr);
      TORCH_CHECK(rc == 0, "lsp::ProjectRows: CUDA/cuSPARSE error ", rc);
      outs[k] = out.t().contiguous();
      continue;
    }
#endif
    outs[k] = internal::ScatterRows(X.to(acc).t().contiguous(), P.index, P.value, P.d);
  }
  return outs;
}

}  // namespace lspo::lsp::kernels

// ---------------------------------------------------------------------------------------------
// Building blocks

namespace lspo::lsp::internal {

using kernels::GatherRowsFn;
using kernels::ScatterRowsFn;

at::Tensor ScatterRows(const at::Tensor& X, const at::Tensor& index, const at::Tensor& value,
                       int64_t d) {
  return ScatterRowsFn::apply(X.contiguous(), value.to(X.scalar_type()), index, d);
}

at::Tensor GatherRows(const at::Tensor& E, const at::Tensor& index, const at::Tensor& value) {
  return GatherRowsFn::apply(E.contiguous(), value.to(E.scalar_type()), index);
}

at::Tensor CrossGram(const at::Tensor& index_a, const at::Tensor& value_a, int64_t d_a,
                     const at::Tensor& index_b, const at::Tensor& value_b, int64_t d_b) {
  // Row i contributes value_a[i, j] * value_b[i, k] at (index_a[i, j], index_b[i, k]).
  const at::Tensor flat =
      (index_a.unsqueeze(2) * d_b + index_b.unsqueeze(1)).reshape({-1});  // (rows r_a r_b)
  const at::Tensor prod =
      (value_a.unsqueeze(2) * value_b.to(value_a.scalar_type()).unsqueeze(1)).reshape({-1});
  return at::zeros({d_a * d_b}, value_a.options()).index_add_(0, flat, prod).view({d_a, d_b});
}

void SetForceAtenKernels(bool force) { kernels::g_force_aten.store(force); }
CudaKernels ResolveCudaKernels(CudaKernels kernels) {
  return kernels != CudaKernels::kDefault ? kernels : kernels::EnvironmentCudaKernels();
}
bool CudaKernelsAvailable() {
#if LSPO_HAS_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

}  // namespace lspo::lsp::internal
