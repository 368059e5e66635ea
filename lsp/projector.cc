// Sparse projectors and kernels. See projector.h for the contract and the dimension legend.
#include "lsp/projector.h"

#include "third_party/torch/torch_api.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "lsp/apply_kernel.h"
#include "lsp/project_kernel.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

#if LSPO_HAS_CUDA_KERNELS
#include "lsp/cuda/sparse_kernels.h"
#endif

namespace lspo::lsp {
namespace {

// Rows of G per block in RelativeBias: 2^21 fp64 elements (16 MiB) per temporary.
constexpr int64_t kBiasBlockElems = int64_t{1} << 21;

// Uniform integer in [0, bound) by rejection (unbiased, portable; std distributions are
// implementation-defined).
uint64_t UniformInt(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit = std::numeric_limits<uint64_t>::max() -
                         std::numeric_limits<uint64_t>::max() % bound;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}

// Uniform double in (0, 1]: 53 random bits.
double UniformOpen0(std::mt19937_64& rng) {
  return (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;
}

// Compute dtype of the kernels: fp64 stays fp64, everything else is accumulated in fp32.
at::ScalarType AccumType(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

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
      << fn << ": projector " << name << " index sizes " << P.index.sizes() << " vs rows="
      << P.rows << " r=" << P.r;
  CHECK(P.value.sizes() == P.index.sizes())
      << fn << ": projector " << name << " value " << P.value.sizes() << " vs index "
      << P.index.sizes();
}

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

// CUDA tensors: 1 = the project's kernels for everything (lsp/cuda: cuSPARSE SpMM for X P and
// dY P, the fused apply); 0 = ATen index ops for everything; 2 = the default: the fused apply,
// ATen for the compression (cuSPARSE there until it has been timed against ATen on a GPU,
// docs/gpu.md). From LSPO_CUDA_KERNELS (custom / aten / unset) or SetCudaKernels.
std::atomic<int> g_cuda_kernels{-1};  // -1 = not read from the environment yet.

int CudaKernelChoice() {
  int v = g_cuda_kernels.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* env = std::getenv("LSPO_CUDA_KERNELS");
    const std::string s = env != nullptr ? env : "";
    v = s == "custom" ? 1 : s == "aten" ? 0 : 2;
    g_cuda_kernels.store(v);
  }
  return v;
}

// The compression's kernels (ProjectRows, CompressFactored) on CUDA.
bool UseCudaKernels() { return CudaKernelChoice() == 1; }

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

bool UseCpuLoops(const at::Tensor& t) {
  return t.device().is_cpu() && !g_force_aten.load(std::memory_order_relaxed) &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble);
}

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
  const at::Tensor index_t = idx.t().contiguous();  // (r, rows)
  const at::Tensor value_t = val.t().contiguous();  // (r, rows)
  at::Tensor out = e.index_select(0, index_t[0]) * value_t[0].unsqueeze(1);  // (rows, K)
  for (int64_t j = 1; j < idx.size(1); ++j) {
    out.addcmul_(e.index_select(0, index_t[j]), value_t[j].unsqueeze(1));
  }
  return out;
}

// (rows, r): out[i, j] = <A[index[i, j], :], B[i, :]> for A (d, K), B (rows, K).
at::Tensor RowDotsKernel(const at::Tensor& A, const at::Tensor& index, const at::Tensor& B) {
  const at::Tensor a = A.contiguous();
  const at::Tensor b = B.to(a.scalar_type()).contiguous();
  const at::Tensor idx = index.contiguous();
  if (UseCpuLoops(a)) {
    at::Tensor out = at::empty({idx.size(0), idx.size(1)}, a.options());
    AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "RowDotsCpu", [&] {
      RowDotsCpu<scalar_t>(a.data_ptr<scalar_t>(), idx.data_ptr<int64_t>(),
                           b.data_ptr<scalar_t>(), idx.size(0), idx.size(1), a.size(1),
                           out.data_ptr<scalar_t>());
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

// (X P)^T (P.d, N) contiguous in `acc` (fp32/fp64) for X (N, rows) and each projector of
// `ps` (all with P.rows == rows). A dense projector: one GEMM (BLAS / cuBLAS), any device.
// CPU, fp32 accumulation, nothing needing a gradient: one token-tiled pass over X for all the
// sparse ones (lsp/project_kernel.h). Otherwise per projector: the CUDA kernel
// (LSPO_CUDA_KERNELS=custom) or the differentiable scatter on X^T (ATen index ops; the CPU
// loops for fp64).
std::vector<at::Tensor> RowsTimesPT(const at::Tensor& X,
                                    const std::vector<const SparseProjector*>& ps,
                                    at::ScalarType acc) {
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
    std::vector<at::Tensor> keep;         // contiguous index / value operands
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
    if (X.is_cuda() && !needs_grad && acc == at::kFloat && UseCudaKernels()) {
      const at::Tensor x = X.to(at::kFloat).contiguous();           // (N, rows)
      const at::Tensor idx = P.index.to(at::kInt).contiguous();     // (rows, r) int32
      const at::Tensor val = P.value.to(at::kFloat).contiguous();   // (rows, r)
      at::Tensor out = at::empty({x.size(0), P.d}, x.options());    // (N, d)
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// SparseProjector

absl::StatusOr<SparseProjector> SparseProjector::Random(int64_t rows, int64_t d, int64_t r,
                                                        uint64_t seed) {
  if (rows <= 0 || d <= 0 || r <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector::Random: rows=%d d=%d r=%d; expected all > 0", rows, d, r));
  }
  if (r > d) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector::Random: r=%d non-zeros per row exceed the subspace dimension d=%d; "
        "each row needs r distinct columns. Fix: choose r <= d",
        r, d));
  }
  std::mt19937_64 rng(seed);
  at::Tensor index = at::empty({rows, r}, at::kLong);   // (rows, r) int64
  at::Tensor value = at::empty({rows, r}, at::kFloat);  // (rows, r) fp32
  int64_t* idx = index.data_ptr<int64_t>();
  float* val = value.data_ptr<float>();
  std::vector<char> taken(static_cast<size_t>(d), 0);
  std::vector<int64_t> chosen;
  chosen.reserve(static_cast<size_t>(r));
  const double stddev = 1.0 / std::sqrt(static_cast<double>(r));
  double spare = 0;
  bool has_spare = false;
  for (int64_t i = 0; i < rows; ++i) {
    // Floyd's algorithm: a uniformly random r-subset of [0, d) in r draws.
    chosen.clear();
    for (int64_t top = d - r; top < d; ++top) {
      const auto t = static_cast<int64_t>(UniformInt(rng, static_cast<uint64_t>(top) + 1));
      const int64_t pick = taken[static_cast<size_t>(t)] ? top : t;
      taken[static_cast<size_t>(pick)] = 1;
      chosen.push_back(pick);
    }
    std::sort(chosen.begin(), chosen.end());
    for (int64_t j = 0; j < r; ++j) {
      idx[i * r + j] = chosen[static_cast<size_t>(j)];
      taken[static_cast<size_t>(chosen[static_cast<size_t>(j)])] = 0;
      // Box-Muller, both outputs used.
      double z;
      if (has_spare) {
        z = spare;
        has_spare = false;
      } else {
        const double radius = std::sqrt(-2.0 * std::log(UniformOpen0(rng)));
        const double angle = 2.0 * M_PI * UniformOpen0(rng);
        z = radius * std::cos(angle);
        spare = radius * std::sin(angle);
        has_spare = true;
      }
      val[i * r + j] = static_cast<float>(z * stddev);
    }
  }
  SparseProjector p;
  p.index = index;
  p.value = value;
  p.rows = rows;
  p.d = d;
  p.r = r;
  return p;
}

absl::StatusOr<SparseProjector> SparseProjector::Identity(int64_t rows) {
  if (rows <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SparseProjector::Identity: rows=%d; expected > 0", rows));
  }
  SparseProjector p;
  p.index = at::arange(rows, at::kLong).unsqueeze(1).contiguous();  // (rows, 1) int64
  p.value = at::ones({rows, 1}, at::kFloat);                        // (rows, 1) fp32
  p.rows = rows;
  p.d = rows;
  p.r = 1;
  p.identity = true;
  return p;
}

absl::StatusOr<SparseProjector> SparseProjector::FromDense(const at::Tensor& M) {
  if (!M.defined() || M.dim() != 2 || M.size(0) < 1 || M.size(1) < 1 ||
      !at::isFloatingType(M.scalar_type())) {
    return absl::InvalidArgumentError(
        "SparseProjector::FromDense: expected a floating (rows, d) matrix with rows, d >= 1");
  }
  try {
    torch::NoGradGuard no_grad;
    SparseProjector p;
    p.rows = M.size(0);
    p.d = M.size(1);
    p.r = p.d;
    p.value = M.to(at::kFloat).contiguous();
    if (!at::isfinite(p.value).all().item<bool>()) {
      return absl::InvalidArgumentError("SparseProjector::FromDense: the matrix is not finite");
    }
    // (rows, d) int64, 0..d-1 on every row: a stride-0 view of one (d) row, so a dense
    // projector costs no index memory on the device (the dense kernels never read it).
    p.index = at::arange(p.d, at::TensorOptions().dtype(at::kLong).device(M.device()))
                  .unsqueeze(0)
                  .expand({p.rows, p.d});
    p.dense = true;
    p.identity = false;
    return p;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("SparseProjector::FromDense: ", e.what()));
  }
}

absl::StatusOr<SparseProjector> SparseProjector::ForSide(int64_t rows, int64_t d, int64_t r,
                                                         bool identity, uint64_t seed) {
  if (identity) return Identity(rows);
  return Random(rows, d, r, seed);
}

absl::StatusOr<SparseProjector> SparseProjector::FromTensors(const at::Tensor& index,
                                                             const at::Tensor& value,
                                                             int64_t d) {
  if (!index.defined() || !value.defined() || index.dim() != 2) {
    return absl::InvalidArgumentError(
        "SparseProjector::FromTensors: index must be a defined 2-D (rows, r) tensor");
  }
  if (!at::isIntegralType(index.scalar_type(), /*includeBool=*/false) ||
      !at::isFloatingType(value.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector::FromTensors: index dtype %s / value dtype %s; expected an integer "
        "index and a floating value",
        std::string(c10::toString(index.scalar_type())),
        std::string(c10::toString(value.scalar_type()))));
  }
  SparseProjector p;
  try {
    p.index = index.to(at::kLong).contiguous();
    p.value = value.to(index.device(), at::kFloat).contiguous();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseProjector::FromTensors: cannot convert tensors: ", e.what()));
  }
  p.rows = index.size(0);
  p.r = index.size(1);
  p.d = d;
  absl::Status st = p.Validate();
  if (!st.ok()) return st;
  if (p.r == 1 && p.d == p.rows) {
    try {
      torch::NoGradGuard no_grad;
      const at::Tensor ar = at::arange(p.rows, p.index.options());  // (rows) int64
      p.identity = at::equal(p.index.reshape({-1}), ar) &&
                   at::equal(p.value.reshape({-1}), at::ones({p.rows}, p.value.options()));
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("SparseProjector::FromTensors: ", e.what()));
    }
  }
  if (!p.identity && p.r == p.d) {
    try {
      torch::NoGradGuard no_grad;
      const at::Tensor ar = at::arange(p.d, p.index.options()).unsqueeze(0);  // (1, d) int64
      p.dense = at::equal(p.index, ar.expand({p.rows, p.d}));
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("SparseProjector::FromTensors: ", e.what()));
    }
  }
  return p;
}

absl::Status SparseProjector::Validate() const {
  if (!index.defined() || !value.defined()) {
    return absl::InvalidArgumentError("SparseProjector: index/value undefined (empty projector)");
  }
  if (index.scalar_type() != at::kLong || value.scalar_type() != at::kFloat) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector: index dtype %s, value dtype %s; expected int64 and fp32",
        std::string(c10::toString(index.scalar_type())),
        std::string(c10::toString(value.scalar_type()))));
  }
  if (index.dim() != 2 || index.size(0) != rows || index.size(1) != r ||
      value.sizes() != index.sizes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector: index sizes %s, value sizes %s; expected (rows, r) = (%d, %d) for both",
        c10::str(index.sizes()), c10::str(value.sizes()), rows, r));
  }
  if (index.device() != value.device()) {
    return absl::InvalidArgumentError("SparseProjector: index and value on different devices");
  }
  if (rows <= 0 || d <= 0 || r <= 0 || r > d) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector: rows=%d d=%d r=%d; expected rows, d, r > 0 and r <= d", rows, d, r));
  }
  try {
    torch::NoGradGuard no_grad;
    const at::Tensor idx = index.cpu();
    const int64_t lo = idx.min().item<int64_t>();
    const int64_t hi = idx.max().item<int64_t>();
    if (lo < 0 || hi >= d) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SparseProjector: column indices span [%d, %d]; expected [0, %d). The projector was "
          "written for another d",
          lo, hi, d));
    }
    if (r > 1) {
      const at::Tensor sorted = std::get<0>(idx.sort(1));  // (rows, r)
      const at::Tensor dup = (sorted.slice(1, 1) == sorted.slice(1, 0, r - 1)).any(1);  // (rows)
      if (dup.any().item<bool>()) {
        const int64_t row = dup.nonzero()[0][0].item<int64_t>();
        return absl::InvalidArgumentError(absl::StrFormat(
            "SparseProjector: row %d repeats a column index; expected r=%d distinct columns "
            "per row. Fix: re-initialise with SparseProjector::Random",
            row, r));
      }
    }
    if (!at::isfinite(value).all().item<bool>()) {
      return absl::InvalidArgumentError(
          "SparseProjector: value has non-finite entries; expected finite values. Fix: "
          "re-initialise or refit the projector");
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("SparseProjector::Validate: ", e.what()));
  }
  return absl::OkStatus();
}

at::Tensor SparseProjector::Dense() const {
  torch::NoGradGuard no_grad;
  return at::zeros({rows, d}, value.options().dtype(at::kFloat))
      .scatter_(1, index, value.to(at::kFloat));  // (rows, d) fp32
}

SparseProjector SparseProjector::To(const at::Device& device) const {
  SparseProjector p = *this;
  p.index = index.to(device);
  p.value = value.to(device);
  return p;
}

// ---------------------------------------------------------------------------------------------
// Building blocks

namespace internal {

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

void SetForceAtenKernels(bool force) { g_force_aten.store(force); }
void SetCudaKernels(bool custom) { g_cuda_kernels.store(custom ? 1 : 0); }
bool CudaKernelsAvailable() {
#if LSPO_HAS_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

}  // namespace internal

// ---------------------------------------------------------------------------------------------
// Kernels

at::Tensor ProjectRows(const at::Tensor& X, const SparseProjector& P) {
  CheckOperand(X, "ProjectRows", "X");
  CheckProjector(P, "ProjectRows", "P", X);
  CHECK_EQ(X.size(1), P.rows) << "ProjectRows: X " << X.sizes() << " vs P rows " << P.rows;
  return RowsTimesPT(X, {&P}, AccumType(X.scalar_type()))[0].t().to(X.scalar_type()).contiguous();
}

std::vector<at::Tensor> ProjectRowsTransposed(const at::Tensor& X,
                                              const std::vector<const SparseProjector*>& Ps) {
  CheckOperand(X, "ProjectRowsTransposed", "X");
  CHECK(!Ps.empty()) << "ProjectRowsTransposed: no projectors";
  for (const SparseProjector* P : Ps) {
    CHECK(P != nullptr) << "ProjectRowsTransposed: null projector";
    CheckProjector(*P, "ProjectRowsTransposed", "P", X);
    CHECK_EQ(X.size(1), P->rows) << "ProjectRowsTransposed: X " << X.sizes() << " vs P rows "
                                 << P->rows;
  }
  return RowsTimesPT(X, Ps, AccumType(X.scalar_type()));
}

at::Tensor CompressFactored(const at::Tensor& dY, const at::Tensor& XQ,
                            const SparseProjector& P) {
  CheckOperand(dY, "CompressFactored", "dY");
  CheckOperand(XQ, "CompressFactored", "XQ");
  CheckProjector(P, "CompressFactored", "P", dY);
  CHECK(XQ.device() == dY.device()) << "CompressFactored: dY and XQ on different devices";
  CHECK(dY.size(1) == P.rows && XQ.size(0) == dY.size(0))
      << "CompressFactored: dY " << dY.sizes() << ", XQ " << XQ.sizes() << ", P (" << P.rows
      << ", " << P.d << ")";
  const at::ScalarType ct = (dY.scalar_type() == at::kDouble && XQ.scalar_type() == at::kDouble)
                                ? at::kDouble
                                : at::kFloat;
  const at::Tensor dyp_t = RowsTimesPT(dY, {&P}, ct)[0];  // (d_p, N) = (dY P)^T
  return dyp_t.mm(XQ.to(ct));                              // (d_p, d_q) = (dY P)^T (X Q)
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
  return st.t().contiguous();                                            // (dP, dQ)
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
  const at::Tensor dt = D.to(ct).t().contiguous();                          // (dQ, dP)
  const at::Tensor et = internal::GatherRows(dt, Q.index, Q.value);         // (n, dP) = Q D^T
  return internal::GatherRows(et.t().contiguous(), P.index, P.value);       // (m, n)
}

namespace {
// E = D Q^T (P.d, n) fp32 contiguous, by gathering rows of D^T: the first stage of the fused
// apply W += P E (CPU loops and the CUDA row kernel alike). On the CPU one kernel forms E in
// place of the gather and its transpose (lsp/apply_kernel.h StepTimesQtCpu, the same bits).
at::Tensor StepTimesQt(const at::Tensor& D, const SparseProjector& Q) {
  const at::Tensor dt = D.to(at::kFloat).t().contiguous();        // (dQ, dP)
  if (dt.device().is_cpu() && !g_force_aten.load(std::memory_order_relaxed)) {
    const at::Tensor idx = Q.index.contiguous();
    const at::Tensor val = Q.value.to(at::kFloat).contiguous();
    at::Tensor e = at::empty({D.size(0), Q.rows}, dt.options());  // (dP, n)
    const absl::Status st =
        StepTimesQtCpu(dt.data_ptr<float>(), D.size(0), D.size(1), idx.data_ptr<int64_t>(),
                       val.data_ptr<float>(), Q.rows, Q.r, e.data_ptr<float>());
    CHECK(st.ok()) << "StepTimesQt: " << st;
    return e;
  }
  return GatherKernel(dt, Q.index, Q.value).t().contiguous();    // (dP, n)
}
}  // namespace

namespace {

// CUDA applies use the fused kernel unless the ATen kernels were chosen (lsp.kernels: aten).
bool UseCudaFusedApply() {
  return CudaKernelChoice() != 0 && !g_force_aten.load(std::memory_order_relaxed);
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
    W.copy_(t);                                // one rounding into W's dtype
    C->copy_(t.sub_(W.to(t.scalar_type())));   // what that rounding dropped
    return;
  }
  const at::Tensor host = t.to(at::kCPU, at::kFloat).contiguous();
  at::Tensor bits = at::empty(host.sizes(), host.options().dtype(at::kShort));
  const absl::Status st = RoundStochastic(host.data_ptr<float>(),
                                          reinterpret_cast<uint16_t*>(bits.data_ptr<int16_t>()),
                                          host.numel(), dtype, seed);
  CHECK(st.ok()) << "ApplyStepFused: " << st;
  W.copy_(bits.view(W.scalar_type()).to(W.device()));
}

}  // namespace

void ApplyStepFused(at::Tensor& W, at::Tensor* C, const SparseProjector& P, const at::Tensor& D,
                    const SparseProjector& Q, double decay, Rounding rounding, uint64_t seed) {
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
          C->scalar_type() == W.scalar_type() && C->device() == W.device() &&
          C->is_contiguous())
        << "ApplyStepFused: C must match W " << W.sizes() << " " << W.scalar_type();
  }
  torch::NoGradGuard no_grad;
  const bool sparse = !P.dense && !Q.dense;
  const bool fused = sparse && kernel_dtype && W.is_contiguous();
  at::Tensor* c = rounding == Rounding::kCompensated ? C : nullptr;
  if (fused && W.device().is_cpu() && !g_force_aten.load(std::memory_order_relaxed)) {
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
  if (fused && W.is_cuda() && UseCudaFusedApply()) {
    const at::Tensor e = StepTimesQt(D, Q);                       // (dP, n) fp32 on the device
    const at::Tensor idx = P.index.to(at::kInt).contiguous();     // (m, r) int32
    const at::Tensor val = P.value.to(at::kFloat).contiguous();   // (m, r)
    const int rc = cuda::ApplyFused(W.data_ptr(), c != nullptr ? c->data_ptr() : nullptr,
                                    static_cast<int>(dtype), W.size(0), W.size(1),
                                    e.data_ptr<float>(), idx.data_ptr<int32_t>(),
                                    val.data_ptr<float>(), P.r, static_cast<float>(decay),
                                    static_cast<int>(rounding), seed, /*stream=*/nullptr);
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
  CHECK(W.sizes() == master.sizes()) << "RoundWithResidual: W " << W.sizes() << " vs master "
                                     << master.sizes();
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
