// Shapes as in offload/overlap_reducer.h.
#include "offload/overlap_reducer.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lspo::offload {
namespace {

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

OverlapReducer::OverlapReducer(Collective* group, std::vector<std::vector<int64_t>> shapes,
                               Publish publish, Buckets caps)
    : group_(group),
      shapes_(std::move(shapes)),
      publish_(std::move(publish)),
      bucket_of_(shapes_.size()),
      offset_of_(shapes_.size()),
      claimed_(shapes_.size(), 0) {
  // Buckets in reduction order (n - 1 down to 0); one closes once it holds its cap.
  int64_t elements = 0;
  for (int64_t i = static_cast<int64_t>(shapes_.size()) - 1; i >= 0; --i) {
    const int64_t cap = buckets_.size() <= 1 ? caps.first_bytes : caps.bytes;
    if (buckets_.empty() || elements * 4 >= cap) {
      if (!buckets_.empty()) {
        buffers_.push_back(at::empty({elements}, at::TensorOptions().dtype(at::kFloat)));
      }
      buckets_.emplace_back();
      elements = 0;
    }
    bucket_of_[i] = static_cast<int64_t>(buckets_.size()) - 1;
    offset_of_[i] = elements;
    buckets_.back().push_back(i);
    elements += Elements(shapes_[i]);
  }
  if (!buckets_.empty()) {
    buffers_.push_back(at::empty({elements}, at::TensorOptions().dtype(at::kFloat)));
  }
  ready_.assign(buckets_.size(), 0);
  thread_ = std::thread([this] { Run(); });
}

OverlapReducer::~OverlapReducer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) abandoned_ = true;
  }
  staged_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

at::Tensor OverlapReducer::Slot(int64_t i) const {
  return buffers_[bucket_of_[i]].narrow(0, offset_of_[i], Elements(shapes_[i])).view(shapes_[i]);
}

void OverlapReducer::Stage(int64_t i, const at::Tensor& grad) {
  const int64_t n = static_cast<int64_t>(shapes_.size());
  if (i < 0 || i >= n || grad.sizes() != at::IntArrayRef(shapes_[i])) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stage_error_.ok()) {
      stage_error_ = absl::InvalidArgumentError(
          absl::StrCat("OverlapReducer: matrix ", i, " staged with shape [",
                       absl::StrJoin(grad.sizes(), ", "), "]; expected ",
                       i >= 0 && i < n ? absl::StrCat("[", absl::StrJoin(shapes_[i], ", "), "]")
                                       : absl::StrCat("a matrix in [0, ", n, ")")));
    }
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (claimed_[i]) return;  // A backward forms each matrix once: keep the first.
    claimed_[i] = 1;
  }
  // The copy happens outside the lock: the thread may be reducing an earlier bucket meanwhile.
  // This slot is not read before its bucket is complete, and nothing else writes it.
  Slot(i).copy_(grad);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++ready_[bucket_of_[i]];
  }
  staged_cv_.notify_all();
}

absl::Status OverlapReducer::Finish(float fill) {
  std::vector<int64_t> unclaimed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < shapes_.size(); ++i) {
      if (!claimed_[i]) {
        claimed_[i] = 1;
        unclaimed.push_back(static_cast<int64_t>(i));
      }
    }
  }
  for (int64_t i : unclaimed) Slot(i).fill_(fill);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t i : unclaimed) ++ready_[bucket_of_[i]];
    finished_ = true;
  }
  staged_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return status_;
  return stage_error_;
}

int64_t OverlapReducer::published() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_;
}

double OverlapReducer::collective_seconds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return collective_seconds_;
}

void OverlapReducer::Run() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const int64_t size = static_cast<int64_t>(buckets_[b].size());
    {
      std::unique_lock<std::mutex> lock(mu_);
      staged_cv_.wait(lock, [&] { return abandoned_ || ready_[b] == size; });
      if (abandoned_) return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = group_->AllReduceSum(buffers_[b]);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    {
      std::lock_guard<std::mutex> lock(mu_);
      collective_seconds_ += secs;
      if (!st.ok()) {
        status_ = std::move(st);
        return;
      }
    }
    for (int64_t i : buckets_[b]) {
      const bool go_on = publish_(i, Slot(i));
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++published_;
      }
      if (!go_on) return;
    }
    buffers_[b] = at::Tensor();  // Every matrix of it is handed on: free the buffer.
  }
}

}  // namespace lspo::offload
