// The embedded runtime for the integration tests.
#ifndef LSPO_TESTS_INTEGRATION_START_EMBEDDED_H_
#define LSPO_TESTS_INTEGRATION_START_EMBEDDED_H_

#include <cstdlib>
#include <memory>
#include <utility>

#include "client/embedded.h"
#include "gtest/gtest.h"

namespace lspo::testing_jobs {

// EmbeddedRuntime::Start(options), started: a runtime that does not start fails the test and
// ends the binary with the reason (every later step of the test would need it).
inline std::unique_ptr<client::EmbeddedRuntime> StartEmbedded(
    scheduler::SchedulerOptions options = {}) {
  auto runtime = client::EmbeddedRuntime::Start(std::move(options));
  if (!runtime.ok()) {
    ADD_FAILURE() << "the embedded runtime did not start: " << runtime.status();
    std::abort();
  }
  return std::move(*runtime);
}

}  // namespace lspo::testing_jobs

#endif  // LSPO_TESTS_INTEGRATION_START_EMBEDDED_H_
