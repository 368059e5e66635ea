// MODE_LSP on the worker (docs/method.md): every trainable matrix computes through the LSP
// autograd node (lsp/lsp_linear.h), whose backward hands S = P^T G Q (d_p, d_q) fp32 to a sink
// that sums it over the step's micro-batches; S goes to the optimizer service through the
// arena, and the step D (d_p, d_q) fp32 comes back and lands as W <- (1 - lr wd) W + P D Q^T
// in one fused pass with the spec's rounding (lsp::ApplyStepFused). Each matrix's (d_p, d_q) and
// identity sides come from lsp/subspace.h (lsp.d or lsp.d_ratio, and lsp.narrow), resolved once
// when the arena is laid out. The projectors P (m, d_p) and Q (n, d_q) are fitted by the projector
// check (calibration.h), which reaches them through LspPathOf. Internal to gpu_worker/.
//
// Shapes: W (m, n), m out features, n in features; d_p, d_q the subspace dims; r non-zeros per
// projector row (r_p for P, r_q for Q).
#ifndef LSPO_GPU_WORKER_LSP_PATH_H_
#define LSPO_GPU_WORKER_LSP_PATH_H_

#include <memory>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/status/statusor.h"
#include "gpu_worker/offload_path.h"
#include "lsp/lsp_linear.h"
#include "lsp/projector.h"

namespace lspo::worker {

// The LSP update path (see the file comment). GaLore-Offload (galore_offload_path.cc) derives
// from it: the same arena slots, landing, compensation and checkpointed projectors, with its
// own layout, gradients and name.
class LspPath : public OffloadPath {
 public:
  const char* name() const override { return "lsp"; }
  absl::Status CheckReady(const WorkerJob& job) const override;
  void ZeroGrads(WorkerJob* job) override;
  double WorkerDecay(const lspo::v1::JobSpec& spec, double lr) const override;
  absl::Status CheckUpdate(WorkerJob* job, int64_t i, uint32_t step) override;
  absl::Status SaveState(WorkerJob* job, const std::string& dir, offload::NamedTensors* tensors,
                         std::map<std::string, std::string>* metadata,
                         lspo::v1::StateReply* reply) override;
  absl::StatusOr<Commit> ReadState(WorkerJob* job, const model::SafetensorsFile& file,
                                   const std::string& what, const std::string& dir) override;

  // Installs P (m, d_p) and Q (n, d_q) of linear i (on the job's device): in the arena for the
  // optimizer, in the model's LSP node and here. p: index / value (m, r_p) int64 / fp32; q the
  // same, (n, r_q). Errors: arena slot and shape errors.
  absl::Status InstallProjectors(WorkerJob* job, int64_t i, lsp::SparseProjector p,
                                 lsp::SparseProjector q);

  // Compensated apply (lsp.apply_rounding, lsp::ApplyStepCompensated) for 16-bit weights:
  // installs the residuals C_i = round(W0_i - round(W0_i)) of the fp32 weights the model had
  // before its storage dtype was lowered ((m, n), the weights' dtype; moved to the job's
  // device), so that W + C starts at W0 exactly as the optimizer's master does. Errors:
  // kInvalidArgument if the count or a shape/dtype differs from the model's weights.
  absl::Status InitCompensation(WorkerJob* job, std::vector<at::Tensor> residuals);
  // Master refresh of linear i: W_i = round(master), and C_i = the residual when compensating.
  // master: (m, n) fp32 on any device; W_i (m, n) as stored.
  void RefreshFromMaster(WorkerJob* job, int64_t i, const at::Tensor& master);
  bool compensating() const { return !comp_.empty(); }

  // Per linear; rows == 0 until the first fit. P index / value (m, r_p), Q (n, r_q), int64 /
  // fp32 on the job's device.
  const std::vector<lsp::SparseProjector>& p() const { return p_; }
  const std::vector<lsp::SparseProjector>& q() const { return q_; }
  // True once every linear has projectors (after the first projector check or a resume).
  bool fitted() const { return fitted_; }
  void set_fitted() { fitted_ = true; }

 private:
  absl::StatusOr<lspo::v1::ArenaLayout> BuildLayout(const WorkerJob& job) override;
  // OffloadPath's hooks with Gradient S (d_p, d_q) fp32, GradientSlot the grad slot (d_p, d_q)
  // fp32, DeviceSnapshot S as (d_p, d_q) fp32, and Land's w (m, n) as stored.
  absl::Status AttachGradients(WorkerJob* job) override;
  size_t MaxUploadBytes(const WorkerJob& job) const override;
  at::Tensor Gradient(WorkerJob* job, int64_t i) override { return s_accum_[i]; }
  absl::StatusOr<at::Tensor> GradientSlot(const WorkerJob& job, int64_t i) const override;
  at::Tensor DeviceSnapshot(const at::Tensor& grad) const override;
  absl::Status Land(WorkerJob* job, int64_t i, uint32_t step, at::Tensor& w, double decay) override;

 protected:
  std::vector<lsp::SparseProjector> p_, q_;  // As p() and q().
  // The model's LinearImpl; null when the linears compute densely (GaLore-Offload).
  std::shared_ptr<lsp::LspLinears> linears_;
  // The job's kernels for CUDA tensors (lsp.kernels): the compression's (linears_) and the
  // apply's. Per job: nothing process-wide is set.
  lsp::CudaKernels kernels_ = lsp::CudaKernels::kDefault;
  // Per linear, (d_p, d_q) fp32: with grad_accum > 1 (persistent_s_) an accumulator summed
  // over the step's micro-batches and zeroed per step; with one micro-batch per step the S of
  // the step's backward itself (undefined between steps), so no accumulator lives on the
  // device for the whole job.
  std::vector<at::Tensor> s_accum_;
  bool persistent_s_ = true;
  std::vector<at::Tensor> comp_;  // Per linear, (m, n) bf16/fp16 residuals; empty = none.
  bool fitted_ = false;
};

// The job's LspPath (MODE_LSP, or MODE_GALORE with galore.offload). Errors:
// kFailedPrecondition naming `what` when the job has no LspPath.
absl::StatusOr<LspPath*> LspPathOf(WorkerJob* job, const char* what);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_LSP_PATH_H_
