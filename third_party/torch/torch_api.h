// The parts of the LibTorch C++ API this project uses, in place of <torch/torch.h>.
//
// <torch/torch.h> also pulls in the whole C++ frontend (torch::nn modules, torch::optim,
// torch::data, serialization, JIT): parsing it costs ~16.6 s of every translation unit that
// includes it, against ~6.9 s for this set (g++ 12 -O3 on the 2-core CI machine,
// docs/testing.md "Compile time"). The few files that need more include it themselves:
// <torch/optim/adamw.h>, <torch/serialize.h>, <torch/nn/utils/clip_grad.h>.
//
// What it provides: at::Tensor and the ATen operators (<ATen/ATen.h> through torch/types.h),
// the torch:: factory functions and dtype constants (torch::randn, torch::tensor,
// torch::from_blob, torch::kFloat), torch::NoGradGuard / torch::AutoGradMode /
// torch::manual_seed (torch/utils.h), custom autograd functions and graph nodes
// (torch::autograd::Function, Node, grad, backward), and torch::cuda::is_available.
#ifndef LSPO_THIRD_PARTY_TORCH_TORCH_API_H_
#define LSPO_THIRD_PARTY_TORCH_TORCH_API_H_

#include <torch/autograd.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <torch/utils.h>

#endif  // LSPO_THIRD_PARTY_TORCH_TORCH_API_H_
