#include "gpu_worker/lsp_path.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gpu_worker/device_offload.h"
#include "gpu_worker/worker_job.h"
#include "offload/arena_layout.h"
#include "offload/arena_tensors.h"
#include "offload/torch_call.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

absl::StatusOr<lspo::v1::ArenaLayout> LspPath::BuildLayout(const WorkerJob& job) {
  const int d = job.spec.lsp().d(), r = job.spec.lsp().r();
  for (const auto& l : job.linears) {
    absl::Status s = lsp::CheckProjectorShapes(l.m, l.n, d, r);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec field lsp.d = ", d, " / lsp.r = ", r, " does not fit ", l.name, " (", l.m,
          " x ", l.n, "): ", s.message()));
    }
  }
  return offload::BuildArenaLayout(job.linears, model::kLinearsPerLayer, d, r,
                                   runtime::ShmArena::UniqueName(job.id));
}

absl::Status LspPath::AttachGradients(WorkerJob* job) {
  const int d = job->spec.lsp().d();
  p_.resize(job->linears.size());
  q_.resize(job->linears.size());
  s_accum_.resize(job->linears.size());
  RETURN_IF_ERROR(offload::TorchCall("allocating the S accumulators", [&]() -> absl::Status {
    for (auto& s : s_accum_) {
      s = at::zeros({d, d}, at::TensorOptions().dtype(at::kFloat).device(job->device));
    }
    return absl::OkStatus();
  }));
  auto& model = *job->model;
  linears_ = std::make_shared<lsp::LspLinears>(model);
  model.SetLinearImpl(linears_);
  model.SetLinearMode(model::LinearMode::kCustom);
  linears_->SetSink([this, job](int64_t i, const at::Tensor& s) {
    s_accum_[i].add_(s);
    if (job->publish_step > 0 && !job->publish_failed) {
      PublishGradient(job, i, s_accum_[i], job->publish_step);
    }
  });
  return absl::OkStatus();
}

size_t LspPath::MaxUploadBytes(const WorkerJob& job) const {
  // The upload is D (d, d) fp32.
  const size_t d = static_cast<size_t>(job.spec.lsp().d());
  return job.linears.empty() ? 0 : d * d * 4;
}

absl::Status LspPath::CheckReady(const WorkerJob& job) const {
  if (!fitted_) return absl::FailedPreconditionError("TrainStep before FitProjectors in MODE_LSP");
  return absl::OkStatus();
}

void LspPath::ZeroGrads(WorkerJob* job) {
  for (auto& s : s_accum_) s.zero_();
}

double LspPath::WorkerDecay(const lspo::v1::JobSpec& spec, double lr) const {
  return 1.0 - lr * spec.optim().weight_decay();
}

absl::StatusOr<at::Tensor> LspPath::GradientSlot(const WorkerJob& job, int64_t i) const {
  return offload::ArenaF32(job.arena, job.layout.linears(static_cast<int>(i)).grad());
}

at::Tensor LspPath::DeviceSnapshot(const at::Tensor& grad) const {
  // S is accumulated in place by later micro-batches: always a copy.
  return grad.to(at::kFloat).clone(at::MemoryFormat::Contiguous);
}

absl::Status LspPath::CheckUpdate(WorkerJob* job, int64_t i, uint32_t step) {
  ASSIGN_OR_RETURN(at::Tensor d,
                   offload::ArenaF32(job->arena, job->layout.linears(static_cast<int>(i)).step()));
  if (!at::isfinite(d).all().item<bool>()) {
    return absl::DataLossError(absl::StrCat("step D for ", job->linears[i].name, " at step ", step,
                                            " is not finite; weights left untouched"));
  }
  return absl::OkStatus();
}

absl::Status LspPath::Land(WorkerJob* job, int64_t i, uint32_t step, at::Tensor& w,
                          double decay) {
  const auto& slot = job->layout.linears(static_cast<int>(i));
  ASSIGN_OR_RETURN(at::Tensor d, offload::ArenaF32(job->arena, slot.step()));
  // D is in host memory (the arena): this check never waits for the device.
  if (!at::isfinite(d).all().item<bool>()) {
    return absl::DataLossError(absl::StrCat("step D for ", job->linears[i].name, " at step ",
                                            step, " is not finite; weights left untouched"));
  }
  if (job->cuda) {
    // H2D on the upload stream; the compute stream waits for this copy only.
    ASSIGN_OR_RETURN(d, job->offload->UploadAsync(i / model::kLinearsPerLayer, d.data_ptr(),
                                                  d.nbytes(), at::kFloat, d.sizes()));
  }
  if (decay != 1.0) w.mul_(decay);
  lsp::ApplyStep(w, p_[i], d, q_[i]);
  if (job->cuda) RETURN_IF_ERROR(job->offload->ReleaseStaging());
  return absl::OkStatus();
}

absl::Status LspPath::InstallProjectors(WorkerJob* job, int64_t i, lsp::SparseProjector p,
                                        lsp::SparseProjector q) {
  const auto& slot = job->layout.linears(static_cast<int>(i));
  RETURN_IF_ERROR(offload::WriteProjector(job->arena, slot.p_index(), slot.p_value(), p));
  RETURN_IF_ERROR(offload::WriteProjector(job->arena, slot.q_index(), slot.q_value(), q));
  RETURN_IF_ERROR(linears_->SetProjectors(i, p, q));
  p_[i] = std::move(p);
  q_[i] = std::move(q);
  return absl::OkStatus();
}

absl::Status LspPath::SaveState(WorkerJob* job, const std::string& dir,
                                offload::NamedTensors* tensors,
                                std::map<std::string, std::string>* metadata,
                                lspo::v1::StateReply* reply) {
  for (size_t i = 0; i < job->linears.size(); ++i) {
    if (p_[i].rows == 0) continue;
    offload::AppendProjector(job->linears[i].name + ".p", p_[i], tensors);
    offload::AppendProjector(job->linears[i].name + ".q", q_[i], tensors);
  }
  (*metadata)["fitted"] = fitted_ ? "1" : "0";
  return absl::OkStatus();
}

absl::StatusOr<UpdatePath::Commit> LspPath::ReadState(WorkerJob* job,
                                                     const model::SafetensorsFile& file,
                                                     const std::string& what,
                                                     const std::string& dir) {
  const auto& meta = file.metadata();
  if (!(meta.count("fitted") && meta.at("fitted") == "1")) {
    return Commit([] { return absl::OkStatus(); });  // Saved before the first fit.
  }
  const size_t n = job->linears.size();
  auto p = std::make_shared<std::vector<lsp::SparseProjector>>(n);
  auto q = std::make_shared<std::vector<lsp::SparseProjector>>(n);
  const int64_t d = job->layout.d(), r = job->layout.r();
  for (size_t i = 0; i < n; ++i) {
    const offload::LinearShape& ls = job->linears[i];
    ASSIGN_OR_RETURN((*p)[i], offload::ReadStateProjector(file, what, ls.name + ".p", ls.m, d, r));
    ASSIGN_OR_RETURN((*q)[i], offload::ReadStateProjector(file, what, ls.name + ".q", ls.n, d, r));
  }
  return Commit([this, job, p, q]() -> absl::Status {
    for (size_t i = 0; i < p->size(); ++i) {
      lsp::SparseProjector pi = std::move((*p)[i]), qi = std::move((*q)[i]);
      if (job->cuda) {
        pi = pi.To(job->device);
        qi = qi.To(job->device);
      }
      RETURN_IF_ERROR(InstallProjectors(job, static_cast<int64_t>(i), std::move(pi),
                                        std::move(qi)));
    }
    job->model->SetLinearMode(model::LinearMode::kCustom);
    fitted_ = true;
    return absl::OkStatus();
  });
}

std::unique_ptr<UpdatePath> MakeLspPath() { return std::make_unique<LspPath>(); }

absl::StatusOr<LspPath*> LspPathOf(WorkerJob* job, const char* what) {
  auto* path = dynamic_cast<LspPath*>(job->path.get());
  if (path == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(what, " needs MODE_LSP"));
  }
  return path;
}

}  // namespace lspo::worker
