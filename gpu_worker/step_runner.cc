// One training step on the worker (step_runner.h). Shapes: B batch rows, T tokens per row.
#include "gpu_worker/step_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "gpu_worker/device_offload.h"
#include "gpu_worker/rank_group.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"

namespace lspo::worker {

using lspo::v1::JobSpec;
using runtime::MonotonicSeconds;

namespace {

// The layer hooks: a layer's pending update lands just before its forward (overlap
// schedule), and every layer's forward / backward goes into the step's timeline (and, on
// CUDA, the transfer engine's stream order).
// kCancelled when the scheduler abandoned the running step (WorkerJob::stop_step): the layer
// hooks stop the pass at layer `l`'s boundary.
absl::Status CheckStop(const WorkerJob* job, int64_t l, const char* where) {
  const uint32_t stop = job->progress.stop_step->load(std::memory_order_acquire);
  if (stop == 0 || stop != job->progress.step) return absl::OkStatus();
  return absl::CancelledError(absl::StrCat("step ", job->progress.step, " stopped ", where,
                                           " layer ", l,
                                           ": the scheduler abandoned it (AbortStep: a cancel "
                                           "or a failed peer)"));
}

}  // namespace

void InstallLayerHooks(WorkerJob* job) {
  job->model->SetLayerHooks(
      [job](int64_t l) -> absl::Status {
        RETURN_IF_ERROR(CheckStop(job, l, "before the forward of"));
        RETURN_IF_ERROR(ApplyPending(job, l));
        job->times.layer_t0 = MonotonicSeconds();
        if (job->plane.engine) job->plane.engine->MarkComputeBegin(l, "forward");
        return absl::OkStatus();
      },
      [job](int64_t l) -> absl::Status {
        AddEvent(job, l, "forward", job->times.layer_t0, MonotonicSeconds());
        if (job->plane.engine) job->plane.engine->MarkComputeEnd(l, "forward");
        return absl::OkStatus();
      },
      [job](int64_t l) -> absl::Status {
        RETURN_IF_ERROR(CheckStop(job, l, "after the backward of"));
        const double now = MonotonicSeconds();
        AddEvent(job, l, "backward", job->times.layer_t0, now);
        job->times.layer_t0 = now;
        if (job->plane.engine) {
          // Layer l's backward ends here and layer l - 1's begins (device stream order).
          job->plane.engine->MarkComputeEnd(l, "backward");
          if (l > 0) job->plane.engine->MarkComputeBegin(l - 1, "backward");
        }
        return absl::OkStatus();
      });
}

void BeginStepState(WorkerJob* job) {
  job->times.events.clear();
  job->times.wait_seconds = 0;
  job->times.offload_seconds = 0;
  job->times.rank_sum_wait_seconds = 0;
  job->times.rank_sum_hidden_seconds = 0;
  job->progress.publish_step = 0;
  job->progress.publish_failed = false;
  std::fill(job->times.offload_done.begin(), job->times.offload_done.end(), 0.0);
  std::fill(job->times.offload_secs.begin(), job->times.offload_secs.end(), 0.0);
  if (job->plane.engine) job->plane.engine->BeginStep();
  if (!job->progress.peak_reset) {
    // gpu_peak_allocated_bytes and worker_peak_rss_bytes then measure the training steps, not
    // the loading and the projector fit (the memory plan's subject, offload/memory_plan.h).
    if (job->cuda) DeviceOffload::ResetGpuPeak();
    runtime::ResetPeakRss();
    job->progress.peak_reset = true;
  }
}

absl::Status AfterRankZerosEvaluation(const WorkerJob& job, int step, absl::Status st) {
  const JobSpec& spec = job.spec;
  const bool evaluates = !job.data.eval.empty() || !spec.data().perplexity_path().empty();
  const bool after_eval = step == 1 ? !spec.skip_initial_eval()
                                    : spec.eval_every() > 0 && (step - 1) % spec.eval_every() == 0;
  if (job.ranks.collective == nullptr || job.ranks.collective->rank() == 0 || !evaluates ||
      !after_eval) {
    return st;
  }
  const int timeout = RankTimeoutSeconds(spec.distributed());
  return absl::Status(
      st.code(),
      absl::StrCat(st.message(), " [rank 0 evaluates alone before step ", step,
                   " while the other ranks wait here: if its evaluation takes longer than "
                   "distributed.timeout_seconds (",
                   timeout,
                   " s), raise that timeout or evaluate less (eval_every, "
                   "data.max_eval_examples, data.perplexity_blocks)]"));
}

std::vector<data::Batch> StepBatches(WorkerJob* job, int step, int64_t* total,
                                     int64_t* input_tokens, int64_t* padding_tokens) {
  const JobSpec& spec = job->spec;
  const bool balanced = spec.data().balance_classes() && !job->data.train_class.empty();
  // Epoch length: every example once, or (balanced) classes x largest class size.
  const int64_t n =
      balanced
          ? static_cast<int64_t>(data::BalancedOrder(job->data.train_class, spec.seed(), 0).size())
          : static_cast<int64_t>(job->data.train.size());
  const int64_t mb = spec.micro_batch_size(), accum = spec.grad_accum();
  const int64_t world = job->ranks.collective ? job->ranks.collective->world_size() : 1;
  const int64_t rank = job->ranks.collective ? job->ranks.collective->rank() : 0;
  std::vector<data::Batch> batches;
  for (int64_t a = 0; a < accum; ++a) {
    std::vector<const data::TokenizedExample*> rows;
    for (int64_t b = 0; b < mb; ++b) {
      // Data parallel: rank r takes examples r*mb .. r*mb+mb-1 of each world*mb block, so W
      // ranks at micro-batch mb see what one rank sees at W*mb (docs/distributed.md).
      const int64_t g = ((step - 1) * accum + a) * mb * world + rank * mb + b;
      const int64_t epoch = g / n;
      if (epoch != job->progress.order_epoch) {
        job->progress.order = balanced
                                  ? data::BalancedOrder(job->data.train_class, spec.seed(), epoch)
                                  : data::ShuffledOrder(n, spec.seed(), epoch);
        job->progress.order_epoch = epoch;
      }
      rows.push_back(&job->data.train[job->progress.order[g % n]]);
    }
    batches.push_back(data::MakeBatch(rows, job->data.tokenizer->pad_id()));
    *total += batches.back().num_loss_tokens;
    *input_tokens += batches.back().batch_size * batches.back().seq_len;
    *padding_tokens += batches.back().padding_tokens;
  }
  return batches;
}

absl::Status RunMicroBatches(WorkerJob* job, const std::vector<data::Batch>& batches, int64_t total,
                             int step, const lspo::v1::StepPlan& plan,
                             lspo::v1::TrainStepReply* reply) {
  auto& model = *job->model;
  const int64_t num_layers = model.config().num_layers;
  // The last micro-batch that carries loss tokens publishes (overlap schedule).
  int64_t last = -1;
  for (size_t k = 0; k < batches.size(); ++k) {
    if (batches[k].num_loss_tokens > 0) last = static_cast<int64_t>(k);
  }
  // Data parallel under the overlap schedule: the publishing backward's gradients are summed
  // across the ranks as they form (UpdatePath::BeginRankSum). Every rank must take part in
  // those all-reduces, so a rank that will not run that backward (a non-finite loss, no loss
  // token) sends NaN instead, and every rank skips the step.
  offload::Collective* group = job->ranks.collective.get();
  const bool rank_sum =
      job->path->offloaded() && plan.overlap() && group != nullptr && group->world_size() > 1;
  struct DropReducer {  // An error return abandons the sum (the other ranks then time out).
    WorkerJob* job;
    ~DropReducer() { job->ranks.reducer.reset(); }
  } drop_reducer{job};
  auto skip_with_the_ranks = [&]() -> absl::Status {
    if (rank_sum) {
      RETURN_IF_ERROR(job->path->BeginRankSum(job, group, static_cast<uint32_t>(step)));
      RETURN_IF_ERROR(job->path->EndRankSum(job));
    }
    reply->set_nonfinite(true);
    return absl::OkStatus();
  };
  if (last < 0 && rank_sum) return skip_with_the_ranks();
  double loss_sum = 0, fwd = 0, bwd = 0;
  // CUDA: the losses are summed on the device and read once after the last backward (a
  // per-micro-batch .item() would stall the host until each forward finished). A non-finite
  // loss then shows up as non-finite gradients, caught on their host copies.
  at::Tensor device_loss_sum;  // () fp64 on the device: sum of loss x targets
  for (int64_t k = 0; k < static_cast<int64_t>(batches.size()); ++k) {
    const auto& b = batches[k];
    const int64_t targets = b.num_loss_tokens;
    if (targets == 0) continue;
    auto t0 = std::chrono::steady_clock::now();
    // () fp32, the mean over the micro-batch's targets; ids and labels (B, T) int64.
    at::Tensor loss = model.CausalLmLoss(
        ToTensor(b.input_ids, b.batch_size, b.seq_len, job->device),
        ToTensor(b.labels, b.batch_size, b.seq_len, job->device), LayoutOf(b, job->device));
    // A failed layer hook (e.g. a pending update that timed out) keeps its status code.
    RETURN_IF_ERROR(model.HookStatus());
    fwd += runtime::SecondsSince(t0);
    if (job->cuda) {
      // () fp64
      at::Tensor weighted = loss.detach().to(at::kDouble) * static_cast<double>(targets);
      device_loss_sum = device_loss_sum.defined() ? device_loss_sum + weighted : weighted;
    } else {
      const double lv = loss.item<double>();
      if (!std::isfinite(lv)) return skip_with_the_ranks();
      loss_sum += lv * targets;
    }
    if (job->path->offloaded() && plan.overlap() && k == last) {
      job->progress.publish_step = static_cast<uint32_t>(step);
      if (rank_sum) {
        RETURN_IF_ERROR(job->path->BeginRankSum(job, group, static_cast<uint32_t>(step)));
      }
    }
    t0 = std::chrono::steady_clock::now();
    job->times.layer_t0 = MonotonicSeconds();
    double scale = static_cast<double>(targets) / total;
    if (job->faults.nonfinite_grad_steps.count(step)) {
      scale = std::numeric_limits<double>::quiet_NaN();  // Fault injection (tests).
    }
    if (job->plane.engine) job->plane.engine->MarkComputeBegin(num_layers - 1, "backward");
    (loss * scale).backward();
    RETURN_IF_ERROR(model.HookStatus());
    if (job->progress.publish_step > 0 && rank_sum) RETURN_IF_ERROR(job->path->EndRankSum(job));
    if (job->plane.engine) {
      job->plane.engine->MarkComputeEnd(0, "backward");
      // The step's gradients have been enqueued for offload: wait until every one has
      // landed and been checked (the host needs the verdict before applying anything).
      if (job->progress.publish_step > 0) job->plane.engine->Drain();
    }
    bwd += runtime::SecondsSince(t0);
    if (job->progress.publish_step > 0 && num_layers > 0) {
      // Layer 0's input needs no gradient, so no hook marked its end: the backward did.
      bool have0 = false;
      for (const auto& e : job->times.events) have0 |= e.what() == "backward" && e.layer() == 0;
      if (!have0) AddEvent(job, 0, "backward", job->times.layer_t0, MonotonicSeconds());
    }
    job->progress.publish_step = 0;
    if (job->progress.publish_failed) {
      reply->set_nonfinite(true);
      return absl::OkStatus();
    }
  }
  if (device_loss_sum.defined()) {
    loss_sum = device_loss_sum.item<double>();  // One host synchronisation per step.
  }
  if (job->faults.nonfinite_loss_steps.count(step)) {
    loss_sum = std::numeric_limits<double>::quiet_NaN();  // Fault injection (tests).
  }
  if (!std::isfinite(loss_sum)) {
    // CUDA (or the fault): the loss is read after the last backward, when the gradients are
    // published and an overlapped optimizer has taken the step; the missing verdict makes it
    // undo that step (TrainStep aborts the flags).
    reply->set_nonfinite(true);
    return absl::OkStatus();
  }
  auto* metrics = reply->mutable_metrics();
  metrics->set_loss(total > 0 ? loss_sum / total : 0.0);
  metrics->set_tokens(total);
  metrics->set_forward_seconds(fwd);
  metrics->set_backward_seconds(bwd);
  return absl::OkStatus();
}

absl::Status RecordStepEnd(WorkerJob* job, lspo::v1::StepMetrics* metrics) {
  for (int64_t l = 0; l < static_cast<int64_t>(job->times.offload_done.size()); ++l) {
    if (job->times.offload_done[l] > 0) {
      AddEvent(job, l, "offload", job->times.offload_done[l] - job->times.offload_secs[l],
               job->times.offload_done[l]);
    }
  }
  if (job->plane.engine) {
    std::vector<lspo::v1::LayerEvent> gpu_events;
    ASSIGN_OR_RETURN(StepTransfers tr, job->plane.engine->EndStep(&gpu_events));
    auto& phases = *metrics->mutable_device_phase_seconds();
    for (auto& e : gpu_events) {
      if (e.actor() == "gpu") phases[e.what()] += e.end() - e.start();
      job->times.events.push_back(std::move(e));
    }
    metrics->set_d2h_bytes(tr.d2h_bytes);
    metrics->set_d2h_seconds(tr.d2h_seconds);
    metrics->set_h2d_bytes(tr.h2d_bytes);
    metrics->set_h2d_seconds(tr.h2d_seconds);
  } else if (job->cuda) {
    torch::cuda::synchronize();  // Native mode: the step ends when the device is done.
  }
  if (job->cuda) {
    metrics->set_gpu_memory_used_bytes(DeviceOffload::GpuMemoryUsedBytes());
    metrics->set_gpu_peak_allocated_bytes(DeviceOffload::GpuPeakAllocatedBytes());
  }
  return absl::OkStatus();
}

}  // namespace lspo::worker
