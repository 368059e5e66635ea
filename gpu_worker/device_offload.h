// The worker's CUDA transfer engine (docs/method.md "Per-layer offload"; docs/architecture.md
// "Processes and planes"). Used only when the job runs on a CUDA device.
//
//   compute stream  = LibTorch's current stream (the legacy default stream: the worker never
//                     sets a stream guard) - forward, backward, compress, apply.
//   d2h stream      = non-blocking; per matrix: waits for an event recorded on the compute
//                     stream right after the gradient (S (d_p, d_q) fp32 or G (m, n) bf16) was
//                     formed, copies it into its pinned arena slot, records a "landed" event.
//   h2d stream      = non-blocking; per matrix: copies the step D (d_p, d_q) fp32 / the parameters
//                     (m, n) bf16 from the pinned arena into a device staging slot and
//                     records an event; the compute stream waits on that event only (so the
//                     apply of each layer waits for its own upload, nothing else).
//   watcher thread  = waits for each "landed" event and then runs the caller's callback with
//                     the verdict of a finiteness reduction done on the device (one byte
//                     copied after the tensor), e.g. to publish the completion flag to the
//                     optimizer, so the hot path never blocks the host on the device.
//
// The arena is page-locked with cudaHostRegister for the engine's lifetime (destroy the engine
// before unmapping the arena). Staging: a ring of kStagingSlots device buffers of the largest
// upload's size; a slot is reused only after the compute-stream work that read it (recorded
// by ReleaseStaging) is done, so uploads never race with the caching allocator.
//
// Timeline: every copy is bracketed by CUDA events; BeginStep/EndStep convert them (and the
// compute spans marked with MarkComputeBegin/End) to CLOCK_MONOTONIC seconds with one host
// synchronisation at the end of the step.
//
// Thread-safety: OffloadAsync/UploadAsync/Mark*/BeginStep/EndStep from the worker's thread (or
// the autograd thread during backward: the worker's calls are serialised by its job mutex and
// by the autograd engine); callbacks run on the watcher thread.
//
// Shapes: m out features, n in features of W; d_p, d_q the subspace dims of S and D.
#ifndef LSPO_GPU_WORKER_DEVICE_OFFLOAD_H_
#define LSPO_GPU_WORKER_DEVICE_OFFLOAD_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/job_spec.pb.h"
#include "proto/metrics.pb.h"
#include "runtime/cuda/device_runtime.h"

namespace lspo::worker {

// Per-step transfer totals (bytes, seconds of CUDA-event-timed copy time).
struct StepTransfers {
  int64_t d2h_bytes = 0;
  double d2h_seconds = 0;
  int64_t h2d_bytes = 0;
  double h2d_seconds = 0;
};

class DeviceOffload {
 public:
  static constexpr int kStagingSlots = 4;
  static constexpr int kMaxInFlight = 4096;  // Offloads pending at once (verdict bytes).

  // Pins the arena [arena_base, arena_base + arena_bytes), creates the two streams and
  // kStagingSlots staging buffers of `max_upload_bytes` bytes each on `device`, and starts
  // the watcher thread. Errors: kFailedPrecondition (no CUDA build/device), kInternal
  // (cudaHostRegister, e.g. RLIMIT_MEMLOCK; stream creation), kResourceExhausted (staging).
  static absl::StatusOr<std::unique_ptr<DeviceOffload>> Create(void* arena_base, size_t arena_bytes,
                                                               size_t max_upload_bytes,
                                                               const at::Device& device);
  ~DeviceOffload();  // Drains pending offloads, stops the watcher, unpins the arena.

  // Device -> arena: enqueues isfinite(src).all() on the compute stream, then the copy of
  // `src` (a contiguous device tensor, kept alive until the copy is done) into `dst`
  // (src.nbytes() bytes of the pinned arena) and of the verdict into a pinned byte, both on
  // the d2h stream after the compute stream's work so far; `on_landed(finite)` then runs on
  // the watcher thread. `layer` labels the timeline. Errors: kInternal (CUDA),
  // kInvalidArgument (src not a contiguous tensor on the device), kResourceExhausted (more
  // than kMaxInFlight copies pending).
  absl::Status OffloadAsync(int64_t layer, at::Tensor src, void* dst,
                            std::function<void(bool finite)> on_landed);

  // Blocks until every offload enqueued so far has landed and its callback has run.
  void Drain();

  // Arena -> device: copies `bytes` bytes at host `src` into a staging slot on the h2d
  // stream and makes the compute stream wait for that copy. Returns the slot as a device
  // tensor of `dtype` and `sizes` (numel * element size == bytes), valid for compute-stream
  // work enqueued before ReleaseStaging(). Errors: kInvalidArgument (bytes > the slot size),
  // kInternal (CUDA).
  absl::StatusOr<at::Tensor> UploadAsync(int64_t layer, const void* src, size_t bytes,
                                         at::ScalarType dtype, at::IntArrayRef sizes);
  // Marks the last UploadAsync slot reusable once the compute work enqueued so far is done.
  absl::Status ReleaseStaging();

  // Compute-stream spans for the timeline (e.g. a layer's forward): events recorded on the
  // compute stream; BeginStep() clears them.
  void MarkComputeBegin(int64_t layer, const std::string& what);
  void MarkComputeEnd(int64_t layer, const std::string& what);

  // Starts a step's bookkeeping: waits for offloads still pending from an abandoned step,
  // clears the compute spans and keeps the copies not yet reported (the serial schedule's
  // uploads of the previous step, done by ApplyUpdates between two steps, count in this one).
  void BeginStep();
  // Ends the step: waits for the compute stream (one host synchronisation per step) and the
  // pending offloads, then appends every completed span/copy of the step to `events` (actor
  // "gpu" for compute spans, "d2h"/"h2d" copies with actor "pcie"; CLOCK_MONOTONIC seconds)
  // and returns the totals. Errors: kInternal (CUDA).
  absl::StatusOr<StepTransfers> EndStep(std::vector<lspo::v1::LayerEvent>* events);

  // Device memory: used (driver view) and LibTorch's peak allocated bytes since the last
  // ResetGpuPeak() (0 if this LibTorch does not expose it).
  static int64_t GpuMemoryUsedBytes();
  static int64_t GpuPeakAllocatedBytes();
  static void ResetGpuPeak();
  // Caps what LibTorch's CUDA caching allocator may hold on GPU 0 at `limit_bytes` (its
  // per-process memory fraction = limit / total device memory); 0 lifts the cap (fraction 1).
  // Process-wide: each CUDA job sets it before its model moves to the device. Errors:
  // kInvalidArgument (limit above the device's total memory, naming both in MiB),
  // kFailedPrecondition (no CUDA LibTorch, or the device's memory cannot be read).
  static absl::Status SetGpuMemoryLimit(int64_t limit_bytes);

 private:
  struct Span {
    int64_t layer = 0;
    std::string what;
    std::string actor;
    int64_t bytes = 0;
    runtime::cuda::Event begin, end;
    bool closed = false;
  };
  struct Pending {
    std::shared_ptr<Span> span;
    std::shared_ptr<runtime::cuda::Event>
        landed;                     // After the data and the verdict (blocking sync).
    at::Tensor keepalive, verdict;  // Device tensors the copies read: src (any shape), () uint8.
    int flag = 0;                   // Index of the verdict byte in flags_host_.
    std::function<void(bool)> on_landed;
  };

  DeviceOffload() = default;
  void WatcherLoop();
  absl::StatusOr<std::shared_ptr<Span>> NewSpan(int64_t layer, const char* what, const char* actor);

  runtime::cuda::HostRegistration pinned_;
  std::vector<uint8_t> flags_host_;  // kMaxInFlight verdict bytes, pinned.
  runtime::cuda::HostRegistration flags_pinned_;
  int next_flag_ = 0;
  runtime::cuda::Stream d2h_, h2d_;
  std::vector<at::Tensor> staging_;                 // kStagingSlots x (max_upload_bytes) uint8.
  std::vector<runtime::cuda::Event> staging_free_;  // Per slot: last reader done.
  std::vector<bool> staging_used_;
  int next_slot_ = 0, last_slot_ = -1;
  size_t slot_bytes_ = 0;
  at::Device device_{at::kCPU};

  absl::Mutex mu_;
  std::vector<std::shared_ptr<Span>> spans_ ABSL_GUARDED_BY(mu_);  // This step's.
  std::deque<Pending> queue_ ABSL_GUARDED_BY(mu_);
  int64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watcher_;
};

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_DEVICE_OFFLOAD_H_
