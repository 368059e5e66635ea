// Shapes as in gpu_worker/device_offload.h.
#include "gpu_worker/device_offload.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"

#if LSPO_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace lspo::worker {
absl::StatusOr<std::unique_ptr<DeviceOffload>> DeviceOffload::Create(void* arena_base,
                                                                     size_t arena_bytes,
                                                                     size_t max_upload_bytes,
                                                                     const at::Device& device) {
  if (!device.is_cuda()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceOffload needs a CUDA device, got ", device.str()));
  }
  if (runtime::cuda::DeviceCount() == 0) {
    return absl::FailedPreconditionError(
        "no CUDA device visible to the worker's transfer engine (lsp/cuda/device_runtime)");
  }
  std::unique_ptr<DeviceOffload> self(new DeviceOffload());
  self->device_ = device;
  auto pinned = runtime::cuda::HostRegistration::Register(arena_base, arena_bytes);
  if (!pinned.ok()) {
    return absl::Status(
        pinned.status().code(),
        absl::StrCat("pinning the ", arena_bytes, "-byte arena: ", pinned.status().message(),
                     " (raise the worker's memlock limit: LimitMEMLOCK=infinity "
                     "in the unit, ulimit -l unlimited, or docker --ulimit "
                     "memlock=-1)"));
  }
  self->pinned_ = std::move(*pinned);
  self->flags_host_.assign(kMaxInFlight, 0);
  ASSIGN_OR_RETURN(self->flags_pinned_, runtime::cuda::HostRegistration::Register(
                                            self->flags_host_.data(), self->flags_host_.size()));
  ASSIGN_OR_RETURN(self->d2h_, runtime::cuda::Stream::CreateNonBlocking());
  ASSIGN_OR_RETURN(self->h2d_, runtime::cuda::Stream::CreateNonBlocking());
  self->slot_bytes_ = std::max<size_t>(max_upload_bytes, 256);
  try {
    for (int k = 0; k < kStagingSlots; ++k) {
      self->staging_.push_back(at::empty({static_cast<int64_t>(self->slot_bytes_)},
                                         at::TensorOptions().dtype(at::kByte).device(device)));
      ASSIGN_OR_RETURN(runtime::cuda::Event e, runtime::cuda::Event::Create());
      self->staging_free_.push_back(std::move(e));
      self->staging_used_.push_back(false);
    }
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("allocating ", kStagingSlots, " upload staging buffers of ", self->slot_bytes_,
                     " bytes on ", device.str(), ": ", e.what_without_backtrace()));
  }
  DeviceOffload* raw = self.get();
  self->watcher_ = std::thread([raw] { raw->WatcherLoop(); });
  return self;
}

DeviceOffload::~DeviceOffload() {
  Drain();
  // Uploads may still read the arena (serial schedule: ApplyUpdates then an unload).
  if (d2h_.get() != nullptr) (void)d2h_.Synchronize();
  if (h2d_.get() != nullptr) (void)h2d_.Synchronize();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
  staging_.clear();
}

absl::StatusOr<std::shared_ptr<DeviceOffload::Span>> DeviceOffload::NewSpan(int64_t layer,
                                                                            const char* what,
                                                                            const char* actor) {
  auto span = std::make_shared<Span>();
  span->layer = layer;
  span->what = what;
  span->actor = actor;
  ASSIGN_OR_RETURN(span->begin, runtime::cuda::Event::Create());
  ASSIGN_OR_RETURN(span->end, runtime::cuda::Event::Create());
  return span;
}

absl::Status DeviceOffload::OffloadAsync(int64_t layer, at::Tensor src, void* dst,
                                         std::function<void(bool)> on_landed) {
  if (src.device() != device_ || !src.is_contiguous()) {
    return absl::InvalidArgumentError(
        absl::StrCat("OffloadAsync: source must be a contiguous ", device_.str(), " tensor"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (in_flight_ >= kMaxInFlight) {
      return absl::ResourceExhaustedError(
          absl::StrCat("OffloadAsync: ", kMaxInFlight, " copies already pending"));
    }
  }
  // The verdict is one reduction on the compute stream (no host wait), copied after the data.
  at::Tensor verdict = at::isfinite(src).all().to(at::kByte);  // () uint8 on the device
  const int flag = next_flag_;
  next_flag_ = (next_flag_ + 1) % kMaxInFlight;
  ASSIGN_OR_RETURN(auto span, NewSpan(layer, "d2h", "pcie"));
  span->bytes = static_cast<int64_t>(src.nbytes());
  ASSIGN_OR_RETURN(runtime::cuda::Event ready, runtime::cuda::Event::Create());
  auto landed = std::make_shared<runtime::cuda::Event>();
  ASSIGN_OR_RETURN(*landed, runtime::cuda::Event::Create(/*blocking_sync=*/true));
  // The d2h stream starts after the compute work that formed `src` and the verdict; the span
  // times the data copy alone (so bytes / seconds is the bandwidth while copying).
  RETURN_IF_ERROR(ready.Record(runtime::cuda::DefaultStream()));
  RETURN_IF_ERROR(runtime::cuda::StreamWaitEvent(d2h_.get(), ready));
  RETURN_IF_ERROR(span->begin.Record(d2h_.get()));
  RETURN_IF_ERROR(runtime::cuda::CopyAsync(dst, src.data_ptr(), src.nbytes(), d2h_.get()));
  RETURN_IF_ERROR(span->end.Record(d2h_.get()));
  RETURN_IF_ERROR(runtime::cuda::CopyAsync(&flags_host_[flag], verdict.data_ptr(), 1, d2h_.get()));
  RETURN_IF_ERROR(landed->Record(d2h_.get()));
  span->closed = true;
  absl::MutexLock lock(&mu_);
  spans_.push_back(span);
  queue_.push_back(Pending{span, std::move(landed), std::move(src), std::move(verdict), flag,
                           std::move(on_landed)});
  ++in_flight_;
  return absl::OkStatus();
}

void DeviceOffload::WatcherLoop() {
  for (;;) {
    Pending p;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](DeviceOffload* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stop_ || !self->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stop_ and nothing left.
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status st = p.landed->Synchronize();  // Sleeps (blocking-sync event), no spinning.
    if (!st.ok()) LOG(ERROR) << "worker: gradient copy to the arena failed: " << st;
    // The copies are done: the device memory may be reused.
    p.keepalive = at::Tensor();
    p.verdict = at::Tensor();
    const bool finite = st.ok() && flags_host_[p.flag] != 0;
    if (p.on_landed) p.on_landed(finite);
    absl::MutexLock lock(&mu_);
    --in_flight_;
  }
}

void DeviceOffload::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](DeviceOffload* self)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) { return self->in_flight_ == 0; },
      this));
}

absl::StatusOr<at::Tensor> DeviceOffload::UploadAsync(int64_t layer, const void* src, size_t bytes,
                                                      at::ScalarType dtype, at::IntArrayRef sizes) {
  if (bytes > slot_bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "UploadAsync: ", bytes, " bytes exceed the staging slot (", slot_bytes_, " bytes)"));
  }
  const int slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % kStagingSlots;
  // Reuse the slot only after the compute work that read it last is done.
  if (staging_used_[slot]) {
    RETURN_IF_ERROR(runtime::cuda::StreamWaitEvent(h2d_.get(), staging_free_[slot]));
  }
  ASSIGN_OR_RETURN(auto span, NewSpan(layer, "h2d", "pcie"));
  span->bytes = static_cast<int64_t>(bytes);
  RETURN_IF_ERROR(span->begin.Record(h2d_.get()));
  RETURN_IF_ERROR(runtime::cuda::CopyAsync(staging_[slot].data_ptr(), src, bytes, h2d_.get()));
  RETURN_IF_ERROR(span->end.Record(h2d_.get()));
  span->closed = true;
  // The compute stream waits for this copy only.
  RETURN_IF_ERROR(runtime::cuda::StreamWaitEvent(runtime::cuda::DefaultStream(), span->end));
  {
    absl::MutexLock lock(&mu_);
    spans_.push_back(span);
  }
  last_slot_ = slot;
  staging_used_[slot] = true;
  try {
    return staging_[slot].narrow(0, 0, static_cast<int64_t>(bytes)).view(dtype).view(sizes);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("UploadAsync: ", bytes,
                     " bytes do not form the requested shape: ", e.what_without_backtrace()));
  }
}

absl::Status DeviceOffload::ReleaseStaging() {
  if (last_slot_ < 0) return absl::OkStatus();
  RETURN_IF_ERROR(staging_free_[last_slot_].Record(runtime::cuda::DefaultStream()));
  last_slot_ = -1;
  return absl::OkStatus();
}

void DeviceOffload::MarkComputeBegin(int64_t layer, const std::string& what) {
  auto span = NewSpan(layer, "", "gpu");
  if (!span.ok() || !(*span)->begin.Record(runtime::cuda::DefaultStream()).ok()) return;
  (*span)->what = what;
  absl::MutexLock lock(&mu_);
  spans_.push_back(*std::move(span));
}

void DeviceOffload::MarkComputeEnd(int64_t layer, const std::string& what) {
  absl::MutexLock lock(&mu_);
  for (auto it = spans_.rbegin(); it != spans_.rend(); ++it) {
    Span& s = **it;
    if (!s.closed && s.layer == layer && s.what == what && s.actor == "gpu") {
      s.closed = s.end.Record(runtime::cuda::DefaultStream()).ok();
      return;
    }
  }
}

void DeviceOffload::BeginStep() {
  Drain();
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<Span>> keep;
  for (auto& s : spans_) {
    if (s->actor == "pcie") keep.push_back(std::move(s));
  }
  spans_.swap(keep);
}

absl::StatusOr<StepTransfers> DeviceOffload::EndStep(std::vector<lspo::v1::LayerEvent>* events) {
  ASSIGN_OR_RETURN(runtime::cuda::Event end, runtime::cuda::Event::Create());
  RETURN_IF_ERROR(end.Record(runtime::cuda::DefaultStream()));
  RETURN_IF_ERROR(end.Synchronize());
  const double host_end = runtime::MonotonicSeconds();
  Drain();
  StepTransfers totals;
  std::vector<std::shared_ptr<Span>> spans;
  {
    absl::MutexLock lock(&mu_);
    spans.swap(spans_);
  }
  for (const auto& s : spans) {
    if (!s->closed) continue;
    auto done = s->end.Done();
    if (!done.ok() || !*done) continue;  // e.g. a copy still in flight: not this step's.
    auto dur = s->end.SecondsSince(s->begin);
    if (!dur.ok()) continue;
    if (s->what == "d2h") {
      totals.d2h_bytes += s->bytes;
      totals.d2h_seconds += *dur;
    } else if (s->what == "h2d") {
      totals.h2d_bytes += s->bytes;
      totals.h2d_seconds += *dur;
    }
    if (events == nullptr) continue;
    // Both events precede `end` on the device clock; `end` completed at about host_end.
    auto to_end = end.SecondsSince(s->end);
    if (!to_end.ok()) continue;
    lspo::v1::LayerEvent e;
    e.set_layer(static_cast<int32_t>(s->layer));
    e.set_what(s->what);
    e.set_actor(s->actor);
    e.set_end(host_end - *to_end);
    e.set_start(host_end - *to_end - *dur);
    events->push_back(std::move(e));
  }
  return totals;
}

int64_t DeviceOffload::GpuMemoryUsedBytes() {
  auto info = runtime::cuda::GetMemoryInfo();
  return info.ok() ? static_cast<int64_t>(info->used_bytes()) : 0;
}

void DeviceOffload::ResetGpuPeak() {
#if LSPO_TORCH_CUDA
  try {
    c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  } catch (const c10::Error&) {
  }
#endif
}

absl::Status DeviceOffload::SetGpuMemoryLimit(int64_t limit_bytes) {
#if LSPO_TORCH_CUDA
  auto info = runtime::cuda::GetMemoryInfo();
  if (!info.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device_memory_limit_mb: cannot read the GPU's memory: ", info.status().message()));
  }
  const int64_t total = static_cast<int64_t>(info->total_bytes);
  if (total <= 0 || limit_bytes > total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec field device_memory_limit_mb = ", limit_bytes >> 20,
        " exceeds this GPU's memory (", total >> 20, " MiB): lower it or leave it 0 (no cap)"));
  }
  const double fraction =
      limit_bytes <= 0 ? 1.0 : static_cast<double>(limit_bytes) / static_cast<double>(total);
  try {
    try {
      c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, 0);
    } catch (const c10::Error&) {
      // The caching allocator exists only after CUDA's lazy initialisation: a pip LibTorch
      // 2.11 throws "Allocator not initialized for device" before the process's first CUDA
      // allocation (PyTorch's torch.cuda.set_per_process_memory_fraction calls _lazy_init()
      // first; seen on an H200, docs/gpu.md). One small allocation, under the default
      // fraction 1.0, initialises it (and caches one 2 MiB block); then set the fraction. Not
      // before the first try: a later job would allocate under the previous job's cap.
      (void)at::empty({1}, at::TensorOptions().device(at::kCUDA, 0));
      c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, 0);
    }
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("device_memory_limit_mb: setting the allocator's fraction failed: ",
                     e.what_without_backtrace()));
  }
  return absl::OkStatus();
#else
  if (limit_bytes <= 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "job spec field device_memory_limit_mb needs a CUDA LibTorch (docs/gpu.md)");
#endif
}

int64_t DeviceOffload::GpuPeakAllocatedBytes() {
#if LSPO_TORCH_CUDA
  try {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(0);
    return stats.allocated_bytes[0].peak;  // [0] = StatType::AGGREGATE
  } catch (const c10::Error&) {
    return 0;
  }
#else
  return 0;
#endif
}

}  // namespace lspo::worker
