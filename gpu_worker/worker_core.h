// The GPU worker's core (no RPC): owns the model on its device, the job's data, the sparse
// projectors and the shared-memory arena; runs forward/backward with LSP compression, the
// projector fit, applies the optimizer's steps, evaluates and exports the tokenizer/config.
//
// Per trained weight matrix W (m x n, HF layout) in MODE_LSP (method.md, "Math"):
//   forward keeps XQ = X Q (N x d); backward forms S = (dY P)^T (X Q) = P^T G Q (d x d fp32)
//   without ever forming G; S (summed over the step's micro-batches) goes to the arena's grad
//   slot; ApplyUpdates reads D (d x d) from the step slot and does W += P D Q^T.
// MODE_NATIVE: AdamW on the worker over the same trained matrices (no offload).
// Only the 7 linear weights of every decoder layer train; embeddings and norms stay frozen.
//
// Thread-safety: all methods may be called concurrently; calls are serialised per worker by
// an internal mutex (one job at a time).
#ifndef LSPO_GPU_WORKER_WORKER_CORE_H_
#define LSPO_GPU_WORKER_WORKER_CORE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/lsp_offload.pb.h"

namespace lspo::worker {

struct WorkerJob;  // Defined in worker_core.cc (holds torch state).

class WorkerCore {
 public:
  WorkerCore();
  ~WorkerCore();

  // Loads the model (GGUF dequantised to fp32, or a seeded tiny random Llama), the tokenizer
  // and the data; in MODE_LSP validates d, r against every trained matrix and creates the
  // arena (mode 0600). Errors: kInvalidArgument (d >= min(m, n) of some matrix, naming it;
  // bad data rows), kNotFound (missing file), kDataLoss/kUnimplemented (bad model file),
  // kFailedPrecondition (another job is loaded).
  absl::StatusOr<lspo::v1::LoadJobReply> LoadJob(const std::string& job_id,
                                                 const lspo::v1::JobSpec& spec);

  // Calibration gradients (dense G of every trained matrix over lsp.calibration_examples
  // training examples) then, per matrix, a projector fit (lsp/fit.h). At step 0 every matrix
  // gets fresh projectors; later only those whose relative bias exceeds lsp.alpha are
  // re-drawn and refitted. New projectors are written to the arena.
  // Errors: kFailedPrecondition (no job / not MODE_LSP), kInvalidArgument (non-finite G).
  absl::StatusOr<lspo::v1::FitProjectorsReply> FitProjectors(const std::string& job_id,
                                                             int step);

  // One optimizer step's forward + backward over grad_accum micro-batches (data order from
  // the seed; step is 1-based). MODE_LSP: writes the summed S of every matrix into its grad
  // slot. MODE_NATIVE: also runs AdamW with `lr`. A non-finite loss or S sets nonfinite and
  // leaves slots and weights untouched.
  absl::StatusOr<lspo::v1::TrainStepReply> TrainStep(const std::string& job_id, int step,
                                                     double lr);

  // W += P D Q^T for each listed matrix from its step slot (MODE_LSP).
  // Errors: kInvalidArgument (bad index), kDataLoss (non-finite D: weights untouched).
  absl::StatusOr<lspo::v1::ApplyReply> ApplyUpdates(const std::string& job_id, int step,
                                                    const lspo::v1::ApplyRequest& request);

  // Classification: accuracy of the greedy first answer token (decoded, trimmed, lower-cased,
  // compared with the label's first token) and mean answer-token loss (nats) over the
  // eval set. Text: mean token loss (accuracy 0).
  absl::StatusOr<lspo::v1::EvalMetrics> Evaluate(const std::string& job_id, int step);

  // Writes config.json and the tokenizer files into `dir` (and model.safetensors from the
  // worker's weights in MODE_NATIVE). Errors: kPermissionDenied/kInternal on I/O.
  absl::StatusOr<lspo::v1::SaveReply> SaveArtifacts(const std::string& job_id,
                                                    const std::string& dir);

  // Frees the job and removes its arena. Unknown ids are ignored.
  absl::Status UnloadJob(const std::string& job_id);

 private:
  absl::StatusOr<WorkerJob*> Find(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::unique_ptr<WorkerJob> job_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_WORKER_CORE_H_
