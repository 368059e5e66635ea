// How a training mode turns a step's gradients into new weights on the worker: one
// UpdatePath per JobSpec.mode, chosen once at LoadJob (MakeUpdatePath) and called by the
// mode-independent parts of the worker (WorkerCore's LoadJob / TrainStep / ApplyUpdates, the
// layer hooks, checkpoint state). Internal to gpu_worker/.
//
// The modes (docs/architecture.md "Training modes"):
//   native  (native_path.cc)  LibTorch AdamW on the worker; no arena, no optimizer service.
//   lsp     (lsp_path.cc)     S = P^T G Q offloaded, W <- (1 - lr wd) W + P D Q^T applied.
//   zero    (zero_path.cc)    the full bf16 gradient offloaded, the bf16 parameters copied back.
//   lora    (lora_path.cc)    LoRA adapters (baselines/lora.h) trained with AdamW on the worker.
//   galore  (galore_path.cc)  GaLore's projected AdamW (baselines/galore.h) on the worker;
//           with galore.offload (galore_offload_path.cc) GaLore-Offload: the projected
//           gradient offloaded like lsp's S, GaLore's Adam on the optimizer service.
// lsp and zero share the arena mechanics (publish, wait, apply; serial and overlap schedules)
// in OffloadPath (offload_path.h). A new mode is one file and one line in update_path.cc.
//
// Thread-safety: called under WorkerCore's mutex, like the WorkerJob it works on.
#ifndef LSPO_GPU_WORKER_UPDATE_PATH_H_
#define LSPO_GPU_WORKER_UPDATE_PATH_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "model/safetensors.h"
#include "offload/state_file.h"
#include "proto/job_spec.pb.h"
#include "proto/peer.pb.h"
#include "proto/worker.pb.h"

namespace lspo::offload {
class Collective;
}  // namespace lspo::offload

namespace lspo::worker {

struct WorkerJob;

// What FinishStep needs of the step being trained.
struct StepContext {
  uint32_t step = 0;        // 1-based.
  double lr = 0;            // This step's learning rate (after warm-up / decay).
  bool overlap = false;     // StepPlan.overlap: the update overlaps the next forward.
  int64_t split_layer = 0;  // Overlap: layers >= split are applied before TrainStep returns.
  // Data parallel (distributed.world_size > 1): the group whose ranks' gradients the update
  // sums first (every mode but GaLore-Offload); null for one rank.
  offload::Collective* collective = nullptr;
};

// One training mode's update of the trainable matrices (interface; see the file comment).
class UpdatePath {
 public:
  virtual ~UpdatePath() = default;

  // The mode's name as written in checkpoint metadata: "native", "lsp", "zero", "lora" or
  // "galore".
  virtual const char* name() const = 0;

  // True for modes whose update is computed by the optimizer service through the arena
  // (then `job->plane.arena`, `job->plane.layout` and `job->plane.flags` exist and ApplyUpdate
  // works).
  virtual bool offloaded() const = 0;

  // Sets the mode up at LoadJob, after the model, its device and `job->linears` are in place:
  // the linear mode, gradient sinks or hooks, the arena (offloaded modes: copied into
  // reply->arena) or the local optimizer. Errors: kInvalidArgument (spec fields that do not
  // fit the model, naming the field), arena and LibTorch errors.
  virtual absl::Status Setup(WorkerJob* job, lspo::v1::LoadJobReply* reply) = 0;

  // Numbers the mode trains (LoadJobReply.trainable_parameters), after Setup. Default: every
  // element of the trainable linears (sum of m n).
  virtual int64_t TrainableParameters(const WorkerJob& job) const;

  // LoadJobReply's optimizer_state_bytes (what the worker holds) and offload_bytes_per_step
  // (see proto/peer.proto), after Setup. Defaults: 0 and 0.
  virtual int64_t OptimizerStateBytes(const WorkerJob& job) const { return 0; }
  virtual int64_t OffloadBytesPerStep(const WorkerJob& job) const { return 0; }

  // Non-offloaded modes: the tensors SaveArtifacts writes as the output's model.safetensors
  // (LlamaModel::NamedTensors names and order). Default: the worker's own (aliases); lora:
  // copies with the adapters merged.
  virtual offload::NamedTensors ExportedTensors(WorkerJob* job);

  // Files of the mode's own in the output folder `dir` beside the model (lora: the PEFT
  // adapter folder `dir`/adapter). Returns their paths. Errors: file errors naming the path.
  // Default: none, and the PEFT adapter files a lora job left in `dir` are removed, so that a
  // reused output folder holds no adapter of another model.
  virtual absl::StatusOr<std::vector<std::string>> WriteArtifacts(WorkerJob* job,
                                                                  const std::string& dir);

  // kFailedPrecondition when no step can run yet (lsp: before the first FitProjectors).
  virtual absl::Status CheckReady(const WorkerJob& job) const { return absl::OkStatus(); }

  // Zeroes the step's gradient accumulators, before its first micro-batch.
  virtual void ZeroGrads(WorkerJob* job) = 0;

  // After the step's last backward: the update. Offloaded modes publish the gradients and,
  // under the overlap schedule, apply the deep layers' updates; native runs AdamW. Sets
  // reply->nonfinite (and returns OK) when a gradient is non-finite or missing: the step is
  // skipped, the weights untouched. Errors: a pending update's kDeadlineExceeded / kDataLoss.
  virtual absl::Status FinishStep(WorkerJob* job, const StepContext& ctx,
                                  lspo::v1::TrainStepReply* reply) = 0;

  // Data parallel under the overlap schedule (offloaded modes, CPU workers): BeginRankSum,
  // before the backward that publishes `step`'s gradients, starts summing them across the
  // ranks of `group` as the backward publishes them (offload::OverlapReducer: fp32
  // all-reduces of DDP-sized buckets in a fixed order, each sum published as soon as its
  // bucket is reduced, and checked); EndRankSum, after that backward (or instead of it, on a rank
  // with no valid gradient), sends NaN for every matrix the backward did not publish, so that every
  // rank skips the step together, and waits for the last sum. A non-finite sum sets
  // job->progress.publish_failed on every rank alike. Errors: kFailedPrecondition (a mode that is
  // not offloaded, a CUDA worker), the collectives' (kUnavailable naming the ranks).
  virtual absl::Status BeginRankSum(WorkerJob* job, offload::Collective* group, uint32_t step) {
    return absl::FailedPreconditionError(
        absl::StrCat("mode ", name(), " sums its gradients after the backward"));
  }
  virtual absl::Status EndRankSum(WorkerJob* job) { return absl::OkStatus(); }

  // The weight-decay factor the worker applies with step `lr`'s update: 1 - lr * wd where the
  // worker owns the weights' decay (lsp), 1 where the optimizer already applied it.
  virtual double WorkerDecay(const lspo::v1::JobSpec& spec, double lr) const { return 1.0; }

  // ApplyUpdates' check of linear i's published update before anything is applied.
  // Errors: kDataLoss (the update is not finite).
  virtual absl::Status CheckUpdate(WorkerJob* job, int64_t i, uint32_t step) {
    return absl::OkStatus();
  }

  // Waits for linear i's update of `step` and applies it with weight-decay factor `decay`.
  // Errors: kFailedPrecondition (the mode has no offloaded updates), kDeadlineExceeded
  // (the optimizer did not publish it), kDataLoss (a non-finite update; weights untouched).
  virtual absl::Status ApplyUpdate(WorkerJob* job, int64_t i, uint32_t step, double decay);

  // Checkpoint: adds the mode's tensors of linear i (named after `job->linears[i].name`) and
  // its metadata keys to worker_state.safetensors, and writes any file of its own into `dir`
  // (listed in reply->files). Errors: file errors.
  virtual absl::Status SaveState(WorkerJob* job, const std::string& dir,
                                 offload::NamedTensors* tensors,
                                 std::map<std::string, std::string>* metadata,
                                 lspo::v1::StateReply* reply) {
    return absl::OkStatus();
  }

  // Restore: reads and validates the mode's part of the state in `file` (named `what` in
  // messages) and of `dir`, changing nothing; returns the commit that installs it, run once
  // every part of the state is valid. Errors: kNotFound, kDataLoss (naming the tensor).
  using Commit = std::function<absl::Status()>;
  virtual absl::StatusOr<Commit> ReadState(WorkerJob* job, const model::SafetensorsFile& file,
                                           const std::string& what, const std::string& dir) {
    return Commit([] { return absl::OkStatus(); });
  }
};

// The update path of the job's mode (spec.mode; for MODE_GALORE also galore.offload).
// Errors: kInvalidArgument for a mode with no implementation.
absl::StatusOr<std::unique_ptr<UpdatePath>> MakeUpdatePath(const lspo::v1::JobSpec& spec);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_UPDATE_PATH_H_
