// POSIX shared-memory arena: the data plane between the worker and the optimizer service.
//
// One arena per job holds every per-layer slot (compressed gradient S going down, step D going
// up, projector positions and values). Control messages name tensors in it by byte offset,
// dtype and shape (proto TensorRef); tensor bytes never travel through gRPC.
//
// The creator (the worker) owns the segment: it is created with O_EXCL and mode 0600 and
// unlinked when the owning ShmArena is destroyed (or Unlink() is called). Attachers only map.
// Thread-safety: the object is immutable after construction; concurrent access to disjoint
// byte ranges is safe, ordering between processes comes from the RPC that names the slot.
#ifndef LSPO_RUNTIME_SHM_ARENA_H_
#define LSPO_RUNTIME_SHM_ARENA_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lspo::runtime {

class ShmArena {
 public:
  ShmArena() = default;
  ShmArena(ShmArena&& other) noexcept;
  ShmArena& operator=(ShmArena&& other) noexcept;
  ShmArena(const ShmArena&) = delete;
  ShmArena& operator=(const ShmArena&) = delete;
  ~ShmArena();

  // Creates a new segment of `bytes` bytes (zero-filled), mode 0600.
  // `name` must start with '/', contain no other '/', and be at most 250 characters.
  // Errors: kInvalidArgument (bad name or bytes == 0), kAlreadyExists (name in use),
  // kResourceExhausted (ftruncate/mmap failed, e.g. /dev/shm full), kInternal otherwise.
  static absl::StatusOr<ShmArena> Create(const std::string& name, size_t bytes);

  // Maps an existing segment created by another process. Fails with kNotFound if it does not
  // exist and kFailedPrecondition if its size differs from `expected_bytes`.
  static absl::StatusOr<ShmArena> Attach(const std::string& name, size_t expected_bytes);

  // A fresh segment name "/lspo-<tag>-<16 random hex digits>" (tag sanitised to [A-Za-z0-9_-]).
  static std::string UniqueName(absl::string_view tag);

  // Base address and size in bytes; nullptr/0 for a default-constructed arena.
  uint8_t* data() const { return static_cast<uint8_t*>(base_); }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }
  bool owner() const { return owner_; }

  // Checked typed view of [offset, offset + count * sizeof(T)). kOutOfRange when the range
  // is outside the arena, kInvalidArgument when offset is not aligned for T.
  template <typename T>
  absl::StatusOr<T*> At(uint64_t offset, uint64_t count) const {
    if (offset % alignof(T) != 0) return MisalignedError(offset, alignof(T));
    if (count > (bytes_ / sizeof(T)) || offset > bytes_ - count * sizeof(T)) {
      return RangeError(offset, count * sizeof(T));
    }
    return reinterpret_cast<T*>(data() + offset);
  }

  // Removes the name from /dev/shm now (mappings stay valid). Idempotent; owner only.
  void Unlink();

 private:
  static absl::Status RangeError(uint64_t offset, uint64_t len);
  static absl::Status MisalignedError(uint64_t offset, uint64_t align);
  void Release();

  void* base_ = nullptr;
  size_t bytes_ = 0;
  std::string name_;
  bool owner_ = false;
  bool unlinked_ = false;
};

// Rounds `bytes` up to a multiple of 64 (cache line; also satisfies cudaHostRegister).
inline uint64_t AlignUp64(uint64_t bytes) { return (bytes + 63) & ~uint64_t{63}; }

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_SHM_ARENA_H_
