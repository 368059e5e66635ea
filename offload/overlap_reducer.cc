#include "offload/overlap_reducer.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lspo::offload {

OverlapReducer::OverlapReducer(Collective* group, std::vector<std::vector<int64_t>> shapes,
                               Publish publish)
    : group_(group),
      shapes_(std::move(shapes)),
      publish_(std::move(publish)),
      staged_(shapes_.size()) {
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
  // The copy happens outside the lock: the thread may be reducing another matrix meanwhile.
  at::Tensor copy = at::empty(shapes_[i], at::TensorOptions().dtype(at::kFloat));
  copy.copy_(grad);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (staged_[i].defined()) return;
    staged_[i] = std::move(copy);
  }
  staged_cv_.notify_all();
}

absl::Status OverlapReducer::Finish(float fill) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < shapes_.size(); ++i) {
      if (!staged_[i].defined()) {
        staged_[i] = at::full(shapes_[i], fill, at::TensorOptions().dtype(at::kFloat));
      }
    }
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
  for (int64_t i = static_cast<int64_t>(shapes_.size()) - 1; i >= 0; --i) {
    at::Tensor sum;
    {
      std::unique_lock<std::mutex> lock(mu_);
      staged_cv_.wait(lock, [&] { return abandoned_ || staged_[i].defined(); });
      if (abandoned_) return;
      sum = staged_[i];
    }
    const auto t0 = std::chrono::steady_clock::now();
    absl::Status st = group_->AllReduceSum(sum);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      collective_seconds_ += secs;
      status_ = std::move(st);
      return;
    }
    const bool go_on = publish_(i, sum);
    {
      std::lock_guard<std::mutex> lock(mu_);
      collective_seconds_ += secs;
      ++published_;
      staged_[i] = at::Tensor();  // Free the copy once handed on.
    }
    if (!go_on) return;
  }
}

}  // namespace lspo::offload
