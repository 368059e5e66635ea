// The LSP linear layer (docs/method.md "Math"): a model::LinearImpl that trains a model's
// linears through the compressed gradient S = P^T G Q instead of G.
//
// Legend: N tokens, m out-features and n in-features of W (m, n) (HF layout: y = x W^T),
// d_p, d_q subspace sizes of the projectors P (m, d_p), Q (n, d_q) (d_p = d_q = d unless
// lsp/subspace.h gives the matrix a one-sided or per-matrix subspace), r non-zeros per row.
//
// For y = x W^T with upstream gradient dY (N, m) the weight gradient is G = dY^T X (m, n).
// The forward saves XQ = X Q (N, d_q) (kept token-minor as (X Q)^T, lsp::ProjectRowsTransposed;
// the linears that read one input, q|k|v and gate|up, get theirs from one pass over X); the
// backward computes dX = dY W and S = (dY P)^T XQ = P^T G Q (d_p, d_q) fp32
// (lsp::CompressFactored), hands S to the sink and
// returns NO weight gradient: G is never materialised. The backward node runs even when
// nothing upstream is trainable (e.g. layer 0 with a frozen embedding), so loss.backward()
// works with every parameter frozen. W must not be modified in place between a forward and its
// backward (the node saves W and checks its version, as autograd does: a violation throws
// c10::Error from backward()). A linear without projectors computes as frozen (a warning is
// logged; ValidateReady reports it).
//
// Thread-safety: not thread-safe; used by one model, from the thread running its forward. The
// sink runs on the thread that calls backward.
#ifndef LSPO_LSP_LSP_LINEAR_H_
#define LSPO_LSP_LSP_LINEAR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"
#include "lsp/projector.h"
#include "model/linear_impl.h"
#include "model/llama.h"

namespace lspo::lsp {

// Receives S (d_p, d_q) fp32 of linear `linear_index` during backward. S is a fresh tensor the sink
// may keep. The sink must not throw.
using CompressedGradSink =
    std::function<void(int64_t linear_index, const at::Tensor& S /* (d_p, d_q) fp32 */)>;

class LspLinears : public model::LinearImpl {
 public:
  // Projector slots for every linear of `model` (names and (m, n) recorded from it). The
  // caller installs the result with model.SetLinearImpl and sets the linears it trains to
  // model::LinearMode::kCustom.
  explicit LspLinears(const model::LlamaModel& model);

  // Installs the projectors of linear i: P (m, d_p), Q (n, d_q), sparse or the identity. They
  // are used by the next forward (a forward already recorded keeps the projectors it saw).
  // Errors: kInvalidArgument for i out of range, P.rows != m, Q.rows != n, or d_p, d_q < 1.
  absl::Status SetProjectors(int64_t i, SparseProjector P, SparseProjector Q);
  bool HasProjectors(int64_t i) const;

  // Dense compression (JobSpec lsp.compression: dense): X Q and dY P by GEMMs with the
  // projectors densified, (m, d_p) and (n, d_q) fp32 on the projectors' device, made once per
  // SetProjectors / To (4 (m d_p + n d_q) bytes per linear); the linears that share an input
  // (q|k|v, gate|up) get X Q from one GEMM with their dense Q's side by side. An identity side
  // stays as it is. false (the default): the sparse kernels. Takes effect at the next forward.
  void SetDenseCompression(bool dense);
  bool dense_compression() const { return dense_; }

  // The kernels CUDA tensors use for X Q and dY P (JobSpec lsp.kernels, lsp/projector.h), this
  // object's and its backward nodes' own: kDefault until set. Takes effect at the next forward.
  void SetCudaKernels(CudaKernels kernels) { kernels_ = kernels; }
  CudaKernels cuda_kernels() const { return kernels_; }

  // kFailedPrecondition naming the first kCustom linear of `model` without projectors.
  absl::Status ValidateReady(const model::LlamaModel& model) const;

  // Sets the receiver of compressed gradients. During each backward of a graph built with
  // kCustom linears it is called exactly ONCE PER such linear, from the autograd backward, in
  // reverse layer order (all linears of layer l before any of layer l - 1; inside a layer the
  // autograd engine's order, typically down, up/gate, o, v/k/q). A forward taken under
  // at::NoGradGuard records nothing. Use loss.backward() (torch::autograd::grad restricted to
  // other inputs may skip linears). Set it before the forward: a forward recorded with no sink
  // set computes neither XQ nor S (dX still flows).
  void SetSink(CompressedGradSink sink);
  // Called in the backward just before linear i's S is formed (then the sink, with S): lets
  // a CUDA worker bracket the compression with events. Empty (the default): nothing.
  void SetCompressBeginHook(std::function<void(int64_t linear_index)> hook);

  // model::LinearImpl: x2d (N, n) fp32, w (m, n) as stored (fp32/bf16/fp16) -> y (N, m) fp32,
  // recorded with the LSP backward node (which keeps W as stored, no upcast copy).
  at::Tensor Forward(const at::Tensor& x2d, const at::Tensor& w, int64_t linear_index) override;
  // Moves every installed projector. kInvalidArgument naming the device; nothing moved then.
  absl::Status To(const at::Device& device) override;

  // Shared between this object and the backward nodes it recorded.
  struct SinkHolder {
    CompressedGradSink sink;
    std::function<void(int64_t linear_index)> on_compress_begin;  // may be empty
  };

 private:
  struct Slot {
    std::string name;
    int64_t m = 0, n = 0;
    std::optional<std::pair<SparseProjector, SparseProjector>> pq;
    // Dense compression: P densified (SparseProjector::FromDense), made at the first forward
    // that needs it; dropped by SetProjectors / To.
    std::optional<SparseProjector> p_dense;
  };
  // Dense compression: the dense Q's of a group of linears sharing an input, side by side,
  // (n, sum of d_q), keyed by the group's first member; offsets[k] the first column of
  // members[k]. Dropped by SetProjectors / To.
  struct DenseGroup {
    std::vector<int64_t> members;
    std::vector<int64_t> offsets;
    at::Tensor q_cat;
  };
  // X Q^T for linear i and the later linears of its layer that read the same input: (d_q, N)
  // fp32 per member, members[0] == i.
  std::vector<at::Tensor> ProjectGroup(const at::Tensor& x2d, int64_t i,
                                       std::vector<int64_t>* members);
  // X Q of the linears after the current one that read the same input (k and v after q, up
  // after gate), computed in the same pass over X as the current one's and taken by their own
  // Forward when x2d is still the same tensor (same storage, view and version); replaced by
  // the next group's. Holds X, so X's memory cannot be reused while it waits.
  struct SharedInput {
    at::Tensor x;                        // the shared (N, n) input
    int64_t version = 0;                 // its version counter when the projections were taken
    std::map<int64_t, at::Tensor> xq_t;  // linear index -> (X Q)^T (d_q, N) fp32
  };
  std::vector<Slot> slots_;
  SharedInput shared_;
  bool dense_ = false;
  CudaKernels kernels_ = CudaKernels::kDefault;
  std::map<int64_t, DenseGroup> dense_groups_;
  std::shared_ptr<SinkHolder> sink_ = std::make_shared<SinkHolder>();
};

}  // namespace lspo::lsp

#endif  // LSPO_LSP_LSP_LINEAR_H_
