#include "runtime/cuda/device_runtime.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#if LSPO_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace lspo::runtime::cuda {
namespace {

#if LSPO_HAS_CUDA
absl::Status Check(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // Clear a non-sticky error so later calls do not report it again.
  return absl::InternalError(absl::StrCat(call, " failed: ", cudaGetErrorString(e)));
}
#define LSPO_CUDA_RETURN(expr) return Check((expr), #expr)
#define LSPO_CUDA_TRY(expr)                            \
  do {                                                 \
    absl::Status lspo_cuda_st_ = Check((expr), #expr); \
    if (!lspo_cuda_st_.ok()) return lspo_cuda_st_;     \
  } while (false)
#else
absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "this build has no CUDA support (nvcc was not found when CMake configured it): rebuild "
      "on a machine with the CUDA toolkit, or run with device: cpu");
}
#endif

}  // namespace

int DeviceCount() {
#if LSPO_HAS_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

// ---- Stream ----
absl::StatusOr<Stream> Stream::CreateNonBlocking() {
#if LSPO_HAS_CUDA
  Stream s;
  cudaStream_t raw = nullptr;
  LSPO_CUDA_TRY(cudaStreamCreateWithFlags(&raw, cudaStreamNonBlocking));
  s.s_ = raw;
  return s;
#else
  return NoCuda();
#endif
}

absl::Status Stream::Synchronize() const {
#if LSPO_HAS_CUDA
  LSPO_CUDA_RETURN(cudaStreamSynchronize(static_cast<cudaStream_t>(s_)));
#else
  return NoCuda();
#endif
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    this->~Stream();
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

Stream::~Stream() {
#if LSPO_HAS_CUDA
  if (s_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(s_));
#endif
  s_ = nullptr;
}

// ---- Event ----
absl::StatusOr<Event> Event::Create(bool blocking_sync) {
#if LSPO_HAS_CUDA
  Event e;
  cudaEvent_t raw = nullptr;
  LSPO_CUDA_TRY(
      cudaEventCreateWithFlags(&raw, blocking_sync ? cudaEventBlockingSync : cudaEventDefault));
  e.e_ = raw;
  return e;
#else
  (void)blocking_sync;
  return NoCuda();
#endif
}

Event& Event::operator=(Event&& o) noexcept {
  if (this != &o) {
    this->~Event();
    e_ = o.e_;
    o.e_ = nullptr;
  }
  return *this;
}

Event::~Event() {
#if LSPO_HAS_CUDA
  if (e_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e_));
#endif
  e_ = nullptr;
}

absl::Status Event::Record(void* stream) {
#if LSPO_HAS_CUDA
  LSPO_CUDA_RETURN(
      cudaEventRecord(static_cast<cudaEvent_t>(e_), static_cast<cudaStream_t>(stream)));
#else
  (void)stream;
  return NoCuda();
#endif
}

absl::Status Event::Synchronize() const {
#if LSPO_HAS_CUDA
  LSPO_CUDA_RETURN(cudaEventSynchronize(static_cast<cudaEvent_t>(e_)));
#else
  return NoCuda();
#endif
}

absl::StatusOr<bool> Event::Done() const {
#if LSPO_HAS_CUDA
  cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(e_));
  if (e == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  LSPO_CUDA_TRY(e);
  return true;
#else
  return NoCuda();
#endif
}

absl::StatusOr<double> Event::SecondsSince(const Event& start) const {
#if LSPO_HAS_CUDA
  float ms = 0.f;
  LSPO_CUDA_TRY(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.e_), static_cast<cudaEvent_t>(e_)));
  return static_cast<double>(ms) * 1e-3;
#else
  (void)start;
  return NoCuda();
#endif
}

absl::Status StreamWaitEvent(void* stream, const Event& event) {
#if LSPO_HAS_CUDA
  LSPO_CUDA_RETURN(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                       static_cast<cudaEvent_t>(event.get()), 0));
#else
  (void)stream;
  (void)event;
  return NoCuda();
#endif
}

// ---- HostRegistration ----
absl::StatusOr<HostRegistration> HostRegistration::Register(void* ptr, size_t bytes) {
  if (ptr == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("HostRegistration::Register: empty host range");
  }
#if LSPO_HAS_CUDA
  HostRegistration r;
  LSPO_CUDA_TRY(cudaHostRegister(ptr, bytes, cudaHostRegisterPortable));
  r.p_ = ptr;
  r.bytes_ = bytes;
  return r;
#else
  return NoCuda();
#endif
}

HostRegistration& HostRegistration::operator=(HostRegistration&& o) noexcept {
  if (this != &o) {
    this->~HostRegistration();
    p_ = o.p_;
    bytes_ = o.bytes_;
    o.p_ = nullptr;
  }
  return *this;
}

HostRegistration::~HostRegistration() {
#if LSPO_HAS_CUDA
  if (p_ != nullptr) cudaHostUnregister(p_);
#endif
  p_ = nullptr;
}

absl::Status CopyAsync(void* dst, const void* src, size_t bytes, void* stream) {
#if LSPO_HAS_CUDA
  LSPO_CUDA_RETURN(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
#else
  (void)dst;
  (void)src;
  (void)bytes;
  (void)stream;
  return NoCuda();
#endif
}

absl::StatusOr<MemoryInfo> GetMemoryInfo() {
#if LSPO_HAS_CUDA
  MemoryInfo info;
  LSPO_CUDA_TRY(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
#else
  return NoCuda();
#endif
}

absl::StatusOr<std::string> DeviceDescription(int device) {
#if LSPO_HAS_CUDA
  cudaDeviceProp prop{};
  LSPO_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  return absl::StrFormat("%s (sm_%d%d, %d SMs, %.1f GiB)", prop.name, prop.major, prop.minor,
                         prop.multiProcessorCount,
                         static_cast<double>(prop.totalGlobalMem) / (1ull << 30));
#else
  (void)device;
  return NoCuda();
#endif
}

}  // namespace lspo::runtime::cuda
