// Test support for the optimizer service's core (tests/cpu_optimizer_service/): a tiny job
// spec and a fake worker that plays the worker's part of the data plane by hand. It creates
// the job's shared-memory arena with the layout the worker's update path would build
// (offload/arena_layout.h), and the test writes gradients, projectors and |G|^2 into its slots
// and publishes the completion flags and the verdict (runtime/completion_flags.h), as the worker
// would, then reads the optimizer's updates back. Header-only; needs LibTorch.
#ifndef LSPO_TESTS_CPU_OPTIMIZER_SERVICE_FAKE_WORKER_H_
#define LSPO_TESTS_CPU_OPTIMIZER_SERVICE_FAKE_WORKER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "lsp/projector.h"
#include "model/llama.h"
#include "offload/arena_layout.h"
#include "offload/arena_tensors.h"
#include "offload/job_assets.h"
#include "offload/training_mode.h"
#include "proto/arena.pb.h"
#include "proto/job_spec.pb.h"
#include "runtime/completion_flags.h"
#include "runtime/shm_arena.h"
#include "runtime/status_macros.h"
#include "tests/tiny_llama.h"

namespace lspo::optimizer_testing {

// A job of `mode` (MODE_LSP, MODE_ZERO or MODE_GALORE, which means GaLore-Offload here) over the
// tiny random Llama of tests/tiny_llama.h (7 trained matrices (16, 16), (8, 16), (8, 16),
// (16, 16), (24, 16), (24, 16) and (16, 24) fp32). lsp: d = 4, r = 2; GaLore-Offload: rank 2,
// scale 0.5. Adam: beta1 0.9, beta2 0.999, eps 1e-8, weight decay 0.1, no clipping; 1 thread.
inline lspo::v1::JobSpec TinySpec(lspo::v1::TrainingMode mode) {
  lspo::v1::JobSpec spec;
  spec.set_mode(mode);
  spec.set_num_threads(1);
  spec.set_seed(11);
  testing_models::SetTinyLlama(&spec);
  spec.mutable_lsp()->set_d(4);
  spec.mutable_lsp()->set_r(2);
  if (mode == lspo::v1::MODE_GALORE) {
    spec.mutable_galore()->set_rank(2);
    spec.mutable_galore()->set_scale(0.5);
    spec.mutable_galore()->set_offload(true);
  }
  auto* o = spec.mutable_optim();
  o->set_beta1(0.9);
  o->set_beta2(0.999);
  o->set_eps(1e-8);
  o->set_weight_decay(0.1);
  return spec;
}

// The worker's side of one job's arena (see the file comment). Owns the arena (unlinked when
// destroyed). Not thread-safe, but the flags are (the test may publish from any thread).
class FakeWorker {
 public:
  // Loads the model of `*spec` (the same W0 the optimizer loads) and creates the arena of its
  // mode, named after `tag`, by the mode's layout builder (offload::ModeOf(*spec).layout, the
  // one the worker calls); `spec->mode` becomes the layout's mode (a spec of mode galore with
  // galore.offload: MODE_GALORE_OFFLOAD), which the optimizer checks against the spec.
  // Errors: kInvalidArgument for a mode without an arena; those of the model loader and the
  // layout builder.
  static absl::StatusOr<std::unique_ptr<FakeWorker>> Create(lspo::v1::JobSpec* spec,
                                                            const std::string& tag) {
    auto w = std::unique_ptr<FakeWorker>(new FakeWorker());
    ASSIGN_OR_RETURN(model::LlamaModel model, offload::LoadJobModel(*spec));
    for (int64_t i = 0; i < model.num_linears(); ++i) {
      const at::Tensor& t = model.LinearWeight(i);
      w->linears_.push_back({static_cast<int32_t>(i), model.LinearName(i), t.size(0), t.size(1)});
      w->w0_.push_back(t.detach().to(at::kFloat).clone());
    }
    const std::string name = runtime::ShmArena::UniqueName(tag);
    // The mode's own builder (offload/training_mode.h), as the worker's update path calls it.
    const offload::ModeDescriptor& mode = offload::ModeOf(*spec);
    if (mode.layout == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("mode ", mode.name, " has no arena"));
    }
    ASSIGN_OR_RETURN(w->layout_, mode.layout(w->linears_, model::kLinearsPerLayer, *spec, name));
    spec->set_mode(w->layout_.mode());
    ASSIGN_OR_RETURN(w->arena_, runtime::ShmArena::Create(name, w->layout_.bytes()));
    ASSIGN_OR_RETURN(w->flags_, offload::ArenaFlags(w->arena_, w->layout_));
    return w;
  }

  const lspo::v1::ArenaLayout& layout() const { return layout_; }
  const lspo::v1::LinearSlot& slot(int i) const { return layout_.linears(i); }
  runtime::CompletionFlags& flags() { return flags_; }
  int num_linears() const { return static_cast<int>(linears_.size()); }

  // Matrix i's weight as loaded, (m, n) fp32 (a copy).
  const at::Tensor& W0(int i) const { return w0_[i]; }

  // A view of an fp32 / bf16 slot of the arena (aborts on a bad slot: a broken test set-up).
  at::Tensor F32(const lspo::v1::TensorRef& ref) const {
    return offload::ArenaF32(arena_, ref).value();
  }
  at::Tensor Bf16(const lspo::v1::TensorRef& ref) const {
    return offload::ArenaBf16(arena_, ref).value();
  }

  // Writes matrix i's projectors into its slots (what the worker's fit or GaLore refresh
  // does). Errors: kInvalidArgument (a shape that does not fit the slot).
  absl::Status WriteProjectors(int i, const lsp::SparseProjector& p,
                               const lsp::SparseProjector& q) {
    RETURN_IF_ERROR(offload::WriteProjector(arena_, slot(i).p_index(), slot(i).p_value(), p));
    return offload::WriteProjector(arena_, slot(i).q_index(), slot(i).q_value(), q);
  }

  // Writes `g` into matrix i's gradient slot in its dtype (lsp, GaLore-Offload: S into grad,
  // fp32; zero: G into full_grad, bf16) and publishes it for `step`.
  void PublishGradient(int i, const at::Tensor& g, uint32_t step) {
    const bool zero = layout_.mode() == lspo::v1::MODE_ZERO;
    at::Tensor dst = zero ? Bf16(slot(i).full_grad()) : F32(slot(i).grad());
    dst.copy_(g.reshape(dst.sizes()));
    flags_.PublishGrad(i, step);
  }

 private:
  FakeWorker() = default;

  std::vector<offload::LinearShape> linears_;
  std::vector<at::Tensor> w0_;
  lspo::v1::ArenaLayout layout_;
  runtime::ShmArena arena_;
  runtime::CompletionFlags flags_;
};

}  // namespace lspo::optimizer_testing

#endif  // LSPO_TESTS_CPU_OPTIMIZER_SERVICE_FAKE_WORKER_H_
