// The seam through which a training method decides how a linear layer of the model computes
// its forward and its backward, so that model/ knows nothing of any method (LSP's compressed
// gradients live in lsp/lsp_linear.h; a LoRA or GaLore path would be another LinearImpl).
//
// Legend: N tokens, m out-features, n in-features of W (m, n) (HF layout: y = x W^T).
#ifndef LSPO_MODEL_LINEAR_IMPL_H_
#define LSPO_MODEL_LINEAR_IMPL_H_

#include <cstdint>

#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"

namespace lspo::model {

// How a linear layer y = x W^T computes when it is in LinearMode::kCustom
// (LlamaModel::SetLinearImpl). Implementations record their own autograd node, so they decide
// what the backward produces (dX, and whatever they do with the weight gradient).
//
// Thread-safety: called from the thread that runs the model's forward (Forward) and from the
// autograd thread (whatever Forward's node does in backward); one model at a time.
class LinearImpl {
 public:
  virtual ~LinearImpl() = default;

  // y = x2d W^T for linear `linear_index`, recorded for backward. Called with grad mode
  // enabled; under at::NoGradGuard only when AppliesWithoutGrad() (otherwise the model
  // computes x2d W^T itself).
  //   x2d (N, n) in the compute dtype (fp32), w (m, n) the weight AS STORED (fp32, or bf16 /
  //   fp16 when the model stores 16-bit weights) -> y (N, m) in x2d's dtype. An
  //   implementation computes in x2d's dtype and must not keep an upcast copy of w for its
  //   backward (4 bytes per parameter of activation memory): keep w itself and upcast it
  //   again when the backward needs it (UpcastLinear does both for plain x W^T).
  // Must not throw for well-formed inputs (shapes are the model's own); c10::Error from
  // LibTorch (e.g. out of memory) propagates to the caller of the forward, as any op's would.
  virtual at::Tensor Forward(const at::Tensor& x2d, const at::Tensor& w, int64_t linear_index) = 0;

  // True when the implementation changes what the linear computes (e.g. LoRA's W + B A), so
  // that evaluation and generation under at::NoGradGuard must go through Forward too; false
  // when it only changes the backward (LSP), so no-grad passes use the plain x W^T.
  virtual bool AppliesWithoutGrad() const { return false; }

  // Moves the implementation's own tensors to `device` (LlamaModel::To calls it before it
  // commits its own move). On error nothing may have moved. Errors: kInvalidArgument naming
  // the device.
  virtual absl::Status To(const at::Device& device) = 0;
};

// y = x2d W^T in x2d's dtype, differentiable in x2d and (when it requires grad) in w, without
// an upcast copy of w living until the backward: w (m, n) as stored (any floating dtype) is
// cast to x2d's dtype for the forward's product and again for the backward's, and the
// autograd node keeps w itself (free: the model holds it anyway). Same values as
// at::mm(x2d, w.to(x2d.scalar_type()).t()) under autograd: dX = dY w, dW = (dY^T x2d) cast to
// w's dtype. x2d (N, n), w (m, n) -> (N, m). When the dtypes agree it is that mm itself. The
// backward throws c10::Error (as autograd does) if w was modified in place after the forward.
at::Tensor UpcastLinear(const at::Tensor& x2d, const at::Tensor& w);

}  // namespace lspo::model

#endif  // LSPO_MODEL_LINEAR_IMPL_H_
