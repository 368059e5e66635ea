// The CPU optimizer service's core (no RPC): fp32 master weights of every trained matrix and
// subspace Adam (d x d moments per matrix), fed through the job's shared-memory arena.
//
// Master weights (design doc shared/docs/architecture.md, "Training modes"): for each trained W (m x n)
//   W_master = W0 + sum over subspaces e of P_e (sum_t D_t) Q_e^T
// kept as a materialised fp32 base plus the running sum of this subspace's steps (d x d);
// the base absorbs P (sum D) Q^T at every projector change and at export.
// On a projector change the Adam moments move into the new subspace (paper Alg. 1):
//   M <- (P'^T P) M (Q^T Q'),  V <- (P'^T P)^2 V (Q^T Q')^2, step counter kept.
//
// Thread-safety: all methods may be called concurrently; they serialise on a mutex.
#ifndef LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_CORE_H_
#define LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_CORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/lsp_offload.pb.h"

namespace lspo::optimizer {

struct OptimizerJob;

class OptimizerCore {
 public:
  OptimizerCore();
  ~OptimizerCore();

  // Loads W0 (same loader as the worker, so bit-identical) and attaches the arena.
  // Errors: kFailedPrecondition (arena missing or of another size; another job loaded),
  // kInvalidArgument (layout does not match the model), model file errors.
  absl::StatusOr<lspo::v1::LoadJobReply> LoadJob(const std::string& job_id,
                                                 const lspo::v1::JobSpec& spec,
                                                 const lspo::v1::ArenaLayout& arena);

  // Reads the listed matrices' new projectors from the arena; folds the old subspace's steps
  // into the master weights and transfers the Adam moments (see the file comment).
  absl::Status SetProjectors(const std::string& job_id, const std::vector<int>& indices);

  // Subspace Adam (Kingma & Ba 2015, Alg. 1; bias-corrected, eps after sqrt) for each task:
  // reads S (d, d) from its grad slot, writes D = -lr * m_hat / (sqrt(v_hat) + eps) into its
  // step slot and adds D to the running sum. Errors: kInvalidArgument (non-finite S: nothing
  // of the step is applied, state unchanged), kFailedPrecondition (no projectors yet).
  absl::StatusOr<lspo::v1::UpdateReply> Update(const lspo::v1::UpdateRequest& request);

  // Writes `dir`/model.safetensors (F32, HF names) with every matrix materialised as
  // W_master = base + P (sum D) Q^T and the frozen tensors as loaded. Crash-consistent
  // (temp file + fsync + rename).
  absl::StatusOr<lspo::v1::SaveReply> SaveModel(const std::string& job_id,
                                                const std::string& dir);

  absl::Status UnloadJob(const std::string& job_id);

 private:
  absl::StatusOr<OptimizerJob*> Find(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::unique_ptr<OptimizerJob> job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lspo::optimizer

#endif  // LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_CORE_H_
