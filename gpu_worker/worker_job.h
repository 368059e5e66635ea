// The state the worker holds for its one job, shared by the worker core and the files that
// run parts of a job (calibration.h, evaluator.h, worker_state.h). Internal to gpu_worker/.
//
// Thread-safety: a WorkerJob is used under WorkerCore's mutex; the fields the CUDA watcher
// thread touches are atomic (progress.publish_failed) or owned by DeviceOffload. While a
// data-parallel overlapped backward runs, the reducer's thread publishes the sums
// (PublishHostGradient: progress.publish_failed and the offload fields of `times`, which the
// backward's thread leaves alone then); they are read after EndRankSum has joined it.
#ifndef LSPO_GPU_WORKER_WORKER_JOB_H_
#define LSPO_GPU_WORKER_WORKER_JOB_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "data/datasets.h"
#include "gpu_worker/device_offload.h"
#include "gpu_worker/update_path.h"
#include "model/llama.h"
#include "offload/arena_layout.h"
#include "offload/collective.h"
#include "offload/overlap_reducer.h"
#include "proto/arena.pb.h"
#include "proto/job_spec.pb.h"
#include "proto/metrics.pb.h"
#include "runtime/completion_flags.h"
#include "runtime/shm_arena.h"
#include "tbb/global_control.h"
#include "text/tokenizer.h"

namespace lspo::worker {

using lspo::v1::JobSpec;

// The job's data, loaded once by job_loading.cc (LoadJobData) and read-only afterwards: the
// step runner batches `train`, the evaluator scores `eval` / `generate` / `ppl_blocks`,
// calibration draws from `train`.
struct JobData {
  bool classification = true;  // data.task: classification (else generative / LM).
  std::unique_ptr<model::BpeTokenizer> tokenizer;
  std::vector<data::TokenizedExample> train;
  std::vector<int32_t> train_class;  // Classification: label id per training example.
  std::vector<data::TokenizedExample> eval;
  // eval.metric generative: the evaluation examples untruncated (the answers generation is
  // scored against), at most eval.max_generate_examples.
  std::vector<data::TokenizedExample> generate;
  lspo::v1::DataSummary train_summary;  // What loading the data did (LoadJobReply.train_data).
  lspo::v1::DataSummary eval_summary;   // LoadJobReply.eval_data.
  std::vector<std::vector<int32_t>> ppl_blocks;  // data.perplexity_path, seq_len tokens each.
};

// The offload plane of an offloaded mode (UpdatePath::offloaded()): built by the mode's
// Setup (offload_path.cc), used by OffloadPath and ApplyPending; empty for the other modes.
struct OffloadPlane {
  // The shared-memory arena, its layout (copied into LoadJobReply.arena) and its flags.
  runtime::ShmArena arena;
  lspo::v1::ArenaLayout layout;
  runtime::CompletionFlags flags;
  // CUDA only: the transfer engine (streams, pinned arena, watcher) that moves gradients and
  // steps asynchronously. Declared after `arena`: destroyed (unpinned) first.
  std::unique_ptr<DeviceOffload> engine;
  // Per linear (overlap schedule): the step whose update must still be applied before the
  // linear's next forward (0 = none), and the weight-decay factor 1 - lr * wd of that step.
  std::vector<uint32_t> pending_step;
  std::vector<double> pending_decay;
};

// Where the step in progress is, owned by the step runner (step_runner.cc) and read by the
// layer hooks and update paths it calls.
struct StepProgress {
  // The step TrainStep is running (1-based; 0 before the first), set before ZeroGrads.
  uint32_t step = 0;
  // The step the scheduler abandoned (AbortStep: a cancel or a failed peer), 0 = none: the
  // layer hooks stop the forward or backward of that step at the next layer boundary
  // (kCancelled). Shared with the core's StepAborter, which sets it from an RPC thread.
  std::shared_ptr<std::atomic<uint32_t>> stop_step = std::make_shared<std::atomic<uint32_t>>(0);
  // While > 0: the step whose gradients the backward publishes as they are formed (overlap
  // schedule, last micro-batch only).
  uint32_t publish_step = 0;
  // A published gradient was non-finite (step abandoned). Set by the CUDA watcher thread and
  // the data-parallel reducer's thread too.
  std::atomic<bool> publish_failed{false};
  // The peaks (GPU allocator, process VmHWM) are reset once, at the first step (after the fit).
  bool peak_reset = false;
  // The data order of epoch `order_epoch` (indices into JobData::train), cached.
  int64_t order_epoch = -1;
  std::vector<int64_t> order;
};

// The current step's timings (seconds, runtime::MonotonicSeconds), reset by the step runner
// at each step and reported in TrainStepReply; filled by the layer hooks and OffloadPath.
struct StepTimes {
  double offload_seconds = 0;                // Writing gradients into the arena.
  std::vector<double> offload_done;          // Per layer: time its last gradient was published.
  std::vector<double> offload_secs;          // Per layer: seconds spent publishing its gradients.
  std::vector<lspo::v1::LayerEvent> events;  // Timeline of the current step.
  double layer_t0 = 0;                       // Start of the current layer's forward / backward.
  double wait_seconds = 0;                   // Waiting for the optimizer's steps.
  // Data-parallel sums inside the backward (EndRankSum): seconds the backward's thread waited
  // for the last ones, and seconds the reducer's thread spent in all-reduces.
  double rank_sum_wait_seconds = 0;
  double rank_sum_hidden_seconds = 0;
};

// Fault injection for the fault tests (WorkerOptions::faults), parsed by job_loading.cc and
// read by the step runner and OffloadPath. Empty in normal operation.
struct FaultPlan {
  // "3,4": at these steps the backward is seeded with NaN, so every gradient is non-finite
  // and the real detection / skip / abort path runs.
  std::set<int> nonfinite_grad_steps;
  // "3:5": at step 3 only linear 5's gradient is made non-finite as it is published (issue
  // 43: a skipped step is all or nothing even when the optimizer already took the other
  // matrices' steps). Pairs (step, linear index).
  std::set<std::pair<int, int64_t>> nonfinite_linear;
  // Loss steps "3": at these steps the loss is reported non-finite after the last backward
  // with every gradient finite, as a CUDA worker learns of a non-finite loss only once the
  // overlapped optimizer has taken the step.
  std::set<int> nonfinite_loss_steps;
};

// The job's group of ranks (distributed.world_size > 1; docs/distributed.md), owned by
// rank_group.cc (the group) and the update path (the reducer); both null for one rank.
struct RankState {
  std::unique_ptr<offload::Collective> collective;
  // While the overlapped backward of a data-parallel step runs: the sum of its gradients
  // across the ranks (UpdatePath::BeginRankSum / EndRankSum). Declared after `collective`:
  // destroyed (its thread joined) before the collective it calls.
  std::unique_ptr<offload::OverlapReducer> reducer;
};

// Everything the worker holds for its one job: what LoadJob sets once (id, spec, device,
// model, linears, path) and one part per component that owns it (above).
struct WorkerJob {
  // The CUDA engine first: it drains its watcher thread, whose callbacks use `progress` and
  // `times`, and unpins the arena before the arena is unmapped.
  ~WorkerJob() { plane.engine.reset(); }

  std::string id;
  JobSpec spec;
  // Caps oneTBB (the CPU kernels: Adam, sparse projector loops) at JobSpec.num_threads for the
  // job's lifetime, like at::set_num_threads does for ATen (docs/known-failures.md #16).
  std::unique_ptr<tbb::global_control> tbb_threads;
  // Where the model lives.
  at::Device device{at::kCPU};
  bool cuda = false;
  std::unique_ptr<model::LlamaModel> model;
  std::vector<offload::LinearShape> linears;  // The trainable linears, in update order.
  JobData data;
  OffloadPlane plane;
  StepProgress progress;
  StepTimes times;
  FaultPlan faults;
  // How the mode turns gradients into new weights (update_path.h); never null once loaded.
  // Declared after the parts it reads, before `ranks` whose reducer calls it.
  std::unique_ptr<UpdatePath> path;
  // Declared last: the reducer's thread is joined before the path and the parts it writes go.
  RankState ranks;
};

// Appends the worker's timeline event `what` ("forward", "apply", ...) of decoder layer
// `layer`, from `start` to `end` (runtime::MonotonicSeconds), to job->times.events.
void AddEvent(WorkerJob* job, int64_t layer, const char* what, double start, double end);

// Applies every pending update of decoder layer `layer` (all layers when layer < 0): the
// overlap schedule's deferred updates (UpdatePath::ApplyUpdate), recorded as timeline events
// for a single layer.
// Errors: kDeadlineExceeded (the optimizer did not publish the step), kDataLoss (bad slot).
absl::Status ApplyPending(WorkerJob* job, int64_t layer);

// A token's text, trimmed of white space and lower-cased (for answer matching).
std::string NormalizedToken(const model::BpeTokenizer& tok, int64_t id);

// v (rows * cols int64, row-major) as a (rows, cols) int64 tensor on `device` (CUDA: through
// pinned memory, non-blocking).
at::Tensor ToTensor(const std::vector<int64_t>& v, int64_t rows, int64_t cols,
                    const at::Device& device);

// The model's RowLayout of a micro-batch: positions and segment ids (B, T) int64 on `device`
// when the batch holds packed rows (data.packing), else undefined (one sequence per row).
// B = batch.batch_size rows, T = batch.seq_len tokens per row.
model::RowLayout LayoutOf(const data::Batch& batch, const at::Device& device);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_WORKER_JOB_H_
