// The LSP linear autograd node. Legend and formulas: lsp_linear.h.
#include "lsp/lsp_linear.h"

#include <glog/logging.h>

#include "absl/strings/str_cat.h"

namespace lspo::lsp {
namespace {

using torch::autograd::variable_list;

// Backward node of an LSP linear y = x W^T over N tokens (docs/method.md "Math").
// Input: dY (N, m). Output: dX = dY W (N, n), only when x needs a gradient.
// Side effect: S = (dY P)^T XQ = P^T G Q (d_p, d_q) fp32 handed to the sink. No weight gradient.
struct LspLinearBackward : public torch::autograd::Node {
  variable_list apply(variable_list&& grads) override {
    const at::Tensor& dy = grads[0];  // (N, m)
    at::Tensor dx;                    // (N, n)
    if (dy.defined()) {
      // W (m, n) as stored (16-bit weights are upcast here, not kept upcast since the
      // forward); throws if W was modified after the forward.
      at::Tensor w = weight.unpack();
      if (task_should_compute_output(0)) dx = at::mm(dy, w.to(dy.scalar_type()));
      if (sink != nullptr && sink->sink) {
        if (sink->on_compress_begin) sink->on_compress_begin(linear_index);
        at::Tensor s = CompressFactored(dy, xq, p, kernels);  // (d_p, d_q) fp32
        sink->sink(linear_index, s);
      }
    }
    return {dx};
  }
  void release_variables() override {
    weight.reset_data();
    xq = at::Tensor();
  }
  std::string name() const override { return "LspLinearBackward"; }

  torch::autograd::SavedVariable weight;        // W (m, n) as stored (fp32, bf16 or fp16)
  at::Tensor xq;                                // X Q (N, d_q) fp32, a view of (X Q)^T
  SparseProjector p;                            // P (m, d_p)
  CudaKernels kernels = CudaKernels::kDefault;  // the compression's on CUDA
  int64_t linear_index = 0;
  std::shared_ptr<LspLinears::SinkHolder> sink;
};

// y = x W^T recorded with an LspLinearBackward node. x2d (N, n), w (m, n) -> (N, m);
// xq_t: (X Q)^T (d_q, N) fp32 when a sink is set (the backward's operand), else undefined.
at::Tensor LspLinearForward(const at::Tensor& x2d, const at::Tensor& w, int64_t linear_index,
                            const SparseProjector& p, CudaKernels kernels, at::Tensor xq_t,
                            const std::shared_ptr<LspLinears::SinkHolder>& sink) {
  at::Tensor y;  // (N, m)
  {
    at::NoGradGuard no_grad;
    y = at::mm(x2d, w.to(x2d.scalar_type()).t());  // an upcast of 16-bit W lives only here
  }
  auto node =
      std::shared_ptr<LspLinearBackward>(new LspLinearBackward(), torch::autograd::deleteNode);
  node->weight = torch::autograd::SavedVariable(w, /*is_output=*/false);
  node->sink = xq_t.defined() ? sink : nullptr;
  if (xq_t.defined()) node->xq = xq_t.t();  // (N, d_q) view; the GEMM reads it in place
  node->p = p;
  node->kernels = kernels;
  node->linear_index = linear_index;
  node->set_next_edges(torch::autograd::collect_next_edges(x2d));
  torch::autograd::create_gradient_edge(y, std::move(node));
  return y;
}

// The linears of linear i's layer that take the same input as i, i first, then the later ones
// in the model's call order (q -> k, v; gate -> up). Others: {i}.
std::vector<int64_t> LaterSharers(int64_t i) {
  using model::LinearKind;
  const int64_t kind = i % model::kLinearsPerLayer;
  if (kind == static_cast<int64_t>(LinearKind::kQ)) return {i, i + 1, i + 2};  // q, k, v
  if (kind == static_cast<int64_t>(LinearKind::kGate)) return {i, i + 1};      // gate, up
  return {i};
}

// True when a and b are the same values: one storage, offset, sizes, strides and version.
bool SameInput(const at::Tensor& a, int64_t a_version, const at::Tensor& b) {
  return a.defined() && b.defined() && a.is_alias_of(b) &&
         a.storage_offset() == b.storage_offset() && a.sizes() == b.sizes() &&
         a.strides() == b.strides() && a.scalar_type() == b.scalar_type() &&
         b._version() == a_version;
}

}  // namespace

LspLinears::LspLinears(const model::LlamaModel& model) {
  slots_.resize(static_cast<size_t>(model.num_linears()));
  for (int64_t i = 0; i < model.num_linears(); ++i) {
    Slot& s = slots_[static_cast<size_t>(i)];
    s.name = model.LinearName(i);
    s.m = model.LinearWeight(i).size(0);
    s.n = model.LinearWeight(i).size(1);
  }
}

absl::Status LspLinears::SetProjectors(int64_t i, SparseProjector P, SparseProjector Q) {
  const int64_t count = static_cast<int64_t>(slots_.size());
  if (i < 0 || i >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetProjectors: linear index ", i, " is not in [0, ", count, ")"));
  }
  Slot& s = slots_[static_cast<size_t>(i)];
  if (P.rows != s.m || Q.rows != s.n || P.d <= 0 || Q.d <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("SetProjectors(", s.name, "): W is (", s.m, ", ",
                                                   s.n, ") so P must be (", s.m, ", d_p) and Q (",
                                                   s.n, ", d_q) with d_p, d_q > 0; got P (", P.rows,
                                                   ", ", P.d, "), Q (", Q.rows, ", ", Q.d, ")"));
  }
  s.pq = std::make_pair(std::move(P), std::move(Q));
  s.p_dense.reset();
  dense_groups_.clear();
  shared_ = SharedInput();  // projections taken with the old projectors are not reused
  return absl::OkStatus();
}

bool LspLinears::HasProjectors(int64_t i) const {
  return i >= 0 && i < static_cast<int64_t>(slots_.size()) &&
         slots_[static_cast<size_t>(i)].pq.has_value();
}

absl::Status LspLinears::ValidateReady(const model::LlamaModel& model) const {
  for (int64_t i = 0; i < model.num_linears(); ++i) {
    if (model.linear_mode(i) == model::LinearMode::kCustom && !HasProjectors(i)) {
      return absl::FailedPreconditionError(
          absl::StrCat("linear ", i, " (", model.LinearName(i),
                       ") is trained by LSP but has no projectors; call SetProjectors first"));
    }
  }
  return absl::OkStatus();
}

void LspLinears::SetSink(CompressedGradSink sink) { sink_->sink = std::move(sink); }

void LspLinears::SetCompressBeginHook(std::function<void(int64_t)> hook) {
  sink_->on_compress_begin = std::move(hook);
}

void LspLinears::SetDenseCompression(bool dense) {
  dense_ = dense;
  for (Slot& s : slots_) s.p_dense.reset();
  dense_groups_.clear();
  shared_ = SharedInput();
}

std::vector<at::Tensor> LspLinears::ProjectGroup(const at::Tensor& x2d, int64_t i,
                                                 std::vector<int64_t>* members) {
  const Slot& s = slots_[static_cast<size_t>(i)];
  members->clear();
  for (int64_t j : LaterSharers(i)) {
    if (j >= static_cast<int64_t>(slots_.size())) break;
    const Slot& sj = slots_[static_cast<size_t>(j)];
    if (!sj.pq.has_value() || sj.n != s.n) continue;
    // Dense: an identity Q stays sparse (X itself), alone.
    if (dense_ && sj.pq->second.identity != s.pq->second.identity) continue;
    members->push_back(j);
  }
  if (!dense_ || s.pq->second.identity) {
    std::vector<const SparseProjector*> qs;
    for (int64_t j : *members) qs.push_back(&slots_[static_cast<size_t>(j)].pq->second);
    return ProjectRowsTransposed(x2d, qs, kernels_);
  }
  DenseGroup& g = dense_groups_[i];
  if (g.members != *members || !g.q_cat.defined()) {
    std::vector<at::Tensor> dense;
    g.members = *members;
    g.offsets.clear();
    int64_t width = 0;
    for (int64_t j : *members) {
      g.offsets.push_back(width);
      dense.push_back(slots_[static_cast<size_t>(j)].pq->second.Dense());  // (n, d_q) fp32
      width += dense.back().size(1);
    }
    g.q_cat = at::cat(dense, 1).contiguous();  // (n, sum d_q)
  }
  // (sum d_q, N) = Q_cat^T X^T, one GEMM; each member's rows are a contiguous block.
  const at::Tensor all = at::mm(g.q_cat.t(), x2d.to(at::kFloat).t()).contiguous();
  std::vector<at::Tensor> outs;
  for (size_t k = 0; k < members->size(); ++k) {
    const int64_t d_q = slots_[static_cast<size_t>((*members)[k])].pq->second.d;
    outs.push_back(all.narrow(0, g.offsets[k], d_q));
  }
  return outs;
}

at::Tensor LspLinears::Forward(const at::Tensor& x2d, const at::Tensor& w, int64_t i) {
  const Slot& s = slots_[static_cast<size_t>(i)];
  if (!s.pq.has_value()) {
    LOG_FIRST_N(WARNING, 8) << "LspLinears: linear " << s.name
                            << " has no projectors; treated as frozen (call SetProjectors first)";
    return model::UpcastLinear(x2d, w);  // (N, m); dX still flows, W gets no gradient
  }
  at::Tensor xq_t;  // (d_q, N)
  if (sink_->sink) {
    at::NoGradGuard no_grad;
    auto hit = shared_.xq_t.find(i);
    if (hit != shared_.xq_t.end() && SameInput(shared_.x, shared_.version, x2d)) {
      xq_t = std::move(hit->second);
      shared_.xq_t.erase(hit);
    } else {
      // One pass over X for i and the later linears of its layer that read the same X.
      std::vector<int64_t> members;
      std::vector<at::Tensor> outs = ProjectGroup(x2d, i, &members);
      xq_t = std::move(outs[0]);
      shared_ = SharedInput();
      if (members.size() > 1) {
        shared_.x = x2d;
        shared_.version = x2d._version();
        for (size_t k = 1; k < members.size(); ++k) shared_.xq_t[members[k]] = std::move(outs[k]);
      }
    }
  }
  Slot& slot = slots_[static_cast<size_t>(i)];
  if (dense_ && !slot.pq->first.identity && !slot.p_dense.has_value()) {
    absl::StatusOr<SparseProjector> pd = SparseProjector::FromDense(slot.pq->first.Dense());
    CHECK(pd.ok()) << slot.name << ": " << pd.status();  // P was validated when installed
    slot.p_dense = *std::move(pd);
  }
  const SparseProjector& p = slot.p_dense.has_value() ? *slot.p_dense : slot.pq->first;
  return LspLinearForward(x2d, w, i, p, kernels_, std::move(xq_t), sink_);
}

absl::Status LspLinears::To(const at::Device& device) {
  try {
    std::vector<std::optional<std::pair<SparseProjector, SparseProjector>>> moved;
    moved.reserve(slots_.size());
    for (const Slot& s : slots_) {
      moved.push_back(s.pq.has_value() ? std::make_optional(std::make_pair(s.pq->first.To(device),
                                                                           s.pq->second.To(device)))
                                       : std::nullopt);
    }
    for (size_t k = 0; k < slots_.size(); ++k) {
      slots_[k].pq = std::move(moved[k]);
      slots_[k].p_dense.reset();
    }
    dense_groups_.clear();
    shared_ = SharedInput();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot move the projectors to device '", device.str(), "': ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace lspo::lsp
