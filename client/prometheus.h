// Scheduler job metrics in the Prometheus text exposition format (version 0.0.4), for
// node_exporter's textfile collector (`lspctl metrics`; docs/operations.md says why there is no
// HTTP /metrics endpoint and how to scrape).
#ifndef LSPO_CLIENT_PROMETHEUS_H_
#define LSPO_CLIENT_PROMETHEUS_H_

#include <string>

#include "absl/strings/string_view.h"
#include "proto/scheduler.pb.h"

namespace lspo::client {

// Renders every job of `jobs` as gauges labelled {job_id, name} (name = spec.name):
//   lspo_job_step, lspo_job_total_steps, lspo_job_eta_seconds (0 = unknown or done),
//   lspo_job_state{state="QUEUED"|...} (1 for the job's state, 0 for the others),
//   and, once the job has a step: lspo_job_loss, lspo_job_lr, lspo_job_tokens_per_second,
//   lspo_job_step_seconds and lspo_job_step_phase_seconds{phase="forward"|"backward"|
//   "update"|"apply"|"wait"|"offload"} (seconds of the last step; the phases overlap in the
//   overlap schedule, so they need not add up), and, once projectors are fitted (lsp mode),
//   lspo_job_projector_error (mean relative estimation bias).
// Each metric family is one block (# HELP, # TYPE, then one sample per job, in `jobs` order);
// the text ends with a newline. No jobs: only the HELP/TYPE lines.
std::string JobsToPrometheus(const lspo::v1::ListJobsReply& jobs);

// A label value escaped for the exposition format: backslash, double quote and newline
// become \\, \" and \n.
std::string EscapeLabelValue(absl::string_view value);

// A sample value: the shortest decimal that reads back as `v` ("12", "0.25", "1e-05"),
// "NaN", "+Inf" or "-Inf".
std::string FormatSampleValue(double v);

}  // namespace lspo::client

#endif  // LSPO_CLIENT_PROMETHEUS_H_
