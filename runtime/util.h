// Small process utilities shared by the services: directories and memory statistics (the
// clock is runtime/clock.h, whole-file I/O runtime/file_io.h).
#ifndef LSPO_RUNTIME_UTIL_H_
#define LSPO_RUNTIME_UTIL_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lspo::runtime {

// mkdir -p with mode 0755. kPermissionDenied naming the first component that could not be
// created (with strerror), e.g. an unwritable output_dir.
absl::Status MakeDirs(const std::string& dir);

// Peak resident set size of this process in bytes (VmHWM of /proc/self/status); 0 where it
// cannot be read (not Linux).
int64_t PeakRssBytes();

// Resets this process's VmHWM to its current resident set size (writes "5" to
// /proc/self/clear_refs, Linux >= 4.0), so that PeakRssBytes() measures from now on. Returns
// false where that is not possible (not Linux, no permission).
bool ResetPeakRss();

// A TCP endpoint.
struct HostPort {
  std::string host;  // name or address; an IPv6 address without its brackets
  int port = 0;      // 1..65535
};
// Parses "host:port" or "[ipv6]:port". `field` names the input in errors. Errors:
// kInvalidArgument naming the field and the value, with the expected form.
absl::StatusOr<HostPort> ParseHostPort(const std::string& value, const std::string& field);

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_UTIL_H_
