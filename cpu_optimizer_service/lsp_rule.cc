// Shapes as in cpu_optimizer_service/lsp_rule.h.
#include "cpu_optimizer_service/lsp_rule.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cpu_optimizer_service/optimizer_job.h"
#include "lsp/fit.h"
#include "offload/arena_layout.h"
#include "offload/arena_tensors.h"
#include "offload/state_file.h"
#include "offload/torch_call.h"
#include "runtime/status_macros.h"

namespace lspo::optimizer {

absl::StatusOr<int64_t> LspRule::AddMatrix(const lspo::v1::LinearSlot& slot, at::Tensor w0) {
  if (slot.d_p() < 1 || slot.d_q() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena slot ", slot.name(), " has subspace (", slot.d_p(), ", ", slot.d_q(),
                     "); expected both >= 1 (a worker of another version?)"));
  }
  Matrix st;
  // base (m, n) fp32, the loaded weight itself.
  st.base = std::move(w0);
  st.sum_d = at::zeros({slot.d_p(), slot.d_q()}, at::kFloat);  // (d_p, d_q) fp32
  st.adam = std::make_unique<lsp::SubspaceAdam>(slot.d_p(), slot.d_q());
  const int64_t dd = static_cast<int64_t>(slot.d_p()) * slot.d_q();
  subspace_elements_ += dd;
  const int64_t bytes = 4 * (st.base.numel() + 3 * dd);  // fp32 base; sum_d, m, v (d_p d_q)
  matrices_.push_back(std::move(st));
  return bytes;
}

std::string LspRule::Describe(const lspo::v1::ArenaLayout& layout) const {
  return absl::StrCat("subspace Adam over ", subspace_elements_, " elements (lsp.d = ", layout.d(),
                      ")");
}

absl::Status LspRule::SetProjectors(OptimizerJob* job, const std::vector<int>& indices) {
  return offload::TorchCall("set projectors", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    for (int i : indices) {
      if (i < 0 || i >= static_cast<int>(matrices_.size())) {
        return absl::InvalidArgumentError(absl::StrCat("SetProjectors: bad index ", i));
      }
      const auto& slot = job->layout.linears(i);
      ASSIGN_OR_RETURN(lsp::SparseProjector p, offload::ReadProjector(job->arena, slot.p_index(),
                                                                      slot.p_value(), slot.d_p()));
      ASSIGN_OR_RETURN(lsp::SparseProjector q, offload::ReadProjector(job->arena, slot.q_index(),
                                                                      slot.q_value(), slot.d_q()));
      Matrix& st = matrices_[i];
      if (st.p.rows > 0) {
        // Fold the old subspace into the master weights, then move the moments into the new
        // subspace (paper Alg. 1). TransferAdamState returns new tensors: they are copied back
        // into the optimizer's own moment buffers (the shape (d_p, d_q) of a matrix never
        // changes between refits).
        if (st.base_scale != 1.0) st.base.mul_(st.base_scale);
        st.base_scale = 1.0;
        st.base.add_(lsp::ExpandStep(st.p, st.sum_d, st.q));
        st.sum_d.zero_();
        const std::vector<int64_t> shape = {slot.d_p(), slot.d_q()};
        // (d_p, d_q) fp32 view
        at::Tensor m_buf = at::from_blob(st.adam->m().data(), shape, at::kFloat);
        // (d_p, d_q) fp32 view
        at::Tensor v_buf = at::from_blob(st.adam->v().data(), shape, at::kFloat);
        at::Tensor m = m_buf, v = v_buf;  // (d_p, d_q) fp32; replaced by new tensors
        lsp::TransferAdamState(st.p, st.q, p, q, m, v);
        m_buf.copy_(m);
        v_buf.copy_(v.clamp_min(0));  // rounding never makes a second moment negative
      }
      st.p = std::move(p);
      st.q = std::move(q);
    }
    return absl::OkStatus();
  });
}

absl::Status LspRule::CheckReady(const OptimizerJob& job, int i) const {
  if (matrices_[i].p.rows == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("Update before SetProjectors for ", job.layout.linears(i).name()));
  }
  return absl::OkStatus();
}

absl::StatusOr<MatrixGradient> LspRule::Gradient(const OptimizerJob& job, int i) const {
  const auto& slot = job.layout.linears(i);
  MatrixGradient g;
  g.n = static_cast<int64_t>(slot.d_p()) * slot.d_q();  // S (d_p, d_q)
  ASSIGN_OR_RETURN(g.fp32, job.arena.At<float>(slot.grad().offset(), g.n));
  return g;
}

absl::Status LspRule::UpdateMatrix(OptimizerJob* job, int i, const MatrixGradient& g,
                                   const StepInputs& in) {
  const auto& slot = job->layout.linears(i);
  Matrix& st = matrices_[i];
  const int64_t n = g.n;
  undo_.push_back({i, st.adam->step(), st.adam->m(), st.adam->v(), st.base, st.base_scale,
                   st.sum_d.clone(), st.p, st.q});
  ASSIGN_OR_RETURN(const lsp::AdamHyper h, BeforeStep(job, i, in));
  ASSIGN_OR_RETURN(float* d, job->arena.At<float>(slot.step().offset(), n));
  const float* s_in = g.fp32;  // S (d_p, d_q); clipped into a copy (small)
  if (in.clip != 1.0f) {
    scaled_.assign(s_in, s_in + n);
    for (float& x : scaled_) x *= in.clip;
    s_in = scaled_.data();
  }
  RETURN_IF_ERROR(st.adam->Step(h, s_in, d));
  // Decoupled weight decay W <- (1 - lr wd) W, on the master's two parts: base through its
  // scale (a rewrite of base cost O(m n) per step, and, with the undo record holding the old
  // base, a second copy of every master until the step ended).
  const double decay = 1.0 - in.lr * job->spec.optim().weight_decay();
  if (decay != 1.0) {
    st.base_scale *= decay;
    st.sum_d.mul_(decay);
  }
  float* sum = st.sum_d.data_ptr<float>();
  for (int64_t k = 0; k < n; ++k) sum[k] += d[k];
  return absl::OkStatus();
}

void LspRule::RollBack() {
  for (Undo& u : undo_) {
    Matrix& st = matrices_[u.index];
    (void)st.adam->Restore(u.step, std::move(u.m), std::move(u.v));
    st.base = u.base;
    st.base_scale = u.base_scale;
    st.sum_d = u.sum_d;
    st.p = std::move(u.p);
    st.q = std::move(u.q);
  }
  undo_.clear();
}

void LspRule::EndStep() {
  undo_.clear();
  scaled_.clear();
  scaled_.shrink_to_fit();
}

void LspRule::WriteMasterWeight(int i, at::Tensor out) const {
  const Matrix& st = matrices_[i];
  out.copy_(st.base);
  if (st.base_scale != 1.0) out.mul_(st.base_scale);
  if (st.p.rows > 0) out.add_(lsp::ExpandStep(st.p, st.sum_d, st.q));
}

void LspRule::AppendState(const lspo::v1::ArenaLayout& layout, offload::NamedTensors* tensors) {
  for (int i = 0; i < layout.linears_size(); ++i) {
    const std::string& name = layout.linears(i).name();
    Matrix& st = matrices_[i];
    const std::vector<int64_t> shape = {st.adam->rows(), st.adam->cols()};  // (d_p, d_q)
    tensors->emplace_back(name + ".master", st.base);
    tensors->emplace_back(name + ".master_scale", at::scalar_tensor(st.base_scale, at::kDouble));
    tensors->emplace_back(name + ".sum_d", st.sum_d);
    tensors->emplace_back(name + ".adam_m", at::from_blob(st.adam->m().data(), shape, at::kFloat));
    tensors->emplace_back(name + ".adam_v", at::from_blob(st.adam->v().data(), shape, at::kFloat));
    tensors->emplace_back(name + ".adam_step", at::scalar_tensor(st.adam->step(), at::kLong));
    if (st.p.rows > 0) {
      offload::AppendProjector(name + ".p", st.p, tensors);
      offload::AppendProjector(name + ".q", st.q, tensors);
    }
  }
}

absl::StatusOr<UpdateRule::Commit> LspRule::ReadState(const lspo::v1::ArenaLayout& layout,
                                                      const model::SafetensorsFile& file,
                                                      const std::string& what) {
  // Views into the mapped file: everything is validated before anything is copied.
  struct Loaded {
    SavedAdamState adam;  // master (m, n), m and v (d_p, d_q) fp32 views
    at::Tensor sum_d;     // (d_p, d_q) fp32 view
    double master_scale = 1.0;
    lsp::SparseProjector p, q;
  };
  auto loaded = std::make_shared<std::vector<Loaded>>(matrices_.size());
  for (int i = 0; i < layout.linears_size(); ++i) {
    const auto& slot = layout.linears(i);
    const lsp::MatrixSubspace sub = offload::SlotSubspace(slot);  // S is (sub.p.dim, sub.q.dim)
    const std::string& name = slot.name();
    Loaded& l = (*loaded)[i];
    ASSIGN_OR_RETURN(l.adam, ReadSavedAdamState(file, what, slot, {sub.p.dim, sub.q.dim}));
    ASSIGN_OR_RETURN(l.sum_d, offload::ViewStateTensor(file, what, name + ".sum_d", at::kFloat,
                                                       {sub.p.dim, sub.q.dim}));
    // Written since the decay became a scale; an older checkpoint's master is all of it.
    if (file.Find(name + ".master_scale") != nullptr) {
      // () fp64
      ASSIGN_OR_RETURN(at::Tensor scale, offload::ReadStateTensor(
                                             file, what, name + ".master_scale", at::kDouble, {}));
      l.master_scale = scale.item<double>();
      // >= 0: the spec keeps lr wd < 1, but a long decay may underflow to 0.
      if (!std::isfinite(l.master_scale) || l.master_scale < 0) {
        return absl::DataLossError(absl::StrCat(what, ": ", name, ".master_scale is ",
                                                l.master_scale, ", not a number >= 0"));
      }
    }
    if (file.Find(name + ".p_index") != nullptr) {
      ASSIGN_OR_RETURN(
          l.p, offload::ReadStateProjector(file, what, name + ".p", slot.m(), sub.p.dim, sub.p.r));
      ASSIGN_OR_RETURN(
          l.q, offload::ReadStateProjector(file, what, name + ".q", slot.n(), sub.q.dim, sub.q.r));
    }
  }
  return Commit([this, loaded]() -> absl::Status {
    for (size_t i = 0; i < loaded->size(); ++i) {
      Matrix& st = matrices_[i];
      Loaded& l = (*loaded)[i];
      st.base.copy_(l.adam.master);  // In place: no second copy of the state (known failure #15).
      st.base_scale = l.master_scale;
      st.sum_d.copy_(l.sum_d);
      const at::Tensor& lm = l.adam.m;  // (d_p, d_q) fp32
      const at::Tensor& lv = l.adam.v;  // (d_p, d_q) fp32
      std::vector<float> m(lm.data_ptr<float>(), lm.data_ptr<float>() + lm.numel());
      std::vector<float> v(lv.data_ptr<float>(), lv.data_ptr<float>() + lv.numel());
      RETURN_IF_ERROR(st.adam->Restore(l.adam.step, std::move(m), std::move(v)));
      st.p = std::move(l.p);
      st.q = std::move(l.q);
    }
    return absl::OkStatus();
  });
}

std::unique_ptr<UpdateRule> MakeLspRule() { return std::make_unique<LspRule>(); }

}  // namespace lspo::optimizer
