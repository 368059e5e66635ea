// Small process utilities shared by the services: directories and memory statistics (the
// clock is runtime/clock.h, whole-file I/O runtime/file_io.h).
#ifndef LSPO_RUNTIME_UTIL_H_
#define LSPO_RUNTIME_UTIL_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace lspo::runtime {

// mkdir -p with mode 0755. kPermissionDenied naming the first component that could not be
// created (with strerror), e.g. an unwritable output_dir.
absl::Status MakeDirs(const std::string& dir);

// Peak resident set size of this process in bytes (VmHWM of /proc/self/status); 0 where it
// cannot be read (not Linux).
int64_t PeakRssBytes();

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_UTIL_H_
