// The GPU worker's core (no RPC): owns the model on its device, the job's data, the sparse
// projectors and the shared-memory arena; runs forward/backward with LSP compression, the
// projector fit, applies the optimizer's steps, evaluates and exports the tokenizer/config.
//
// Per trained weight matrix W (m x n, HF layout) in MODE_LSP (docs/method.md, "Math"):
//   forward keeps XQ = X Q (N x d); backward forms S = (dY P)^T (X Q) = P^T G Q (d x d fp32)
//   without ever forming G; S (summed over the step's micro-batches) goes to the arena's grad
//   slot; ApplyUpdates reads D (d x d) from the step slot and does W += P D Q^T.
// MODE_ZERO: the full gradient G (bf16) of every matrix goes to the arena; the optimizer
//   returns the updated parameters (bf16), copied into W.
// MODE_NATIVE: AdamW on the worker over the same trained matrices (no offload).
// Schedules (StepPlan): serial = all gradients published after the backward, updates
// applied by ApplyUpdates; overlap = each matrix's gradient published (arena slot + completion
// flag) during the backward as soon as its last micro-batch formed it, layers >= split_layer
// applied right after the backward, shallower layers just before their next forward
// (LlamaModel layer hooks), and any pending update flushed before Evaluate, FitProjectors,
// SaveArtifacts and ImportLayerWeights.
// Only the 7 linear weights of every decoder layer train; embeddings and norms stay frozen.
//
// Thread-safety: all methods may be called concurrently; calls are serialised per worker by
// an internal mutex (one job at a time).
#ifndef LSPO_GPU_WORKER_WORKER_CORE_H_
#define LSPO_GPU_WORKER_WORKER_CORE_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu_worker/worker_options.h"
#include "proto/job_spec.pb.h"
#include "proto/metrics.pb.h"
#include "proto/peer.pb.h"
#include "proto/worker.pb.h"
#include "runtime/allowed_roots.h"
#include "runtime/completion_flags.h"
#include "runtime/job_slot.h"

namespace lspo::worker {

struct WorkerJob;  // gpu_worker/worker_job.h (holds torch state).

class WorkerCore {
 public:
  // A worker without path restrictions.
  WorkerCore();
  // A worker set up by `options` (see WorkerOptions).
  explicit WorkerCore(WorkerOptions options);
  ~WorkerCore();

  // Loads the model (GGUF dequantised to fp32, or a seeded tiny random Llama), the tokenizer
  // and the data; in MODE_LSP validates d, r against every trained matrix and creates the
  // arena (mode 0600). Every path of `spec` (and the links among the entries of a folder it
  // names) is checked against the allowed roots first (offload::CheckJobSpecPaths), before
  // anything is opened or looked for, and before a stale job is replaced.
  // Errors: kPermissionDenied (a path outside the allowed roots, naming the field, the path
  // and the fix), kInvalidArgument (d >= min(m, n) of some matrix, naming it; bad data rows),
  // kNotFound (missing file), kDataLoss/kUnimplemented (bad model file), kFailedPrecondition
  // (another job is loaded).
  // `resume_candidates` (data parallel; issue 43): the steps this rank may resume from
  // (proto LoadJobRequest.resume_candidate_steps); after joining the group the
  // worker agrees with the other ranks on the newest step all hold
  // (offload::AgreeOnNewestCommonStep; one rank: the newest) and returns it in
  // agreed_resume_step; its errors (kFailedPrecondition: no step in common) fail the load.
  absl::StatusOr<lspo::v1::LoadJobReply> LoadJob(
      const std::string& job_id, const lspo::v1::JobSpec& spec,
      const std::vector<int>* resume_candidates = nullptr);

  // Calibration gradients (dense G of every trained matrix over lsp.calibration_examples
  // held-out training examples, lsp.calibration_layers_per_pass decoder layers per
  // forward + backward so peak memory stays bounded) then, per matrix, a projector fit
  // (lsp/fit.h; stops at lsp.fit_stop or lsp.fit_iters). At step 0 every matrix gets fresh
  // projectors; later only those whose relative bias exceeds lsp.alpha are re-drawn and
  // refitted (reply.refitted lists them). A non-finite G is logged and that matrix's check
  // skipped. New projectors are written to the arena.
  // Errors: kFailedPrecondition (no job / not MODE_LSP).
  absl::StatusOr<lspo::v1::FitProjectorsReply> FitProjectors(const std::string& job_id, int step);

  // One optimizer step's forward + backward over grad_accum micro-batches (data order from
  // the seed; step is 1-based), following `plan` (see the file comment). MODE_LSP: the summed
  // S (d, d) fp32 of every matrix goes to its grad slot; MODE_ZERO: the summed G (m, n) as
  // bf16. MODE_NATIVE: AdamW with `lr` (clipped to optim.max_grad_norm). A non-finite loss
  // or gradient sets nonfinite (and, overlapped, marks the step abandoned in the arena so the
  // optimizer stops waiting); no weight changes for that step. reply.events is the step's
  // per-layer timeline (forward, backward, offload, wait, apply; CLOCK_MONOTONIC seconds).
  // Errors: kDeadlineExceeded (an update never arrived: optimizer gone), kDataLoss
  // (non-finite D), kInternal (LibTorch).
  absl::StatusOr<lspo::v1::TrainStepReply> TrainStep(const std::string& job_id, int step, double lr,
                                                     const lspo::v1::StepPlan& plan);

  // Serial schedule: applies each listed matrix's update of `step`: MODE_LSP
  // W <- (1 - lr wd) W + P D Q^T from its step slot, MODE_ZERO W <- param slot.
  // Errors: kInvalidArgument (bad index), kFailedPrecondition (the optimizer has not
  // published that step), kDataLoss (non-finite D: weights untouched).
  absl::StatusOr<lspo::v1::ApplyReply> ApplyUpdates(const std::string& job_id, int step,
                                                    const lspo::v1::ApplyRequest& request);

  // Classification: accuracy of the greedy first answer token (decoded, trimmed, lower-cased,
  // compared with the label's first token) and mean answer-token loss (nats) over the
  // eval set. Text: mean token loss (accuracy 0).
  // `cancelled` (may be empty): polled between batches and generated answers; once true the
  // evaluation stops with kCancelled (gpu_worker/evaluator.h).
  absl::StatusOr<lspo::v1::EvalMetrics> Evaluate(const std::string& job_id, int step,
                                                 const std::function<bool()>& cancelled = {});

  // Writes config.json and the tokenizer files into `dir` (and model.safetensors from the
  // worker's weights in MODE_NATIVE). `dir` and the links among its entries are checked
  // against the allowed roots first (offload::CheckRequestFolder).
  // Errors: kPermissionDenied (`dir` outside the allowed roots, naming it; or I/O),
  // kInternal on I/O, kFailedPrecondition (no job).
  absl::StatusOr<lspo::v1::SaveReply> SaveArtifacts(const std::string& job_id,
                                                    const std::string& dir);

  // Master-weight refresh (MODE_LSP): copies decoder layer `request.layer`'s 7 matrices from
  // the arena staging region (fp32, linear order, written by the optimizer's
  // ExportLayerWeights) into the model (rounded to the stored dtype; compensated rounding
  // resets its residuals), after flushing pending updates. reply.max_abs_change
  // = max |W_worker - W_master| before the copy, max_abs_drift / max_drift_ulps the drift
  // beyond one rounding; `measure_only` skips the copy (drift report); `skip_measure` copies
  // without measuring (the rolling refresh: only this layer's pending updates are flushed, the
  // fp32 weights are converted on the host, reply all 0).
  // Errors: kInvalidArgument (bad layer; measure_only with skip_measure),
  // kFailedPrecondition (not MODE_LSP), kNotFound (no such job).
  absl::StatusOr<lspo::v1::LayerWeightsReply> ImportLayerWeights(
      const lspo::v1::LayerWeightsRequest& request);

  // Checkpoint (exact resume): flushes pending updates, then writes
  // `dir`/worker_state.safetensors: every trained matrix as stored (fp32 or bf16, HF names),
  // MODE_LSP the projectors (`<name>.p_index` (m, r) int32, `.p_value` (m, r) fp32, `.q_*`
  // (n, r)), metadata {job_id, mode, step}; MODE_NATIVE also `dir`/worker_adamw.pt (the AdamW
  // state, torch::save). The data order and every random draw derive from (seed, step), so
  // nothing else is needed. `dir` and the links among its entries are checked against the
  // allowed roots first (offload::CheckRequestFolder).
  // Errors: kPermissionDenied (outside the allowed roots, naming the request field and the
  // path), kFailedPrecondition (no job), I/O errors naming the file.
  absl::StatusOr<lspo::v1::StateReply> SaveState(const std::string& job_id, const std::string& dir,
                                                 int step);

  // Restores what SaveState wrote into the freshly loaded job (before any step): weights,
  // projectors (also into the arena and the model; the fit is then skipped), AdamW state.
  // `dir` and the links among its entries are checked against the allowed roots before
  // anything is opened. Errors: kPermissionDenied (outside the allowed roots, naming the
  // request field and the path), kNotFound (missing file/tensor), kDataLoss (other
  // shapes/dtypes, non-finite values, invalid projectors, a state of another mode or step),
  // each naming the file; the job's weights are unchanged unless every tensor was read.
  absl::StatusOr<lspo::v1::StateReply> LoadState(const std::string& job_id, const std::string& dir,
                                                 int step);

  // Marks `step` abandoned in the arena so that a TrainStep waiting for the optimizer's
  // updates of that step fails at once (kAborted) instead of waiting for its timeout; the
  // scheduler calls it when the optimizer's Update failed. Does not wait for the core's mutex.
  // kFailedPrecondition if `job_id` is not loaded.
  absl::Status AbortStep(const std::string& job_id, int step);

  // Frees the job and removes its arena. Unknown ids are ignored. A TrainStep or ApplyUpdates
  // of the job still waiting for the optimizer's updates (one a dead scheduler started: that
  // optimizer never got the step's Update) is first abandoned through the flags, so the
  // unload and a reload do not wait for the 10-minute peer timeout.
  absl::Status UnloadJob(const std::string& job_id);

 private:
  // The --allowed_roots (immutable: read without mu_).
  const runtime::AllowedRoots roots_;
  const bool skip_memory_check_ = false;
  const WorkerFaults faults_;
  absl::Mutex mu_;
  // The loaded job (under mu_), its flags for AbortStep and the step of the TrainStep /
  // ApplyUpdates in progress for UnloadJob (both without mu_): runtime/job_slot.h, the slot the
  // optimizer core shares. Only that step's updates can be missing: the previous step's were
  // all published before the scheduler started this one.
  runtime::JobSlot<WorkerJob> slot_;
};

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_WORKER_CORE_H_
