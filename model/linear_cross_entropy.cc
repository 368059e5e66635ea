// Blocked cross-entropy of a frozen linear head (see linear_cross_entropy.h).
#include "model/linear_cross_entropy.h"

#include <algorithm>

#include <torch/csrc/autograd/custom_function.h>

namespace lspo::model {
namespace {

// The loss (and, when `grad_h` / `grad_w` are given, dL/dh and dL/dw into them) of every
// block of rows. h (R, H), w (V, H), target (R): as LinearCrossEntropySum. Returns the fp32
// scalar sum.
at::Tensor BlockedLoss(const at::Tensor& h, const at::Tensor& w, const at::Tensor& target,
                       int64_t ignore_index, int64_t budget_bytes, at::Tensor* grad_h,
                       at::Tensor* grad_w) {
  TORCH_CHECK(h.dim() == 2 && w.dim() == 2 && h.size(1) == w.size(1),
              "LinearCrossEntropySum: h (R, H) and w (V, H) must agree on H, got h ", h.sizes(),
              " and w ", w.sizes());
  TORCH_CHECK(target.dim() == 1 && target.size(0) == h.size(0),
              "LinearCrossEntropySum: target must be (R) = (", h.size(0), "), got ",
              target.sizes());
  const int64_t R = h.size(0), V = w.size(0);
  const at::ScalarType gemm = w.scalar_type();
  at::Tensor loss = at::zeros({}, h.options().dtype(at::kFloat));
  if (grad_h != nullptr) *grad_h = at::empty_like(h, at::MemoryFormat::Contiguous);
  if (grad_w != nullptr) *grad_w = at::zeros_like(w, at::MemoryFormat::Contiguous);
  const int64_t block = LossBlockRows(V, budget_bytes);
  const at::Tensor wt = w.t();  // (H, V) view
  for (int64_t s = 0; s < R; s += block) {
    const int64_t n = std::min(block, R - s);
    const at::Tensor tb = target.narrow(0, s, n);                                   // (n) int64
    const at::Tensor valid = tb.ne(ignore_index);                                   // (n) bool
    const at::Tensor safe = at::where(valid, tb, at::zeros_like(tb)).unsqueeze(1);  // (n, 1)
    at::Tensor logits = at::matmul(h.narrow(0, s, n).to(gemm), wt);                 // (n, V)
    if (gemm != at::kFloat) logits = logits.to(at::kFloat);
    const at::Tensor lse = at::logsumexp(logits, {1});               // (n) fp32
    const at::Tensor nll = lse - logits.gather(1, safe).squeeze(1);  // (n) fp32
    loss.add_(nll.masked_fill(valid.logical_not(), 0.0).sum());
    if (grad_h == nullptr && grad_w == nullptr) continue;
    // softmax - onehot(t), zero on ignored rows, in place in the logits block.
    logits.sub_(lse.unsqueeze(1)).exp_();
    logits.scatter_add_(1, safe, at::full({n, 1}, -1.0, logits.options()));
    logits.mul_(valid.unsqueeze(1).to(at::kFloat));
    const at::Tensor g = logits.to(gemm);                                    // (n, V) dL/dlogits
    if (grad_h != nullptr) grad_h->narrow(0, s, n).copy_(at::matmul(g, w));  // (n, H)
    if (grad_w != nullptr) grad_w->add_(at::matmul(g.t(), h.narrow(0, s, n).to(gemm)));
  }
  return loss;
}

// Autograd node: the forward forms dL/dh (and dL/dw for a trainable head) with the loss; the
// backward scales them.
struct LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h,
                            const at::Tensor& w, const at::Tensor& target, int64_t ignore_index,
                            int64_t budget_bytes) {
    at::Tensor grad_h, grad_w;
    at::Tensor loss =
        BlockedLoss(h, w, target, ignore_index, budget_bytes, h.requires_grad() ? &grad_h : nullptr,
                    w.requires_grad() ? &grad_w : nullptr);
    ctx->saved_data["grad_h"] = grad_h;
    ctx->saved_data["grad_w"] = grad_w;
    return loss;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    // grads[0]: () fp32, dLoss_total / dL. Each gradient in its input's dtype; undefined for
    // an input that needs none.
    auto scaled = [&](const char* key) {
      at::Tensor g = ctx->saved_data[key].toTensor();
      ctx->saved_data.erase(key);
      return g.defined() ? g.mul(grads[0].to(g.scalar_type())) : at::Tensor();
    };
    at::Tensor gh = scaled("grad_h");
    at::Tensor gw = scaled("grad_w");
    return {gh, gw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor LinearCrossEntropySum(const at::Tensor& h, const at::Tensor& w, const at::Tensor& target,
                                 int64_t ignore_index, int64_t budget_bytes) {
  if ((h.requires_grad() || w.requires_grad()) && at::GradMode::is_enabled()) {
    return LinearCrossEntropyFunction::apply(h, w, target, ignore_index, budget_bytes);
  }
  return BlockedLoss(h, w, target, ignore_index, budget_bytes, nullptr, nullptr);
}

}  // namespace lspo::model
