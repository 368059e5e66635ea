// UpcastLinear. See linear_impl.h for the contract.
#include "model/linear_impl.h"

#include <utility>

namespace lspo::model {
namespace {

using torch::autograd::variable_list;

// Backward of y = x W^T with W stored in another dtype than x. Input dY (N, m); outputs dX
// (N, n) and dW (m, n) in W's dtype, each only when needed.
struct UpcastLinearBackward : public torch::autograd::Node {
  variable_list apply(variable_list&& grads) override {
    const at::Tensor& dy = grads[0];  // (N, m)
    at::Tensor dx, dw;
    if (dy.defined()) {
      if (task_should_compute_output(0)) {
        const at::Tensor w = weight.unpack();  // (m, n) as stored; throws if modified since
        dx = at::mm(dy, w.to(dy.scalar_type()));
      }
      if (task_should_compute_output(1)) {
        const at::Tensor x = input.unpack();          // (N, n)
        dw = at::mm(x.t(), dy).t().to(weight_dtype);  // autograd's mm order: (x^T dY)^T
      }
    }
    return {dx, dw};
  }
  void release_variables() override {
    weight.reset_data();
    input.reset_data();
  }
  std::string name() const override { return "UpcastLinearBackward"; }

  torch::autograd::SavedVariable weight;  // W (m, n) as stored
  torch::autograd::SavedVariable input;   // x (N, n), only when W needs a gradient
  at::ScalarType weight_dtype = at::kFloat;
};

}  // namespace

at::Tensor UpcastLinear(const at::Tensor& x2d, const at::Tensor& w) {
  if (w.scalar_type() == x2d.scalar_type()) return at::mm(x2d, w.t());
  at::Tensor y;  // (N, m)
  {
    at::NoGradGuard no_grad;
    y = at::mm(x2d, w.to(x2d.scalar_type()).t());
  }
  const bool grad_w = w.requires_grad();
  if (!at::GradMode::is_enabled() || !(grad_w || x2d.requires_grad())) return y;
  auto node = std::shared_ptr<UpcastLinearBackward>(new UpcastLinearBackward(),
                                                    torch::autograd::deleteNode);
  node->weight = torch::autograd::SavedVariable(w, /*is_output=*/false);
  if (grad_w) node->input = torch::autograd::SavedVariable(x2d, /*is_output=*/false);
  node->weight_dtype = w.scalar_type();
  node->set_next_edges(torch::autograd::collect_next_edges(x2d, w));
  torch::autograd::create_gradient_edge(y, std::move(node));
  return y;
}

}  // namespace lspo::model
