// The lsp update rule (MODE_LSP; the base of GaLore-Offload's, galore_offload_rule.cc): per
// trained matrix W (m, n) with subspace (d_p, d_q) (lsp/subspace.h) it keeps
//   the master weight  W_master = base_scale * base + P sum_d Q^T
// (base (m, n) fp32, base_scale a double, sum_d (d_p, d_q) fp32, the sum of this subspace's
// steps) and Adam's moments in the subspace (lsp::SubspaceAdam, (d_p, d_q) fp32 each). A step
// reads S (d_p, d_q) fp32 from the grad slot, writes D = -lr m_hat / (sqrt(v_hat) + eps)
// (lsp/adam.h) into the step slot, multiplies base_scale and sum_d by the decoupled decay
// 1 - lr wd (O(d^2): base is not rewritten) and adds D to sum_d. SetProjectors folds the old
// subspace into base and moves the moments into the new one (paper Alg. 1; optimizer_core.h).
// Internal to cpu_optimizer_service/.
//
// Shapes: m out features, n in features; d_p, d_q the subspace dims, P (m, d_p), Q (n, d_q);
// r non-zeros per projector row (r_p, r_q).
//
// Thread-safety: as UpdateRule (under OptimizerCore's mutex).
#ifndef LSPO_CPU_OPTIMIZER_SERVICE_LSP_RULE_H_
#define LSPO_CPU_OPTIMIZER_SERVICE_LSP_RULE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cpu_optimizer_service/update_rule.h"
#include "lsp/adam.h"
#include "lsp/projector.h"

namespace lspo::optimizer {

// The lsp rule (see the file comment).
class LspRule : public UpdateRule {
 public:
  const char* name() const override { return "lsp"; }
  absl::StatusOr<int64_t> AddMatrix(const lspo::v1::LinearSlot& slot, at::Tensor w0) override;
  std::string Describe(const lspo::v1::ArenaLayout& layout) const override;
  // Errors: kInvalidArgument (bad index), kDataLoss (a malformed projector in the arena),
  // kInternal (LibTorch).
  absl::Status SetProjectors(OptimizerJob* job, const std::vector<int>& indices) override;
  // kFailedPrecondition "Update before SetProjectors for NAME" while matrix i has none.
  absl::Status CheckReady(const OptimizerJob& job, int i) const override;
  // S (d_p, d_q) fp32 from the grad slot.
  absl::StatusOr<MatrixGradient> Gradient(const OptimizerJob& job, int i) const override;
  absl::Status UpdateMatrix(OptimizerJob* job, int i, const MatrixGradient& g,
                            const StepInputs& in) override;
  void RollBack() override;
  void EndStep() override;
  // W = base_scale * base + P sum_d Q^T (base alone before the first projectors). out: (m, n)
  // fp32.
  void WriteMasterWeight(int i, at::Tensor out) const override;
  // Per matrix NAME: NAME.master (base, (m, n) fp32), .master_scale () fp64, .sum_d (d_p, d_q),
  // .adam_m, .adam_v (d_p, d_q) fp32, .adam_step () int64 and, once set, the projectors .p_* /
  // .q_*.
  void AppendState(const lspo::v1::ArenaLayout& layout, offload::NamedTensors* tensors) override;
  // Reads what AppendState wrote; .master_scale (absent in older checkpoints: 1) must be
  // finite and >= 0, the projectors are optional (a checkpoint before the first fit).
  absl::StatusOr<Commit> ReadState(const lspo::v1::ArenaLayout& layout,
                                   const model::SafetensorsFile& file,
                                   const std::string& what) override;

 protected:
  // One trained matrix's state (see the file comment).
  struct Matrix {
    at::Tensor base;  // (m, n) fp32
    double base_scale = 1.0;
    at::Tensor sum_d;  // (d_p, d_q) fp32
    // Unset (rows 0) until the first projectors; then P index / value (m, r_p), Q (n, r_q),
    // int64 / fp32 on the CPU.
    lsp::SparseProjector p, q;
    std::unique_ptr<lsp::SubspaceAdam> adam;  // moments m, v (d_p, d_q) fp32
  };

  // The hyper-parameters of matrix i's Adam step of `in`, once anything the mode does first
  // is done (its undo record already taken). Default: in.hyper. Errors abort the step (the
  // core rolls it back).
  virtual absl::StatusOr<lsp::AdamHyper> BeforeStep(OptimizerJob* job, int i,
                                                    const StepInputs& in) {
    return in.hyper;
  }

  std::vector<Matrix> matrices_;
  int64_t subspace_elements_ = 0;  // Sum of d_p d_q over the matrices.

 private:
  // Matrix i's state before the step in progress. A projector refresh (GaLore-Offload)
  // replaces base, sum_d and the projectors with new tensors, so the record keeps the old.
  struct Undo {
    int index;
    int64_t step;
    std::vector<float> m, v;  // (d_p, d_q) fp32 copies
    at::Tensor base;          // (m, n) fp32: the matrix's base tensor (not a copy)
    double base_scale;
    at::Tensor sum_d;  // (d_p, d_q) fp32, a copy
    lsp::SparseProjector p, q;
  };
  std::vector<Undo> undo_;
  std::vector<float> scaled_;  // S times the clip coefficient (a copy; small).
};

}  // namespace lspo::optimizer

#endif  // LSPO_CPU_OPTIMIZER_SERVICE_LSP_RULE_H_
