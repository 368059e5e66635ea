// The embedded runtime for the integration tests.
#ifndef LSPO_TESTS_INTEGRATION_START_EMBEDDED_H_
#define LSPO_TESTS_INTEGRATION_START_EMBEDDED_H_

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "client/embedded.h"
#include "gtest/gtest.h"

namespace lspo::testing_jobs {

// EmbeddedRuntime::Start(options, worker), started: a runtime that does not start fails the
// test and ends the binary with the reason (every later step of the test would need it).
inline std::unique_ptr<client::EmbeddedRuntime> StartEmbedded(
    scheduler::SchedulerOptions options = {}, worker::WorkerOptions worker = {}) {
  auto runtime = client::EmbeddedRuntime::Start(std::move(options), std::move(worker));
  if (!runtime.ok()) {
    ADD_FAILURE() << "the embedded runtime did not start: " << runtime.status();
    std::abort();
  }
  return std::move(*runtime);
}

// A runtime whose worker injects the faults `grad_steps` / `loss_steps`
// (gpu_worker/worker_options.h WorkerFaults; "" for none).
inline std::unique_ptr<client::EmbeddedRuntime> StartEmbeddedWithFaults(
    const std::string& grad_steps, const std::string& loss_steps = "") {
  worker::WorkerOptions worker;
  worker.faults.nonfinite_grad_steps = grad_steps;
  worker.faults.nonfinite_loss_steps = loss_steps;
  return StartEmbedded({}, std::move(worker));
}

}  // namespace lspo::testing_jobs

#endif  // LSPO_TESTS_INTEGRATION_START_EMBEDDED_H_
