// Shapes as in gpu_worker/lsp_path.h.
#include "gpu_worker/lsp_path.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gpu_worker/device_offload.h"
#include "gpu_worker/worker_job.h"
#include "lsp/subspace.h"
#include "offload/arena_layout.h"
#include "offload/arena_tensors.h"
#include "offload/torch_call.h"
#include "offload/training_mode.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

namespace {
// Separates the apply's rounding noise from the projector draws of the same seed.
constexpr uint64_t kApplyNoiseSalt = 0x5eed0a991e5ull;
}  // namespace

absl::StatusOr<lspo::v1::ArenaLayout> LspPath::BuildLayout(const WorkerJob& job) {
  const auto& lsp = job.spec.lsp();
  ASSIGN_OR_RETURN(std::vector<lsp::MatrixSubspace> subspaces,
                   offload::ResolveJobSubspaces(job.linears, lsp));
  int narrow = 0;
  for (size_t i = 0; i < subspaces.size(); ++i) {
    const lsp::MatrixSubspace& s = subspaces[i];
    const auto& l = job.linears[i];
    if (s.p.identity || s.q.identity || (lsp.d() > 0 && s.p.dim != lsp.d())) {
      if (narrow++ < 2) {
        LOG(INFO) << "worker: " << l.name << " (" << l.m << " x " << l.n << ") has subspace "
                  << s.Describe() << " (lsp.narrow = "
                  << (lsp.narrow() == lspo::v1::NARROW_RULE_UNSPECIFIED
                          ? std::string("one-sided")
                          : runtime::EnumShortName(lsp.narrow()))
                  << ")";
      }
    }
  }
  if (narrow > 2) LOG(INFO) << "worker: " << narrow << " matrices in all have a narrow side";
  // The mode's one layout builder, the planner's too (offload/training_mode.h).
  return offload::ModeOf(job.spec).layout(job.linears, model::kLinearsPerLayer, job.spec,
                                          runtime::ShmArena::UniqueName(job.id));
}

absl::Status LspPath::AttachGradients(WorkerJob* job) {
  p_.resize(job->linears.size());
  q_.resize(job->linears.size());
  s_accum_.resize(job->linears.size());
  // One micro-batch per step: each S is the step's, kept as formed (until it is published
  // and the next step begins) instead of summed into an accumulator held for the whole job.
  persistent_s_ = job->spec.grad_accum() > 1;
  if (persistent_s_) {
    RETURN_IF_ERROR(offload::TorchCall("allocating the S accumulators", [&]() -> absl::Status {
      for (size_t i = 0; i < s_accum_.size(); ++i) {
        const auto& slot = job->plane.layout.linears(static_cast<int>(i));
        // (d_p, d_q) fp32 on the job's device.
        s_accum_[i] = at::zeros({slot.d_p(), slot.d_q()},
                                at::TensorOptions().dtype(at::kFloat).device(job->device));
      }
      return absl::OkStatus();
    }));
  }
  auto& model = *job->model;
  linears_ = std::make_shared<lsp::LspLinears>(model);
  linears_->SetDenseCompression(job->spec.lsp().compression() == lspo::v1::COMPRESSION_DENSE);
  kernels_ = job->spec.lsp().kernels() == lspo::v1::CUDA_KERNELS_CUSTOM ? lsp::CudaKernels::kCustom
             : job->spec.lsp().kernels() == lspo::v1::CUDA_KERNELS_ATEN
                 ? lsp::CudaKernels::kAten
                 : lsp::CudaKernels::kDefault;
  linears_->SetCudaKernels(kernels_);
  model.SetLinearImpl(linears_);
  model.SetLinearMode(model::LinearMode::kCustom);
  // CUDA: each S's formation bracketed by compute-stream events (StepMetrics
  // device_phase_seconds["compress"], "gpu" spans of the timeline).
  linears_->SetCompressBeginHook([job](int64_t i) {
    if (job->plane.engine)
      job->plane.engine->MarkComputeBegin(i / model::kLinearsPerLayer, "compress");
  });
  linears_->SetSink([this, job](int64_t i, const at::Tensor& s) {  // S (d_p, d_q) fp32
    if (job->plane.engine)
      job->plane.engine->MarkComputeEnd(i / model::kLinearsPerLayer, "compress");
    if (persistent_s_) {
      s_accum_[i].add_(s);
    } else {
      s_accum_[i] = s;  // a fresh (d_p, d_q) fp32 tensor of this backward (lsp_linear.h)
    }
    if (job->progress.publish_step > 0 && !job->progress.publish_failed) {
      const bool sent = PublishGradient(job, i, s_accum_[i], job->progress.publish_step);
      // Overlap schedule, one micro-batch: nothing reads this S again once it is on its way
      // (the copy holds it until it lands), so it is freed then instead of living, with every
      // other matrix's, until the next step (issue 42: the S memory of a few layers, not all).
      if (sent && !persistent_s_) s_accum_[i] = at::Tensor();
    }
  });
  return absl::OkStatus();
}

size_t LspPath::MaxUploadBytes(const WorkerJob& job) const {
  // The upload is D (d_p, d_q) fp32; the largest over the matrices.
  size_t most = 0;
  for (const auto& slot : job.plane.layout.linears()) {
    most = std::max(most, static_cast<size_t>(slot.d_p()) * static_cast<size_t>(slot.d_q()) * 4);
  }
  return most;
}

absl::Status LspPath::CheckReady(const WorkerJob& job) const {
  if (!fitted_) return absl::FailedPreconditionError("TrainStep before FitProjectors in MODE_LSP");
  return absl::OkStatus();
}

void LspPath::ZeroGrads(WorkerJob* job) {
  for (auto& s : s_accum_) {  // (d_p, d_q) fp32
    if (persistent_s_) {
      s.zero_();
    } else {
      s = at::Tensor();  // the last step's S, published: freed
    }
  }
}

double LspPath::WorkerDecay(const lspo::v1::JobSpec& spec, double lr) const {
  return 1.0 - lr * spec.optim().weight_decay();
}

absl::StatusOr<at::Tensor> LspPath::GradientSlot(const WorkerJob& job, int64_t i) const {
  return offload::ArenaF32(job.plane.arena, job.plane.layout.linears(static_cast<int>(i)).grad());
}

at::Tensor LspPath::DeviceSnapshot(const at::Tensor& grad) const {
  // An accumulator is summed into in place by later micro-batches: a copy. An S kept as formed
  // is never written again (the next step replaces the handle): itself.
  if (!persistent_s_) return grad.to(at::kFloat).contiguous();
  return grad.to(at::kFloat).clone(at::MemoryFormat::Contiguous);
}

absl::Status LspPath::CheckUpdate(WorkerJob* job, int64_t i, uint32_t step) {
  ASSIGN_OR_RETURN(
      // D (d_p, d_q) fp32, a view of the arena.
      at::Tensor d,
      offload::ArenaF32(job->plane.arena, job->plane.layout.linears(static_cast<int>(i)).step()));
  if (!at::isfinite(d).all().item<bool>()) {
    return absl::DataLossError(absl::StrCat("step D for ", job->linears[i].name, " at step ", step,
                                            " is not finite; weights left untouched"));
  }
  return absl::OkStatus();
}

absl::Status LspPath::Land(WorkerJob* job, int64_t i, uint32_t step, at::Tensor& w, double decay) {
  const auto& slot = job->plane.layout.linears(static_cast<int>(i));
  // D (d_p, d_q) fp32: a view of the arena, then (CUDA) its device copy.
  ASSIGN_OR_RETURN(at::Tensor d, offload::ArenaF32(job->plane.arena, slot.step()));
  // D is in host memory (the arena): this check never waits for the device.
  if (!at::isfinite(d).all().item<bool>()) {
    return absl::DataLossError(absl::StrCat("step D for ", job->linears[i].name, " at step ", step,
                                            " is not finite; weights left untouched"));
  }
  if (job->cuda) {
    // H2D on the upload stream; the compute stream waits for this copy only.
    ASSIGN_OR_RETURN(d, job->plane.engine->UploadAsync(i / model::kLinearsPerLayer, d.data_ptr(),
                                                       d.nbytes(), at::kFloat, d.sizes()));
  }
  // One fused pass over W: decay, the step and the rounding (lsp::ApplyStepFused).
  if (!comp_.empty()) {
    lsp::ApplyStepFused(w, &comp_[i], p_[i], d, q_[i], decay, lsp::Rounding::kCompensated, 0,
                        kernels_);
  } else {
    const bool stochastic =
        offload::LspApplyRounding(job->spec) == lspo::v1::APPLY_ROUNDING_STOCHASTIC;
    // The noise depends only on the job's seed, the step and the matrix: resumes and data-
    // parallel ranks round alike.
    lsp::ApplyStepFused(w, nullptr, p_[i], d, q_[i], decay,
                        stochastic ? lsp::Rounding::kStochastic : lsp::Rounding::kNearest,
                        lsp::ProjectorSeed(job->spec.seed() ^ kApplyNoiseSalt, i, step), kernels_);
  }
  if (job->cuda) RETURN_IF_ERROR(job->plane.engine->ReleaseStaging());
  return absl::OkStatus();
}

absl::Status LspPath::InitCompensation(WorkerJob* job, std::vector<at::Tensor> residuals) {
  if (residuals.size() != job->linears.size()) {
    return absl::InvalidArgumentError(absl::StrCat("InitCompensation: ", residuals.size(),
                                                   " residuals for ", job->linears.size(),
                                                   " matrices"));
  }
  for (size_t i = 0; i < residuals.size(); ++i) {
    const at::Tensor& w = job->model->LinearWeight(static_cast<int64_t>(i));  // (m, n) as stored
    if (residuals[i].sizes() != w.sizes() || residuals[i].scalar_type() != w.scalar_type()) {
      return absl::InvalidArgumentError(absl::StrCat("InitCompensation: the residual of ",
                                                     job->linears[i].name,
                                                     " does not match its weight"));
    }
    residuals[i] = residuals[i].to(w.device()).contiguous();
  }
  comp_ = std::move(residuals);
  return absl::OkStatus();
}

void LspPath::RefreshFromMaster(WorkerJob* job, int64_t i, const at::Tensor& master) {
  at::Tensor& w = job->model->LinearWeight(i);  // (m, n) as stored
  if (comp_.empty()) {
    w.copy_(master);
    return;
  }
  comp_[i] = lsp::RoundWithResidual(w, master.to(w.device()));
}

absl::Status LspPath::InstallProjectors(WorkerJob* job, int64_t i, lsp::SparseProjector p,
                                        lsp::SparseProjector q) {
  const auto& slot = job->plane.layout.linears(static_cast<int>(i));
  RETURN_IF_ERROR(offload::WriteProjector(job->plane.arena, slot.p_index(), slot.p_value(), p));
  RETURN_IF_ERROR(offload::WriteProjector(job->plane.arena, slot.q_index(), slot.q_value(), q));
  if (linears_ != nullptr) RETURN_IF_ERROR(linears_->SetProjectors(i, p, q));
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
  for (size_t i = 0; i < comp_.size(); ++i) {
    tensors->emplace_back(job->linears[i].name + ".comp", comp_[i]);
  }
  (*metadata)["fitted"] = fitted_ ? "1" : "0";
  return absl::OkStatus();
}

absl::StatusOr<UpdatePath::Commit> LspPath::ReadState(WorkerJob* job,
                                                      const model::SafetensorsFile& file,
                                                      const std::string& what,
                                                      const std::string& dir) {
  // The compensation residuals (lsp.apply_rounding compensated, 16-bit weights). A checkpoint
  // written before they existed has none: the job goes on with zero residuals.
  auto comp = std::make_shared<std::vector<at::Tensor>>();  // per linear (m, n), comp_'s dtype
  for (size_t i = 0; i < comp_.size(); ++i) {
    const std::string name = job->linears[i].name + ".comp";
    if (file.Find(name) == nullptr) {
      LOG(WARNING) << "worker: " << what << " has no " << name
                   << " (written without compensation); continuing with zero residuals";
      comp->clear();
      break;
    }
    // (m, n) in comp_[i]'s dtype, CPU.
    ASSIGN_OR_RETURN(at::Tensor c, offload::ReadStateTensor(
                                       file, what, name, comp_[i].scalar_type(), comp_[i].sizes()));
    comp->push_back(std::move(c));
  }
  const auto commit_comp = [this, comp]() {
    for (size_t i = 0; i < comp_.size(); ++i) {
      if (comp->empty()) {
        comp_[i].zero_();
      } else {
        comp_[i].copy_((*comp)[i]);
      }
    }
  };
  const auto& meta = file.metadata();
  if (!(meta.count("fitted") && meta.at("fitted") == "1")) {
    return Commit([commit_comp] {  // Saved before the first fit.
      commit_comp();
      return absl::OkStatus();
    });
  }
  const size_t n = job->linears.size();
  auto p = std::make_shared<std::vector<lsp::SparseProjector>>(n);
  auto q = std::make_shared<std::vector<lsp::SparseProjector>>(n);
  for (size_t i = 0; i < n; ++i) {
    const offload::LinearShape& ls = job->linears[i];
    const lsp::MatrixSubspace sub =
        offload::SlotSubspace(job->plane.layout.linears(static_cast<int>(i)));
    ASSIGN_OR_RETURN(
        (*p)[i], offload::ReadStateProjector(file, what, ls.name + ".p", ls.m, sub.p.dim, sub.p.r));
    ASSIGN_OR_RETURN(
        (*q)[i], offload::ReadStateProjector(file, what, ls.name + ".q", ls.n, sub.q.dim, sub.q.r));
  }
  return Commit([this, job, p, q, commit_comp]() -> absl::Status {
    commit_comp();
    for (size_t i = 0; i < p->size(); ++i) {
      lsp::SparseProjector pi = std::move((*p)[i]), qi = std::move((*q)[i]);
      if (job->cuda) {
        pi = pi.To(job->device);
        qi = qi.To(job->device);
      }
      RETURN_IF_ERROR(
          InstallProjectors(job, static_cast<int64_t>(i), std::move(pi), std::move(qi)));
    }
    if (linears_ != nullptr) job->model->SetLinearMode(model::LinearMode::kCustom);
    fitted_ = true;
    return absl::OkStatus();
  });
}

std::unique_ptr<UpdatePath> MakeLspPath() { return std::make_unique<LspPath>(); }

absl::StatusOr<LspPath*> LspPathOf(WorkerJob* job, const char* what) {
  auto* path = dynamic_cast<LspPath*>(job->path.get());
  if (path == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(what, " needs mode lsp (or galore-offload)"));
  }
  return path;
}

}  // namespace lspo::worker
