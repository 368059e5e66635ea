#include "client/prometheus.h"

#include <charconv>
#include <cmath>
#include <functional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"

namespace lspo::client {
namespace {

using lspo::v1::JobStatus;

// One sample of a family for one job: labels besides job_id and name, and the value.
struct Sample {
  std::vector<std::pair<std::string, std::string>> labels;
  double value = 0;
};
// A job's samples of one family (none = the family has no value for this job yet).
using SampleFn = std::function<std::vector<Sample>(const JobStatus&)>;

std::vector<Sample> One(double v) { return {Sample{{}, v}}; }

std::vector<Sample> IfStep(const JobStatus& s, double v) {
  return s.has_last_step() ? One(v) : std::vector<Sample>{};
}

void AppendFamily(const lspo::v1::ListJobsReply& jobs, absl::string_view name,
                  absl::string_view help, const SampleFn& samples, std::string* out) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n");
  for (const JobStatus& job : jobs.jobs()) {
    for (const Sample& sample : samples(job)) {
      absl::StrAppend(out, name, "{job_id=\"", EscapeLabelValue(job.job_id()), "\",name=\"",
                      EscapeLabelValue(job.spec().name()), "\"");
      for (const auto& [label, value] : sample.labels) {
        absl::StrAppend(out, ",", label, "=\"", EscapeLabelValue(value), "\"");
      }
      absl::StrAppend(out, "} ", FormatSampleValue(sample.value), "\n");
    }
  }
}

std::vector<Sample> StateSamples(const JobStatus& s) {
  std::vector<Sample> out;
  const google::protobuf::EnumDescriptor* states = lspo::v1::JobState_descriptor();
  for (int i = 0; i < states->value_count(); ++i) {
    const google::protobuf::EnumValueDescriptor* v = states->value(i);
    if (v->number() == lspo::v1::JOB_STATE_UNSPECIFIED) continue;
    out.push_back(Sample{{{"state", v->name()}}, v->number() == s.state() ? 1.0 : 0.0});
  }
  return out;
}

std::vector<Sample> PhaseSamples(const JobStatus& s) {
  if (!s.has_last_step()) return {};
  const lspo::v1::StepMetrics& m = s.last_step();
  const std::pair<const char*, double> phases[] = {
      {"forward", m.forward_seconds()}, {"backward", m.backward_seconds()},
      {"update", m.update_seconds()},   {"apply", m.apply_seconds()},
      {"wait", m.wait_seconds()},       {"offload", m.offload_seconds()},
  };
  std::vector<Sample> out;
  for (const auto& [phase, seconds] : phases) out.push_back(Sample{{{"phase", phase}}, seconds});
  return out;
}

}  // namespace

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string FormatSampleValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

std::string JobsToPrometheus(const lspo::v1::ListJobsReply& jobs) {
  std::string out;
  AppendFamily(
      jobs, "lspo_job_step", "Optimizer steps completed.",
      [](const JobStatus& s) { return One(s.step()); }, &out);
  AppendFamily(
      jobs, "lspo_job_total_steps", "Optimizer steps the job runs in total.",
      [](const JobStatus& s) { return One(s.total_steps()); }, &out);
  AppendFamily(
      jobs, "lspo_job_loss", "Mean training loss of the last step.",
      [](const JobStatus& s) { return IfStep(s, s.last_step().loss()); }, &out);
  AppendFamily(
      jobs, "lspo_job_lr", "Learning rate of the last step.",
      [](const JobStatus& s) { return IfStep(s, s.last_step().lr()); }, &out);
  AppendFamily(
      jobs, "lspo_job_tokens_per_second", "Input tokens per second of the last step.",
      [](const JobStatus& s) { return IfStep(s, s.last_step().tokens_per_second()); }, &out);
  AppendFamily(
      jobs, "lspo_job_eta_seconds", "Estimated seconds until the job ends (0 = unknown or done).",
      [](const JobStatus& s) { return One(s.eta_seconds()); }, &out);
  AppendFamily(jobs, "lspo_job_state", "1 for the job's current state, 0 for the others.",
               StateSamples, &out);
  AppendFamily(
      jobs, "lspo_job_step_seconds", "Wall time of the last step, seconds.",
      [](const JobStatus& s) { return IfStep(s, s.last_step().step_seconds()); }, &out);
  AppendFamily(jobs, "lspo_job_step_phase_seconds",
               "Seconds of the last step per phase (overlapping phases need not add up).",
               PhaseSamples, &out);
  AppendFamily(
      jobs, "lspo_job_projector_error",
      "Mean relative estimation bias of the projectors after the last fit.",
      [](const JobStatus& s) {
        return s.mean_projector_error() > 0 ? One(s.mean_projector_error()) : std::vector<Sample>{};
      },
      &out);
  return out;
}

}  // namespace lspo::client
