#include "runtime/shm_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lspo::runtime {
namespace {

absl::Status ErrnoStatus(absl::string_view what, const std::string& name, int err) {
  std::string msg =
      absl::StrCat(what, " of shared-memory segment '", name, "' failed: ", std::strerror(err));
  if (err == ENOSPC || err == ENOMEM) {
    return absl::ResourceExhaustedError(
        absl::StrCat(msg, ". Free space in /dev/shm (df -h /dev/shm) or use smaller d."));
  }
  if (err == EEXIST) return absl::AlreadyExistsError(msg);
  if (err == ENOENT) return absl::NotFoundError(msg);
  if (err == EACCES) {
    return absl::PermissionDeniedError(
        absl::StrCat(msg, ". Run the worker and the optimizer as the same user."));
  }
  return absl::InternalError(msg);
}

absl::Status CheckName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 250) {
    return absl::InvalidArgumentError(absl::StrCat("shared-memory name '", name,
                                                   "' is invalid: expected '/' followed by 1-249 "
                                                   "characters without '/'"));
  }
  return absl::OkStatus();
}

}  // namespace

ShmArena::ShmArena(ShmArena&& other) noexcept { *this = std::move(other); }

ShmArena& ShmArena::operator=(ShmArena&& other) noexcept {
  if (this != &other) {
    Release();
    base_ = other.base_;
    bytes_ = other.bytes_;
    name_ = std::move(other.name_);
    owner_ = other.owner_;
    unlinked_ = other.unlinked_;
    other.base_ = nullptr;
    other.bytes_ = 0;
    other.owner_ = false;
  }
  return *this;
}

ShmArena::~ShmArena() { Release(); }

void ShmArena::Release() {
  if (base_ != nullptr) munmap(base_, bytes_);
  base_ = nullptr;
  if (owner_) Unlink();
  owner_ = false;
}

void ShmArena::Unlink() {
  if (owner_ && !unlinked_ && !name_.empty()) {
    shm_unlink(name_.c_str());
    unlinked_ = true;
  }
}

absl::StatusOr<ShmArena> ShmArena::Create(const std::string& name, size_t bytes) {
  if (auto s = CheckName(name); !s.ok()) return s;
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory segment '", name, "': size 0 requested"));
  }
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ErrnoStatus("shm_open(create)", name, errno);
  // fchmod in case a restrictive umask is not what we want either way: exactly 0600.
  fchmod(fd, 0600);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return ErrnoStatus("ftruncate", name, err);
  }
  // Reserve the pages now: with a small /dev/shm (containers default to 64 MiB) a sparse file
  // would kill the first process that touches a page beyond the limit with SIGBUS.
  if (int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(
        absl::StrCat("shared-memory segment '", name, "': cannot reserve ", bytes,
                     " bytes in /dev/shm (", std::strerror(err),
                     "); enlarge /dev/shm (docker --shm-size, compose shm_size) or use "
                     "a smaller model / subspace"));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return ErrnoStatus("mmap", name, err);
  }
  ShmArena arena;
  arena.base_ = base;
  arena.bytes_ = bytes;
  arena.name_ = name;
  arena.owner_ = true;
  return arena;
}

absl::StatusOr<ShmArena> ShmArena::Attach(const std::string& name, size_t expected_bytes) {
  if (auto s = CheckName(name); !s.ok()) return s;
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return ErrnoStatus("shm_open(attach)", name, errno);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus("fstat", name, err);
  }
  if (static_cast<size_t>(st.st_size) != expected_bytes) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "shared-memory segment '%s' has %d bytes, the layout expects %d: the worker and the "
        "optimizer disagree on the job (restart both services)",
        name, static_cast<int64_t>(st.st_size), static_cast<int64_t>(expected_bytes)));
  }
  void* base = mmap(nullptr, expected_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) return ErrnoStatus("mmap", name, err);
  ShmArena arena;
  arena.base_ = base;
  arena.bytes_ = expected_bytes;
  arena.name_ = name;
  arena.owner_ = false;
  return arena;
}

std::string ShmArena::UniqueName(absl::string_view tag) {
  std::string clean;
  for (char c : tag) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_';
    clean.push_back(ok ? c : '_');
    if (clean.size() >= 64) break;
  }
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return absl::StrFormat("/lspo-%s-%016x", clean, r);
}

absl::Status ShmArena::RangeError(uint64_t offset, uint64_t len) {
  return absl::OutOfRangeError(
      absl::StrFormat("arena range [%d, %d) is outside the segment: the slot reference is corrupt",
                      offset, offset + len));
}

absl::Status ShmArena::MisalignedError(uint64_t offset, uint64_t align) {
  return absl::InvalidArgumentError(
      absl::StrFormat("arena offset %d is not aligned to %d bytes", offset, align));
}

}  // namespace lspo::runtime
