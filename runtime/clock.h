// The one monotonic clock of the project (CLOCK_MONOTONIC through std::chrono::steady_clock):
// seconds as double, for step-time breakdowns, timelines and deadlines. Comparable between the
// processes of one host (worker, optimizer and scheduler timelines are merged on it), not
// across hosts or reboots. Thread-safe.
#ifndef LSPO_RUNTIME_CLOCK_H_
#define LSPO_RUNTIME_CLOCK_H_

#include <chrono>

namespace lspo::runtime {

// Seconds on the monotonic clock since an unspecified origin (boot, on Linux).
inline double MonotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Seconds elapsed since `t0` on the monotonic clock.
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_CLOCK_H_
