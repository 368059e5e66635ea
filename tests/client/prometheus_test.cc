// client/prometheus: the exact exposition text for known jobs (lspctl metrics).
#include "client/prometheus.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace lspo::client {
namespace {

TEST(PrometheusTest, RunningAndQueuedJobs) {
  lspo::v1::ListJobsReply jobs;
  lspo::v1::JobStatus* run = jobs.add_jobs();
  run->set_job_id("j1");
  run->mutable_spec()->set_name("sms \"spam\" C:\\runs\nv2");
  run->set_state(lspo::v1::RUNNING);
  run->set_step(12);
  run->set_total_steps(60);
  run->set_eta_seconds(250.5);
  run->set_mean_projector_error(0.125);
  lspo::v1::StepMetrics* m = run->mutable_last_step();
  m->set_loss(0.4312);
  m->set_lr(1e-4);
  m->set_tokens_per_second(210);
  m->set_step_seconds(4.75);
  m->set_forward_seconds(1.5);
  m->set_backward_seconds(2.25);
  m->set_update_seconds(0.5);
  m->set_apply_seconds(0.25);
  m->set_wait_seconds(0);
  m->set_offload_seconds(0.0625);
  lspo::v1::JobStatus* queued = jobs.add_jobs();
  queued->set_job_id("j2");
  queued->mutable_spec()->set_name("tiny");
  queued->set_state(lspo::v1::QUEUED);
  queued->set_total_steps(5);

  const std::string j1 = R"({job_id="j1",name="sms \"spam\" C:\\runs\nv2")";
  const std::string j2 = R"({job_id="j2",name="tiny")";
  const std::string expected =
      "# HELP lspo_job_step Optimizer steps completed.\n"
      "# TYPE lspo_job_step gauge\n"
      "lspo_job_step" + j1 + "} 12\n"
      "lspo_job_step" + j2 + "} 0\n"
      "# HELP lspo_job_total_steps Optimizer steps the job runs in total.\n"
      "# TYPE lspo_job_total_steps gauge\n"
      "lspo_job_total_steps" + j1 + "} 60\n"
      "lspo_job_total_steps" + j2 + "} 5\n"
      "# HELP lspo_job_loss Mean training loss of the last step.\n"
      "# TYPE lspo_job_loss gauge\n"
      "lspo_job_loss" + j1 + "} 0.4312\n"
      "# HELP lspo_job_lr Learning rate of the last step.\n"
      "# TYPE lspo_job_lr gauge\n"
      "lspo_job_lr" + j1 + "} 1e-04\n"
      "# HELP lspo_job_tokens_per_second Input tokens per second of the last step.\n"
      "# TYPE lspo_job_tokens_per_second gauge\n"
      "lspo_job_tokens_per_second" + j1 + "} 210\n"
      "# HELP lspo_job_eta_seconds Estimated seconds until the job ends (0 = unknown or "
      "done).\n"
      "# TYPE lspo_job_eta_seconds gauge\n"
      "lspo_job_eta_seconds" + j1 + "} 250.5\n"
      "lspo_job_eta_seconds" + j2 + "} 0\n"
      "# HELP lspo_job_state 1 for the job's current state, 0 for the others.\n"
      "# TYPE lspo_job_state gauge\n"
      "lspo_job_state" + j1 + ",state=\"QUEUED\"} 0\n"
      "lspo_job_state" + j1 + ",state=\"RUNNING\"} 1\n"
      "lspo_job_state" + j1 + ",state=\"CHECKPOINTING\"} 0\n"
      "lspo_job_state" + j1 + ",state=\"SUCCEEDED\"} 0\n"
      "lspo_job_state" + j1 + ",state=\"FAILED\"} 0\n"
      "lspo_job_state" + j1 + ",state=\"CANCELLED\"} 0\n"
      "lspo_job_state" + j2 + ",state=\"QUEUED\"} 1\n"
      "lspo_job_state" + j2 + ",state=\"RUNNING\"} 0\n"
      "lspo_job_state" + j2 + ",state=\"CHECKPOINTING\"} 0\n"
      "lspo_job_state" + j2 + ",state=\"SUCCEEDED\"} 0\n"
      "lspo_job_state" + j2 + ",state=\"FAILED\"} 0\n"
      "lspo_job_state" + j2 + ",state=\"CANCELLED\"} 0\n"
      "# HELP lspo_job_step_seconds Wall time of the last step, seconds.\n"
      "# TYPE lspo_job_step_seconds gauge\n"
      "lspo_job_step_seconds" + j1 + "} 4.75\n"
      "# HELP lspo_job_step_phase_seconds Seconds of the last step per phase (overlapping "
      "phases need not add up).\n"
      "# TYPE lspo_job_step_phase_seconds gauge\n"
      "lspo_job_step_phase_seconds" + j1 + ",phase=\"forward\"} 1.5\n"
      "lspo_job_step_phase_seconds" + j1 + ",phase=\"backward\"} 2.25\n"
      "lspo_job_step_phase_seconds" + j1 + ",phase=\"update\"} 0.5\n"
      "lspo_job_step_phase_seconds" + j1 + ",phase=\"apply\"} 0.25\n"
      "lspo_job_step_phase_seconds" + j1 + ",phase=\"wait\"} 0\n"
      "lspo_job_step_phase_seconds" + j1 + ",phase=\"offload\"} 0.0625\n"
      "# HELP lspo_job_projector_error Mean relative estimation bias of the projectors after "
      "the last fit.\n"
      "# TYPE lspo_job_projector_error gauge\n"
      "lspo_job_projector_error" + j1 + "} 0.125\n";
  EXPECT_EQ(JobsToPrometheus(jobs), expected);
}

TEST(PrometheusTest, EscapingAndValues) {
  EXPECT_EQ(EscapeLabelValue(R"(a"b\c)"), R"(a\"b\\c)");
  EXPECT_EQ(EscapeLabelValue("x\ny"), "x\\ny");
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(FormatSampleValue(3), "3");
  EXPECT_EQ(FormatSampleValue(-0.5), "-0.5");
  EXPECT_EQ(FormatSampleValue(1e-5), "1e-05");
  EXPECT_EQ(FormatSampleValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
  EXPECT_EQ(FormatSampleValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatSampleValue(-std::numeric_limits<double>::infinity()), "-Inf");
}

TEST(PrometheusTest, NoJobsOnlyDescribesTheFamilies) {
  const std::string text = JobsToPrometheus(lspo::v1::ListJobsReply());
  EXPECT_NE(text.find("# TYPE lspo_job_state gauge\n"), std::string::npos);
  EXPECT_EQ(text.find("{"), std::string::npos);
}

}  // namespace
}  // namespace lspo::client
