// Read-only memory map of a whole file (POSIX mmap), shared by the GGUF and safetensors
// readers. Header-only so that lspo_gguf and lspo_safetensors stay independent targets.
//
// Thread-safety: immutable after Open(); concurrent reads of data() are safe.
#ifndef LSPO_MODEL_MAPPED_FILE_H_
#define LSPO_MODEL_MAPPED_FILE_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace lspo::model {

// Owns either an mmap'ed region of a file or an in-memory byte buffer. Movable, not copyable.
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }
  MappedFile& operator=(MappedFile&& other) noexcept {
    if (this != &other) {
      Reset();
      map_ = std::exchange(other.map_, nullptr);
      map_size_ = std::exchange(other.map_size_, 0);
      buffer_ = std::move(other.buffer_);
      other.buffer_.clear();
    }
    return *this;
  }
  ~MappedFile() { Reset(); }

  // Maps `path` read-only. Errors: kNotFound (missing file), kPermissionDenied, or the code
  // absl::ErrnoToStatus gives for open/fstat/mmap failures; kInvalidArgument for a directory.
  static absl::StatusOr<MappedFile> Open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      return absl::ErrnoToStatus(
          err, absl::StrCat("cannot open '", path, "'; check the path and permissions"));
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("cannot stat '", path, "'"));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("'", path, "' is not a regular file; pass a file path"));
    }
    MappedFile f;
    if (st.st_size > 0) {
      void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        int err = errno;
        ::close(fd);
        return absl::ErrnoToStatus(err, absl::StrCat("cannot mmap '", path, "'"));
      }
      f.map_ = static_cast<uint8_t*>(p);
      f.map_size_ = static_cast<size_t>(st.st_size);
    }
    ::close(fd);
    return f;
  }

  // Wraps an in-memory copy of `bytes` (for tests and data received over the network).
  static MappedFile FromBytes(std::vector<uint8_t> bytes) {
    MappedFile f;
    f.buffer_ = std::move(bytes);
    return f;
  }

  const uint8_t* data() const { return map_ != nullptr ? map_ : buffer_.data(); }
  size_t size() const { return map_ != nullptr ? map_size_ : buffer_.size(); }

  // Drops the pages covering bytes [offset, offset + length) from the resident set
  // (madvise MADV_DONTNEED; the mapping is read-only and private, so a later read faults the
  // file's bytes back in unchanged). Pages shared with neighbouring bytes are dropped too.
  // No-op for an in-memory buffer or an empty range; out-of-range bytes are clamped.
  void Release(size_t offset, size_t length) const {
    if (map_ == nullptr || length == 0 || offset >= map_size_) return;
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t begin = offset / page * page;
    const size_t end = std::min(map_size_, offset + length);
    ::madvise(map_ + begin, end - begin, MADV_DONTNEED);
  }

 private:
  void Reset() {
    if (map_ != nullptr) ::munmap(map_, map_size_);
    map_ = nullptr;
    map_size_ = 0;
  }

  uint8_t* map_ = nullptr;
  size_t map_size_ = 0;
  std::vector<uint8_t> buffer_;
};

}  // namespace lspo::model

#endif  // LSPO_MODEL_MAPPED_FILE_H_
