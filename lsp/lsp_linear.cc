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
      at::Tensor w = weight.unpack();  // (m, n); throws if W was modified after the forward
      if (task_should_compute_output(0)) dx = at::mm(dy, w);
      if (sink != nullptr && sink->sink) {
        at::Tensor s = CompressFactored(dy, xq, p);  // (d_p, d_q) fp32
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

  torch::autograd::SavedVariable weight;  // W (m, n) fp32
  at::Tensor xq;                           // X Q (N, d_q) fp32, a view of (X Q)^T
  SparseProjector p;                       // P (m, d_p)
  int64_t linear_index = 0;
  std::shared_ptr<LspLinears::SinkHolder> sink;
};

// y = x W^T recorded with an LspLinearBackward node. x2d (N, n), w (m, n) -> (N, m);
// xq_t: (X Q)^T (d_q, N) fp32 when a sink is set (the backward's operand), else undefined.
at::Tensor LspLinearForward(const at::Tensor& x2d, const at::Tensor& w, int64_t linear_index,
                            const SparseProjector& p, at::Tensor xq_t,
                            const std::shared_ptr<LspLinears::SinkHolder>& sink) {
  at::Tensor y;  // (N, m)
  {
    at::NoGradGuard no_grad;
    y = at::mm(x2d, w.t());
  }
  auto node = std::shared_ptr<LspLinearBackward>(new LspLinearBackward(),
                                                 torch::autograd::deleteNode);
  node->weight = torch::autograd::SavedVariable(w, /*is_output=*/false);
  node->sink = xq_t.defined() ? sink : nullptr;
  if (xq_t.defined()) node->xq = xq_t.t();  // (N, d_q) view; the GEMM reads it in place
  node->p = p;
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
    return absl::InvalidArgumentError(absl::StrCat("SetProjectors: linear index ", i,
                                                   " is not in [0, ", count, ")"));
  }
  Slot& s = slots_[static_cast<size_t>(i)];
  if (P.rows != s.m || Q.rows != s.n || P.d <= 0 || Q.d <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SetProjectors(", s.name, "): W is (", s.m, ", ", s.n, ") so P must be (", s.m,
        ", d_p) and Q (", s.n, ", d_q) with d_p, d_q > 0; got P (", P.rows, ", ", P.d,
        "), Q (", Q.rows, ", ", Q.d, ")"));
  }
  s.pq = std::make_pair(std::move(P), std::move(Q));
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
      return absl::FailedPreconditionError(absl::StrCat(
          "linear ", i, " (", model.LinearName(i),
          ") is trained by LSP but has no projectors; call SetProjectors first"));
    }
  }
  return absl::OkStatus();
}

void LspLinears::SetSink(CompressedGradSink sink) { sink_->sink = std::move(sink); }

at::Tensor LspLinears::Forward(const at::Tensor& x2d, const at::Tensor& w, int64_t i) {
  const Slot& s = slots_[static_cast<size_t>(i)];
  if (!s.pq.has_value()) {
    LOG_FIRST_N(WARNING, 8) << "LspLinears: linear " << s.name
                            << " has no projectors; treated as frozen (call SetProjectors first)";
    return at::mm(x2d, w.t());  // (N, m); dX still flows, W gets no gradient
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
      std::vector<const SparseProjector*> qs;
      for (int64_t j : LaterSharers(i)) {
        if (j >= static_cast<int64_t>(slots_.size())) break;
        const Slot& sj = slots_[static_cast<size_t>(j)];
        if (!sj.pq.has_value() || sj.n != s.n) continue;
        members.push_back(j);
        qs.push_back(&sj.pq->second);
      }
      std::vector<at::Tensor> outs = ProjectRowsTransposed(x2d, qs);
      xq_t = std::move(outs[0]);
      shared_ = SharedInput();
      if (members.size() > 1) {
        shared_.x = x2d;
        shared_.version = x2d._version();
        for (size_t k = 1; k < members.size(); ++k) shared_.xq_t[members[k]] = std::move(outs[k]);
      }
    }
  }
  return LspLinearForward(x2d, w, i, s.pq->first, std::move(xq_t), sink_);
}

absl::Status LspLinears::To(const at::Device& device) {
  try {
    std::vector<std::optional<std::pair<SparseProjector, SparseProjector>>> moved;
    moved.reserve(slots_.size());
    for (const Slot& s : slots_) {
      moved.push_back(s.pq.has_value() ? std::make_optional(std::make_pair(
                                             s.pq->first.To(device), s.pq->second.To(device)))
                                       : std::nullopt);
    }
    for (size_t k = 0; k < slots_.size(); ++k) slots_[k].pq = std::move(moved[k]);
    shared_ = SharedInput();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot move the projectors to device '",
                                                   device.str(), "': ",
                                                   e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace lspo::lsp
