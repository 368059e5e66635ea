// The CPU optimizer service's core (no RPC): fp32 master weights of every trained matrix and
// subspace Adam ((d_p, d_q) moments per matrix), fed through the job's shared-memory arena.
//
// Shapes: m out features, n in features of W (m, n); d_p, d_q the subspace dims of P (m, d_p)
// and Q (n, d_q) (both d unless a side is narrow, lsp/subspace.h); r non-zeros per projector
// row.
//
// Master weights (design doc docs/architecture.md, "Training modes"): for each trained W (m x n)
//   W_master = W0 + sum over subspaces e of P_e (sum_t D_t) Q_e^T
// (with decoupled weight decay, every term scaled by the factors 1 - lr wd of the steps after
// it) kept as  W_master = s base + P (sum D) Q^T:  an fp32 base, a scalar s (the decay factors
// since the base was last rewritten: a step costs O(d^2), never O(m n)) and the running sum
// of this subspace's steps (d_p, d_q), itself decayed. The base absorbs s and P (sum D) Q^T at
// every projector change; export, refresh and checkpoints read the three parts.
// On a projector change the Adam moments move into the new subspace (paper Alg. 1):
//   M <- (P'^T P) M (Q^T Q'),  V <- (P'^T P)^2 V (Q^T Q')^2, step counter kept.
// MODE_ZERO (arena layout mode "zero"): the ZeRO-Offload-style baseline: full fp32 master
// weights and full Adam moments per matrix; Update reads the bf16 gradient, runs AdamW and
// writes the bf16 parameters back (ZeRO-Offload, Ren et al. 2021, Sec. 4).
// Gradients and updates are handed over through the arena's completion flags
// (runtime/completion_flags.h), so Update can run while the worker's backward still forms
// the shallower layers' gradients (overlap schedule).
// What differs by mode lives in one update rule per offloaded mode (update_rule.h: lsp_rule.cc,
// zero_rule.cc, galore_offload_rule.cc), chosen at LoadJob from the arena layout's mode, as the
// worker's update paths are (gpu_worker/update_path.h); this class is what the modes share:
// the job slot, Update's waits, verdicts and roll-back, exports and checkpoint files.
//
// Thread-safety: all methods may be called concurrently; they serialise on a mutex.
#ifndef LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_CORE_H_
#define LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_CORE_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/arena.pb.h"
#include "proto/job_spec.pb.h"
#include "proto/optimizer.pb.h"
#include "proto/peer.pb.h"
#include "runtime/allowed_roots.h"
#include "runtime/job_slot.h"

namespace lspo::optimizer {

struct OptimizerJob;  // optimizer_job.h (holds torch state).

// How an optimizer is set up (lsp_cpu_optimizer's flags; the embedded runtime's scheduler
// options).
struct OptimizerOptions {
  // Folders the paths of requests may resolve under (--allowed_roots; runtime/allowed_roots.h):
  // LoadJob's spec (every field offload::JobSpecPaths lists), the folders of SaveModel,
  // SaveState and LoadState. Empty = no restriction (single-user and embedded use).
  std::vector<std::string> allowed_roots;
};

class OptimizerCore {
 public:
  // An optimizer without path restrictions.
  OptimizerCore();
  // An optimizer set up by `options` (see OptimizerOptions).
  explicit OptimizerCore(OptimizerOptions options);
  ~OptimizerCore();

  // Loads W0 (same loader as the worker, so bit-identical) and attaches the arena. Every
  // path of `spec` (and the links among the entries of a folder it names) is checked against
  // the allowed roots first (offload::CheckJobSpecPaths), before anything is opened or looked
  // for, and before a stale job is replaced. (arena.name is a POSIX shared-memory name, not a
  // path: runtime::ShmArena refuses any name with a '/' after the first.)
  // Errors: kPermissionDenied (a path outside the allowed roots, naming the field, the path
  // and the fix), kFailedPrecondition (arena missing or of another size; another job loaded),
  // kInvalidArgument (layout does not match the model), model file errors.
  absl::StatusOr<lspo::v1::LoadJobReply> LoadJob(const std::string& job_id,
                                                 const lspo::v1::JobSpec& spec,
                                                 const lspo::v1::ArenaLayout& arena);

  // Reads the listed matrices' new projectors from the arena; folds the old subspace's steps
  // into the master weights and transfers the Adam moments (see the file comment).
  absl::Status SetProjectors(const std::string& job_id, const std::vector<int>& indices);

  // One optimizer step over request.tasks, in order. Per task (linear i): wait for its
  // gradient flag when request.wait_for_grads (else it must already be published), then
  //   lsp:  S (d_p, d_q) fp32 from the grad slot -> subspace Adam (Kingma & Ba 2015, Alg. 1;
  //         bias-corrected, eps after sqrt) -> D = -lr m_hat / (sqrt(v_hat) + eps) into the
  //         step slot; master: its base's scale and sum_d multiplied by 1 - lr wd (O(d^2):
  //         the base itself is not rewritten), then sum_d += D;
  //   zero: G (m, n) bf16 -> fp32 -> AdamW on the fp32 master -> bf16 into the param slot;
  // and publish the step flag. With optim.max_grad_norm > 0 every gradient is waited for
  // first and all are scaled by min(1, max_norm / (|g|_global + 1e-6)) (lsp: |g| over all S).
  // A step is all or nothing (issue 43): the serial schedule checks every gradient before the
  // first update; under the overlap schedule (request.wait_for_grads) the step is kept only
  // once the worker publishes its verdict (loss and every gradient finite: flags
  // WaitVerdict), the matrices updated before it keeping undo records (lsp, galore: d_p x d_q
  // state; zero: master, m, v in a pool of at most 1 GiB, past which Update waits for the
  // verdict; with clipping zero waits for it after the norm pass).
  // reply.aborted when the worker abandoned the step: no state changed, in every mode.
  // Errors (the state of every matrix this step updated is rolled back; step flags already
  // published stay): kInvalidArgument (bad index; non-finite gradient),
  // kFailedPrecondition (no projectors; gradient not published), kDeadlineExceeded (the
  // worker never published a gradient or its verdict: wait_timeout_seconds).
  absl::StatusOr<lspo::v1::UpdateReply> Update(const lspo::v1::UpdateRequest& request);

  // Marks `step` abandoned in the arena so a waiting Update returns (the scheduler calls it
  // when the worker's TrainStep failed). Does not take the core's mutex (Update holds it
  // while waiting). kFailedPrecondition if `job_id` is not loaded.
  absl::Status AbortStep(const std::string& job_id, int step);

  // Master-weight refresh (lsp): writes decoder layer `layer`'s 7 fp32 master weights
  // W = base + P (sum D) Q^T, in linear order, into the arena staging region.
  // Errors: kInvalidArgument (bad layer), kFailedPrecondition (not lsp).
  absl::StatusOr<lspo::v1::LayerWeightsReply> ExportLayerWeights(const std::string& job_id,
                                                                 int layer);

  // Writes `dir`/model.safetensors (F32, HF names) with every matrix materialised as
  // W_master = base + P (sum D) Q^T and the frozen tensors as loaded. Crash-consistent
  // (temp file + fsync + rename). `dir` and the links among its entries are checked against
  // the allowed roots first (offload::CheckRequestFolder).
  // Errors: kPermissionDenied (outside the allowed roots, naming the request field and the
  // path), kFailedPrecondition (no job), I/O errors naming the file.
  absl::StatusOr<lspo::v1::SaveReply> SaveModel(const std::string& job_id, const std::string& dir);

  // Checkpoint (exact resume): writes `dir`/optimizer_state.safetensors with, per trained
  // matrix (HF name prefix), `.master` (m, n) fp32 (zero: the master weight; lsp: the base
  // W0 + folded old subspaces), lsp: `.master_scale` () fp64 (the master is master_scale
  // * master + P sum_d Q^T; absent in older checkpoints: 1), `.sum_d` (d_p, d_q) fp32,
  // `.adam_m`, `.adam_v` (d_p, d_q) fp32, `.adam_step` () int64 and the projectors
  // (`.p_index` (m, r_p) int32, `.p_value` (m, r_p) fp32, `.q_*` (n, r_q)); zero: `.adam_m`,
  // `.adam_v` (m, n) fp32 and `.adam_step`; metadata {job_id, mode, step}. `dir` and the
  // links among its entries are checked against the allowed roots first
  // (offload::CheckRequestFolder).
  // Errors: kPermissionDenied (outside the allowed roots, naming the request field and the
  // path), kFailedPrecondition (no job), I/O errors naming the file.
  absl::StatusOr<lspo::v1::StateReply> SaveState(const std::string& job_id, const std::string& dir,
                                                 int step);

  // Restores what SaveState wrote into the freshly loaded job. Every tensor is read and
  // validated (shapes, dtypes, finite, v >= 0, step >= 0) before anything changes. `dir` and
  // the links among its entries are checked against the allowed roots before anything is
  // opened. Errors: kPermissionDenied (outside the allowed roots, naming the request field and
  // the path), kNotFound (missing file/tensor), kDataLoss naming the file and the tensor.
  absl::StatusOr<lspo::v1::StateReply> LoadState(const std::string& job_id, const std::string& dir,
                                                 int step);

  // Forgets the job. An Update of it still waiting for the worker's gradients (one a dead
  // scheduler started: its worker never runs that step) is first abandoned through the flags,
  // so that the unload, and a reload that follows it, do not wait for that Update's timeout
  // (it returns reply.aborted, no state changed). Always OK.
  absl::Status UnloadJob(const std::string& job_id);

 private:
  // The --allowed_roots (immutable: read without mu_).
  const runtime::AllowedRoots roots_;
  absl::Mutex mu_;
  // The loaded job (guarded by mu_), its flags for AbortStep (which must not wait for mu_)
  // and the step of the Update in progress, which UnloadJob abandons without mu_.
  // (Initialised in the constructors, where OptimizerJob is complete.)
  runtime::JobSlot<OptimizerJob> slot_;
};

}  // namespace lspo::optimizer

#endif  // LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_CORE_H_
