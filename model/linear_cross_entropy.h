// The language-model loss without the full logits: cross-entropy of a frozen linear head,
// computed a block of rows at a time (issue 42, "a loss that never materialises the full fp32
// logits").
//
// For hidden rows h (R, H), a head W (V, H) and targets t (R), the summed negative
// log-likelihood is
//   L = Σ_{i : t_i != ignore} ( logsumexp_v (h_i · W_v) - h_i · W_{t_i} ),
// and its gradients (G_i = softmax(h_i Wᵀ) - onehot(t_i), 0 for an ignored row) are
//   dL/dh_i = G_i W,     dL/dW = Σ_i G_iᵀ h_i.
// W is frozen in every training mode of this project; dL/dW (V x H, kept for the backward) is
// formed only when W requires grad (tests that train a tied embedding).
// The logits of one block of rows exist at a time (block_rows x V fp32, the block sized by a
// byte budget), and the gradient of each block is formed right after its loss, in the
// forward, while its logits are at hand (the same idea as Liger-Kernel's fused linear
// cross-entropy; this code is the project's own). The backward then only scales the stored
// dL/dh by the incoming gradient. Cost: the same two R x H x V GEMMs as the unfused loss (the
// logits, then the gradient of h), no recomputation; memory kept for the backward: dL/dh,
// R x H in h's dtype, instead of the R x V log-probabilities.
//
// Thread-safety: pure functions of their arguments.
#ifndef LSPO_MODEL_LINEAR_CROSS_ENTROPY_H_
#define LSPO_MODEL_LINEAR_CROSS_ENTROPY_H_

#include <cstdint>

#include <ATen/ATen.h>

#include "model/loss_blocks.h"

namespace lspo::model {

// Summed cross-entropy of the head `w` over hidden rows `h` (see the file comment).
//   h (R, H) fp32 or bf16/fp16, any device, R >= 0; may require grad.
//   w (V, H) on h's device, any floating dtype; may require grad. The GEMMs run in w's dtype (h's
//   block is cast to it, as autocast would), the softmax in
//     fp32.
//   target (R) int64 on h's device, each value `ignore_index` or in [0, V).
// Returns a scalar fp32 tensor, Σ over non-ignored rows of -log softmax(h_i Wᵀ)[t_i] (0 when
// every row is ignored), attached to the graph when h or w requires grad and grad mode is on.
// `budget_bytes` bounds one block's logits (tests use small values to force several blocks).
// Throws c10::Error (as ATen ops do) on shapes that disagree or a target outside [0, V); the
// caller (LlamaModel::CausalLmLoss) validates batches before.
at::Tensor LinearCrossEntropySum(const at::Tensor& h, const at::Tensor& w, const at::Tensor& target,
                                 int64_t ignore_index = -100,
                                 int64_t budget_bytes = kLossBlockBytes);

}  // namespace lspo::model

#endif  // LSPO_MODEL_LINEAR_CROSS_ENTROPY_H_
