// The helpers of worker_job.h: timeline events, the overlap schedule's pending updates, token
// text and the host-to-device copies of a batch.
#include "gpu_worker/worker_job.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

using runtime::MonotonicSeconds;

void AddEvent(WorkerJob* job, int64_t layer, const char* what, double start, double end) {
  lspo::v1::LayerEvent e;
  e.set_layer(static_cast<int32_t>(layer));
  e.set_what(what);
  e.set_start(start);
  e.set_end(end);
  e.set_actor("worker");
  job->times.events.push_back(std::move(e));
}

absl::Status ApplyPending(WorkerJob* job, int64_t layer) {
  const int64_t lo = layer < 0 ? 0 : layer * model::kLinearsPerLayer;
  const int64_t hi = layer < 0 ? static_cast<int64_t>(job->plane.pending_step.size())
                               : lo + model::kLinearsPerLayer;
  const double t0 = MonotonicSeconds(), waited0 = job->times.wait_seconds;
  bool any = false;
  for (int64_t i = lo; i < hi; ++i) {
    if (job->plane.pending_step[i] == 0) continue;
    any = true;
    RETURN_IF_ERROR(
        job->path->ApplyUpdate(job, i, job->plane.pending_step[i], job->plane.pending_decay[i]));
    job->plane.pending_step[i] = 0;
  }
  if (any && layer >= 0) {
    const double waited = job->times.wait_seconds - waited0;
    if (waited > 0) AddEvent(job, layer, "wait", t0, t0 + waited);
    AddEvent(job, layer, "apply", t0 + waited, MonotonicSeconds());
  }
  return absl::OkStatus();
}

std::string NormalizedToken(const model::BpeTokenizer& tok, int64_t id) {
  const int32_t one = static_cast<int32_t>(id);
  return absl::AsciiStrToLower(
      absl::StripAsciiWhitespace(tok.Decode(absl::MakeConstSpan(&one, 1))));
}

at::Tensor ToTensor(const std::vector<int64_t>& v, int64_t rows, int64_t cols,
                    const at::Device& device) {
  // (rows, cols) int64, views v
  at::Tensor t = at::from_blob(const_cast<int64_t*>(v.data()), {rows, cols},
                               at::TensorOptions().dtype(at::kLong));
  // Device: through pinned memory, asynchronously (a pageable copy would wait for the queue).
  return device.is_cpu() ? t.clone() : t.pin_memory().to(device, /*non_blocking=*/true);
}

model::RowLayout LayoutOf(const data::Batch& batch, const at::Device& device) {
  model::RowLayout layout;
  if (!batch.packed()) return layout;
  layout.positions = ToTensor(batch.positions, batch.batch_size, batch.seq_len, device);
  layout.segment_ids = ToTensor(batch.segment_ids, batch.batch_size, batch.seq_len, device);
  return layout;
}

}  // namespace lspo::worker
