// Torch-free wrappers of the CUDA runtime calls the GPU worker's transfer engine needs:
// non-blocking streams, timing events, page-locking (pinning) of host memory that is already
// mapped (the shared-memory arena) and asynchronous copies. Header is CUDA-free (handles are
// void*), so LibTorch translation units include it whether or not the toolkit is present.
//
// Built from device_runtime.cc by g++ (no nvcc needed: these are host API calls). With CMake
// option LSPO_HAS_CUDA off (no toolkit at configure time) every function returns
// kFailedPrecondition ("built without CUDA"), and DeviceCount() returns 0, so callers keep
// one code path and fail with a clear message instead of a link error.
//
// Stream semantics (why non-blocking): LibTorch's default compute stream is the legacy
// default stream; a stream created with plain cudaStreamCreate synchronises implicitly with
// it, which would serialise every copy with the forward/backward. Streams here are created
// with cudaStreamNonBlocking and ordered only by explicit events (cudaStreamWaitEvent).
//
// Errors: every Status names the CUDA call and cudaGetErrorString's text. Thread-safety: the
// objects are move-only handles; CUDA itself allows concurrent use of streams and events from
// several host threads.
#ifndef LSPO_RUNTIME_CUDA_DEVICE_RUNTIME_H_
#define LSPO_RUNTIME_CUDA_DEVICE_RUNTIME_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lspo::runtime::cuda {

// Number of visible CUDA devices; 0 without a device, a driver or a CUDA build. Never fails.
int DeviceCount();

// The legacy default stream (nullptr): LibTorch's compute stream unless a stream guard is set.
inline void* DefaultStream() { return nullptr; }

// A cudaStreamNonBlocking stream (see the file comment). Destroyed with the object.
class Stream {
 public:
  // Errors: kFailedPrecondition (no CUDA build), kInternal (cudaStreamCreateWithFlags).
  static absl::StatusOr<Stream> CreateNonBlocking();
  Stream() = default;
  Stream(Stream&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();
  void* get() const { return s_; }
  // Blocks the calling host thread until all work queued on the stream is done.
  absl::Status Synchronize() const;

 private:
  void* s_ = nullptr;
};

// A CUDA event created with timing enabled (cudaEventDefault), so that ElapsedSeconds works.
class Event {
 public:
  // `blocking_sync`: a host thread waiting in Synchronize() sleeps instead of spinning
  // (cudaEventBlockingSync), for waiter threads that must not take a core from the CPU work.
  // Errors: kFailedPrecondition (no CUDA build), kInternal (cudaEventCreateWithFlags).
  static absl::StatusOr<Event> Create(bool blocking_sync = false);
  Event() = default;
  Event(Event&& o) noexcept : e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();
  void* get() const { return e_; }

  // Enqueues the event on `stream` (nullptr = legacy default stream). Asynchronous.
  absl::Status Record(void* stream);
  // Blocks the calling host thread until the work recorded before the event is done.
  absl::Status Synchronize() const;
  // Non-blocking: true once the recorded work is done.
  absl::StatusOr<bool> Done() const;
  // Seconds between two recorded, completed events (`this` minus `start`; resolution about
  // 0.5 us per cudaEventElapsedTime). kInternal if either is not recorded or not complete.
  absl::StatusOr<double> SecondsSince(const Event& start) const;

 private:
  void* e_ = nullptr;
};

// Makes all future work on `stream` wait for `event` (cudaStreamWaitEvent; no host wait).
absl::Status StreamWaitEvent(void* stream, const Event& event);

// Page-locks an existing host range [ptr, ptr + bytes) (cudaHostRegister, portable), so
// copies from/to it are true DMA and asynchronous. Unregistered with the object, which must
// therefore be destroyed before the memory is unmapped.
class HostRegistration {
 public:
  // Errors: kFailedPrecondition (no CUDA build), kInvalidArgument (null/empty range),
  // kInternal (cudaHostRegister, e.g. the memlock limit).
  static absl::StatusOr<HostRegistration> Register(void* ptr, size_t bytes);
  HostRegistration() = default;
  HostRegistration(HostRegistration&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  HostRegistration& operator=(HostRegistration&& o) noexcept;
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  ~HostRegistration();
  size_t bytes() const { return p_ ? bytes_ : 0; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Asynchronous copy of `bytes` bytes on `stream`, direction inferred from the pointers
// (cudaMemcpyDefault, unified addressing). With pinned host memory it returns at once.
// Errors: kInternal naming cudaMemcpyAsync.
absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream);

// Device memory of the current device: used = total - free (bytes; the driver's view, so it
// includes the CUDA context and every allocator's cached blocks).
struct MemoryInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  size_t used_bytes() const { return total_bytes - free_bytes; }
};
absl::StatusOr<MemoryInfo> GetMemoryInfo();

// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" for device `device`. kFailedPrecondition without
// CUDA, kInternal on a runtime error.
absl::StatusOr<std::string> DeviceDescription(int device);

}  // namespace lspo::runtime::cuda

#endif  // LSPO_RUNTIME_CUDA_DEVICE_RUNTIME_H_
