#include "scheduler/scheduler_core.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "offload/arena_layout.h"
#include "runtime/rpc_status.h"
#include "runtime/clock.h"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"
#include "scheduler/checkpoint.h"
#include "scheduler/cost_model.h"
#include "scheduler/job_spec.h"
#include "scheduler/lr_schedule.h"

namespace lspo::scheduler {

using lspo::v1::JobSpec;
using lspo::v1::JobState;
using lspo::v1::JobStatus;

bool IsFinal(JobState s) {
  return s == lspo::v1::SUCCEEDED || s == lspo::v1::FAILED || s == lspo::v1::CANCELLED;
}

namespace {

double Now() { return runtime::MonotonicSeconds(); }


nlohmann::json ToJson(const google::protobuf::Message& m) {
  std::string s;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &s, o);
  return nlohmann::json::parse(s);
}

// Calls a unary stub method with a deadline and maps the status (naming the peer).
template <typename Stub, typename Req, typename Rep>
absl::Status Call(Stub* stub,
                  grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Rep*),
                  const Req& req, Rep* rep, double deadline_s, absl::string_view peer) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000)));
  return rpc::FromGrpc((stub->*method)(&ctx, req, rep), peer);
}

}  // namespace

SchedulerCore::SchedulerCore(lspo::v1::Worker::StubInterface* worker,
                             lspo::v1::Optimizer::StubInterface* optimizer,
                             SchedulerOptions options)
    : worker_(worker), optimizer_(optimizer), options_(std::move(options)) {
  if (!options_.state_dir.empty()) {
    absl::StatusOr<JobStore> store = JobStore::Open(options_.state_dir);
    if (store.ok()) {
      store_ = std::move(*store);
      RecoverJobs();
    } else {
      init_status_ = store.status();
      LOG(ERROR) << "scheduler: " << init_status_;
    }
  }
  runner_ = std::thread([this] { RunLoop(); });
}

void SchedulerCore::PersistLocked(Job* job) {
  if (!store_.has_value()) return;
  absl::Status st = store_->Save(job->status);
  if (!st.ok()) {
    LOG(WARNING) << "scheduler: cannot persist " << job->status.job_id() << ": " << st;
  }
}

void SchedulerCore::RecoverJobs() {
  std::vector<std::string> skipped;
  std::vector<JobStatus> stored = store_->LoadAll(&skipped);
  for (const std::string& s : skipped) {
    LOG(ERROR) << "scheduler: skipped an unreadable job file (renamed to .corrupt): " << s;
  }
  absl::MutexLock lock(&mu_);
  // Ids are job-<unix seconds>-<sequence>: queue in submission order, the interrupted job first.
  auto seq_of = [](const std::string& id) {
    int64_t n = 0;
    const size_t dash = id.rfind('-');
    if (dash != std::string::npos) (void)absl::SimpleAtoi(id.substr(dash + 1), &n);
    return n;
  };
  std::vector<std::pair<int64_t, std::string>> interrupted, queued;
  for (JobStatus& st : stored) {
    const std::string id = st.job_id();
    next_id_ = std::max(next_id_, seq_of(id) + 1);
    if (st.state() == lspo::v1::RUNNING || st.state() == lspo::v1::CHECKPOINTING) {
      st.set_state(lspo::v1::QUEUED);
      st.set_restarts(st.restarts() + 1);
      st.set_phase("queued (resuming after a scheduler restart)");
      if (!ListCheckpoints(st.spec().output_dir()).empty()) {
        st.mutable_spec()->set_resume_from("latest");
      }
      interrupted.emplace_back(seq_of(id), id);
    } else if (st.state() == lspo::v1::QUEUED) {
      queued.emplace_back(seq_of(id), id);
    }
    Job job;
    job.status = std::move(st);
    jobs_[id] = std::move(job);
    PersistLocked(&jobs_[id]);
  }
  std::sort(interrupted.begin(), interrupted.end());
  std::sort(queued.begin(), queued.end());
  for (const auto& [seq, id] : interrupted) queue_.push_back(id);
  for (const auto& [seq, id] : queued) queue_.push_back(id);
  LOG(INFO) << "scheduler: recovered " << stored.size() << " jobs from " << store_->dir() << " ("
            << interrupted.size() << " to resume, " << queued.size() << " queued)";
}

SchedulerCore::~SchedulerCore() {
  {
    absl::MutexLock lock(&mu_);
    shutdown_ = true;
    for (auto& [id, job] : jobs_) job.cancel_requested = true;
  }
  runner_.join();
}

absl::StatusOr<std::string> SchedulerCore::Submit(JobSpec spec) {
  ResolveDefaults(&spec);
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  absl::MutexLock lock(&mu_);
  const std::string id = absl::StrCat("job-", absl::ToUnixSeconds(absl::Now()), "-", next_id_++);
  Job job;
  job.status.set_job_id(id);
  job.status.set_state(lspo::v1::QUEUED);
  job.status.set_total_steps(spec.steps());
  job.status.set_phase("queued");
  if (spec.output_dir().empty()) {
    spec.set_output_dir(absl::StrCat(options_.runs_root, "/", spec.name(), "-", id));
  }
  job.status.set_output_dir(spec.output_dir());
  *job.status.mutable_spec() = spec;
  RETURN_IF_ERROR(CheckPathsUnderRoots(spec, options_.allowed_roots));
  jobs_[id] = std::move(job);
  PersistLocked(&jobs_[id]);
  queue_.push_back(id);
  LOG(INFO) << "scheduler: queued " << id << " (" << spec.name() << ")";
  return id;
}

absl::StatusOr<JobStatus> SchedulerCore::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job '", job_id, "' (lspctl list shows jobs)"));
  }
  return it->second.status;
}

std::vector<JobStatus> SchedulerCore::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<JobStatus> out;
  for (const auto& [id, job] : jobs_) out.push_back(job.status);
  return out;
}

absl::StatusOr<JobState> SchedulerCore::Cancel(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
  Job& job = it->second;
  job.cancel_requested = true;
  if (job.status.state() == lspo::v1::QUEUED) {
    job.status.set_state(lspo::v1::CANCELLED);
    job.status.set_phase("cancelled");
    ++job.version;
    PersistLocked(&job);
  }
  return job.status.state();
}

absl::Status SchedulerCore::Watch(
    const std::string& job_id, const std::function<bool(const JobStatus&)>& on_status) const {
  int64_t seen = -1;
  size_t steps_sent = 0;
  while (true) {
    JobStatus snapshot;
    std::vector<JobStatus> replay;
    {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job '", job_id, "'"));
      const Job* job = &it->second;
      auto changed = [job, seen]() { return job->version != seen; };
      mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Seconds(1));
      if (job->version == seen) continue;
      seen = job->version;
      snapshot = job->status;
      // Steps completed since the last call, except the newest (it is in `snapshot`).
      for (; steps_sent + 1 < job->steps.size(); ++steps_sent) {
        JobStatus s = snapshot;
        s.set_step(job->steps[steps_sent].step());
        *s.mutable_last_step() = job->steps[steps_sent];
        s.set_state(lspo::v1::RUNNING);
        replay.push_back(std::move(s));
      }
      steps_sent = std::max(steps_sent, job->steps.size());
    }
    for (const auto& s : replay) {
      if (!on_status(s)) return absl::OkStatus();
    }
    if (!on_status(snapshot)) return absl::OkStatus();
    if (IsFinal(snapshot.state())) return absl::OkStatus();
  }
}

absl::StatusOr<JobStatus> SchedulerCore::Wait(const std::string& job_id) const {
  JobStatus last;
  RETURN_IF_ERROR(Watch(job_id, [&](const JobStatus& s) {
    last = s;
    return true;
  }));
  return last;
}

void SchedulerCore::Update(const std::string& job_id,
                           const std::function<void(JobStatus*)>& fn) {
  absl::MutexLock lock(&mu_);
  Job& job = jobs_[job_id];
  fn(&job.status);
  ++job.version;
  PersistLocked(&job);
}

bool SchedulerCore::CancelRequested(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  return it != jobs_.end() && it->second.cancel_requested;
}

void SchedulerCore::RunLoop() {
  while (true) {
    std::string id;
    JobSpec spec;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return shutdown_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (shutdown_) return;
      id = queue_.front();
      queue_.pop_front();
      Job& job = jobs_[id];
      if (job.status.state() != lspo::v1::QUEUED) continue;  // Cancelled while queued.
      job.status.set_state(lspo::v1::RUNNING);
      job.status.set_phase("loading");
      job.status.clear_error();
      ++job.version;
      PersistLocked(&job);
      spec = job.status.spec();
    }
    absl::Status st = RunJob(id, spec);
    Update(id, [&](JobStatus* s) {
      if (st.ok()) {
        s->set_state(lspo::v1::SUCCEEDED);
        s->set_phase("done");
      } else if (absl::IsCancelled(st)) {
        s->set_state(lspo::v1::CANCELLED);
        s->set_phase("cancelled");
      } else {
        s->set_state(lspo::v1::FAILED);
        s->set_phase("failed");
        s->set_error(std::string(st.message()));
        LOG(ERROR) << "scheduler: job " << id << " failed: " << st;
      }
    });
  }
}

absl::Status SchedulerCore::RunJob(const std::string& id, const JobSpec& spec) {
  const double t_start = Now();
  const double dl = options_.rpc_deadline_seconds;
  const bool lsp = spec.mode() == lspo::v1::MODE_LSP;
  const bool zero = spec.mode() == lspo::v1::MODE_ZERO;
  const bool offload = lsp || zero;  // An optimizer service and an arena take part.
  const std::string& out_dir = spec.output_dir();
  RETURN_IF_ERROR(runtime::MakeDirs(out_dir));

  // Resume: find and verify the checkpoint before loading anything.
  int start_step = 0;
  nlohmann::json resume_state;
  std::string resume_dir;
  if (!spec.resume_from().empty()) {
    std::vector<CheckpointInfo> candidates;
    if (spec.resume_from() == "latest") {
      candidates = ListCheckpoints(out_dir);
      std::reverse(candidates.begin(), candidates.end());
    } else {
      candidates.push_back({0, spec.resume_from()});
    }
    for (const CheckpointInfo& c : candidates) {
      absl::StatusOr<nlohmann::json> state = VerifyCheckpoint(c.dir);
      if (!state.ok()) {
        if (spec.resume_from() != "latest") return state.status();
        LOG(ERROR) << "scheduler: " << id << ": skipping checkpoint " << c.dir << ": "
                   << state.status();
        continue;
      }
      resume_state = std::move(*state);
      resume_dir = c.dir;
      break;
    }
    if (!resume_dir.empty()) {
      if (resume_state.value("training_fingerprint", std::string()) !=
          TrainingFingerprint(spec)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint '", resume_dir, "' was written by a job with a different training spec "
            "(mode, model, data, lsp, optim, batch or seed differ): resume with the spec in its "
            "trainer_state.json, changing only steps, output, evaluation or threads"));
      }
      start_step = resume_state["step"].get<int>();
      if (start_step > spec.steps()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint '", resume_dir, "' is at step ", start_step, " but the job has only ",
            spec.steps(), " steps: raise steps"));
      }
      LOG(INFO) << "scheduler: " << id << ": resuming from " << resume_dir << " (step "
                << start_step << ")";
    }
  }
  const auto open_mode = start_step > 0 ? std::ios::app : std::ios::trunc;
  std::ofstream metrics(out_dir + "/metrics.jsonl", open_mode);
  if (!metrics) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write '", out_dir, "/metrics.jsonl'"));
  }
  auto log_json = [&](const nlohmann::json& j) { metrics << j.dump() << "\n" << std::flush; };
  auto phase = [&](const std::string& p) {
    LOG(INFO) << "scheduler: " << id << ": " << p;
    Update(id, [&](JobStatus* s) { s->set_phase(p); });
  };
  auto check_cancel = [&]() -> absl::Status {
    if (CancelRequested(id)) return absl::CancelledError("cancelled by the user");
    return absl::OkStatus();
  };

  // Load on the worker (creates the arena in lsp mode), then the optimizer. A job resumed
  // after a scheduler restart may still be loaded there (the actors outlived the scheduler):
  // unload it first (unknown ids are ignored; a dead actor fails at LoadJob below).
  phase("loading model and data");
  {
    lspo::v1::UnloadJobRequest u;
    u.set_job_id(id);
    lspo::v1::UnloadJobReply r;
    if (offload) {
      (void)Call(optimizer_, &lspo::v1::Optimizer::StubInterface::UnloadJob, u, &r, 60,
                 "optimizer");
    }
    (void)Call(worker_, &lspo::v1::Worker::StubInterface::UnloadJob, u, &r, 60, "worker");
  }
  lspo::v1::LoadJobRequest load;
  load.set_job_id(id);
  *load.mutable_spec() = spec;
  lspo::v1::LoadJobReply wload;
  RETURN_IF_ERROR(Call(worker_, &lspo::v1::Worker::StubInterface::LoadJob, load, &wload, dl,
                       "worker"));
  // From here on, always unload both services, whatever happens.
  struct Unloader {
    SchedulerCore* self;
    std::string id;
    bool offload;
    std::string arena_name;
    ~Unloader() {
      lspo::v1::UnloadJobRequest u;
      u.set_job_id(id);
      lspo::v1::UnloadJobReply r;
      if (offload) {
        (void)Call(self->optimizer_, &lspo::v1::Optimizer::StubInterface::UnloadJob, u, &r,
                   60, "optimizer");
      }
      absl::Status st = Call(self->worker_, &lspo::v1::Worker::StubInterface::UnloadJob, u, &r,
                             60, "worker");
      // A dead worker cannot remove its arena: do it here (same host; harmless otherwise).
      if (!st.ok() && !arena_name.empty() && shm_unlink(arena_name.c_str()) == 0) {
        LOG(WARNING) << "scheduler: removed the arena " << arena_name << " of " << id
                     << " left by an unreachable worker";
      }
    }
  } unloader{this, id, offload, wload.arena().name()};
  const lspo::v1::ArenaLayout& layout = wload.arena();
  if (offload) {
    *load.mutable_arena() = layout;
    lspo::v1::LoadJobReply oload;
    RETURN_IF_ERROR(Call(optimizer_, &lspo::v1::Optimizer::StubInterface::LoadJob, load, &oload,
                         dl, "optimizer"));
  }
  if (start_step > 0) {
    phase(absl::StrCat("restoring the training state of step ", start_step));
    lspo::v1::StateRequest sreq;
    sreq.set_job_id(id);
    sreq.set_dir(resume_dir);
    sreq.set_step(start_step);
    lspo::v1::StateReply srep;
    RETURN_IF_ERROR(Call(worker_, &lspo::v1::Worker::StubInterface::LoadState, sreq, &srep, dl,
                         "worker"));
    if (offload) {
      RETURN_IF_ERROR(Call(optimizer_, &lspo::v1::Optimizer::StubInterface::LoadState, sreq,
                           &srep, dl, "optimizer"));
    }
  }
  nlohmann::json summary;
  summary["job_id"] = id;
  summary["mode"] = lsp ? "lsp" : zero ? "zero" : "native";
  summary["schedule"] = offload ? spec.schedule() : "none";
  summary["weight_dtype"] = spec.weight_dtype();
  summary["activation_checkpointing"] = spec.activation_checkpointing();
  summary["d"] = lsp ? spec.lsp().d() : 0;
  summary["r"] = lsp ? spec.lsp().r() : 0;
  summary["steps"] = spec.steps();
  summary["micro_batch_size"] = spec.micro_batch_size();
  summary["grad_accum"] = spec.grad_accum();
  summary["seq_len"] = spec.seq_len();
  summary["lr"] = spec.optim().lr();
  summary["train_examples"] = wload.train_examples();
  summary["eval_examples"] = wload.eval_examples();
  summary["trainable_parameters"] = wload.trainable_parameters();
  summary["model"] = spec.model().format() == "gguf" ? spec.model().path() : "tiny-random";
  summary["train_path"] = spec.data().train_path();
  int nonfinite_in_a_row = 0, skipped = 0;
  if (start_step > 0) {
    // Counters, evaluations and the summary so far, as at the checkpoint.
    skipped = resume_state.value("skipped_steps", 0);
    nonfinite_in_a_row = resume_state.value("nonfinite_in_a_row", 0);
    if (resume_state.contains("summary") && resume_state["summary"].is_object()) {
      for (const auto& [k, v] : resume_state["summary"].items()) {
        if (!summary.contains(k)) summary[k] = v;
      }
    }
    summary["resumed_from_step"] = start_step;
    std::vector<lspo::v1::EvalMetrics> evals;
    for (const auto& e : resume_state.value("evals", nlohmann::json::array())) {
      lspo::v1::EvalMetrics m;
      if (google::protobuf::util::JsonStringToMessage(e.dump(), &m).ok()) evals.push_back(m);
    }
    log_json({{"kind", "resume"}, {"step", start_step}, {"checkpoint", resume_dir}});
    Update(id, [&](JobStatus* s) {
      s->set_step(start_step);
      s->set_resumed_from_step(start_step);
      s->set_skipped_steps(skipped);
      s->set_last_checkpoint_step(start_step);
      s->set_last_checkpoint_dir(resume_dir);
      s->clear_evals();
      for (const auto& m : evals) *s->add_evals() = m;
    });
  }

  const bool has_eval = wload.eval_examples() > 0 || !spec.data().perplexity_path().empty();
  auto evaluate = [&](int step) -> absl::StatusOr<lspo::v1::EvalMetrics> {
    phase(absl::StrCat("evaluating after step ", step));
    lspo::v1::EvaluateRequest req;
    req.set_job_id(id);
    req.set_step(step);
    lspo::v1::EvaluateReply rep;
    RETURN_IF_ERROR(Call(worker_, &lspo::v1::Worker::StubInterface::Evaluate, req, &rep, dl,
                         "worker"));
    nlohmann::json j = ToJson(rep.metrics());
    j["kind"] = "eval";
    log_json(j);
    LOG(INFO) << "scheduler: " << id << ": eval at step " << step << ": accuracy "
              << rep.metrics().accuracy() << ", loss " << rep.metrics().loss() << " ("
              << rep.metrics().seconds() << " s)";
    Update(id, [&](JobStatus* s) { *s->add_evals() = rep.metrics(); });
    return rep.metrics();
  };

  if (has_eval && !spec.skip_initial_eval() && start_step == 0) {
    ASSIGN_OR_RETURN(lspo::v1::EvalMetrics initial, evaluate(0));
    if (spec.data().format() == "classification") {
      summary["zero_shot_accuracy"] = initial.accuracy();
    }
    summary["zero_shot_eval_loss"] = initial.loss();
    if (initial.perplexity() > 0) summary["zero_shot_perplexity"] = initial.perplexity();
  }
  RETURN_IF_ERROR(check_cancel());

  // Per-layer task list of a step: deepest layer first (its gradient is ready first in the
  // backward pass; the overlapped schedule's first-come-first-served order).
  std::vector<lspo::v1::LayerTask> plan_tasks;
  for (int i = layout.linears_size() - 1; i >= 0; --i) {
    lspo::v1::LayerTask t;
    t.set_index(layout.linears(i).index());
    plan_tasks.push_back(t);
  }
  auto fit = [&](int step) -> absl::Status {
    phase(absl::StrCat("fitting projectors (step ", step, ")"));
    lspo::v1::FitProjectorsRequest req;
    req.set_job_id(id);
    req.set_step(step);
    lspo::v1::FitProjectorsReply rep;
    RETURN_IF_ERROR(Call(worker_, &lspo::v1::Worker::StubInterface::FitProjectors, req, &rep,
                         dl, "worker"));
    lspo::v1::SetProjectorsRequest sp;
    sp.set_job_id(id);
    *sp.mutable_indices() = rep.refitted();
    lspo::v1::SetProjectorsReply sr;
    RETURN_IF_ERROR(Call(optimizer_, &lspo::v1::Optimizer::StubInterface::SetProjectors, sp,
                         &sr, dl, "optimizer"));
    double init = 0, fin = 0;
    int n = 0;
    for (int k = 0; k < rep.final_error_size(); ++k) {
      if (!std::isfinite(rep.final_error(k)) || !std::isfinite(rep.initial_error(k))) continue;
      init += rep.initial_error(k);
      fin += rep.final_error(k);
      ++n;
    }
    n = std::max(n, 1);
    nlohmann::json j = {{"kind", "projector_fit"},
                        {"step", step},
                        {"refitted", rep.refitted_size()},
                        {"mean_initial_relative_bias", init / n},
                        {"mean_final_relative_bias", fin / n},
                        {"seconds", rep.seconds()}};
    log_json(j);
    LOG(INFO) << "scheduler: " << id << ": projectors: " << rep.refitted_size()
              << " refitted, mean relative estimation bias " << init / n << " -> " << fin / n
              << " (" << rep.seconds() << " s)";
    Update(id, [&](JobStatus* s) { s->set_mean_projector_error(fin / n); });
    if (step == 0) {
      summary["projector_initial_relative_bias"] = init / n;
      summary["projector_fitted_relative_bias"] = fin / n;
      summary["projector_fit_seconds"] = rep.seconds();
    }
    return absl::OkStatus();
  };
  if (lsp && start_step == 0) RETURN_IF_ERROR(fit(0));

  // Master-weight refresh (lsp): the optimizer writes each layer's fp32 master weights into
  // the arena staging region and the worker copies them in (or, measure_only, reports
  // max |W_worker - W_master| without copying). Returns that maximum over all layers.
  int num_layers = 0;  // Decoder layers of the arena (lsp and zero); native has no arena.
  if (offload) {
    ASSIGN_OR_RETURN(num_layers, offload::NumLayers(layout));
  }
  double last_drift = 0;  // max |W_worker - round(W_master)| of the last refresh call.
  auto refresh = [&](bool measure_only) -> absl::StatusOr<double> {
    double max_diff = 0;
    last_drift = 0;
    for (int l = 0; l < num_layers; ++l) {
      lspo::v1::LayerWeightsRequest req;
      req.set_job_id(id);
      req.set_layer(l);
      req.set_measure_only(measure_only);
      lspo::v1::LayerWeightsReply rep;
      RETURN_IF_ERROR(Call(optimizer_, &lspo::v1::Optimizer::StubInterface::ExportLayerWeights,
                           req, &rep, dl, "optimizer"));
      RETURN_IF_ERROR(Call(worker_, &lspo::v1::Worker::StubInterface::ImportLayerWeights, req,
                           &rep, dl, "worker"));
      max_diff = std::max(max_diff, rep.max_abs_change());
      last_drift = std::max(last_drift, rep.max_abs_drift());
    }
    return max_diff;
  };

  // Training checkpoint of `step` (scheduler/checkpoint.h). A failure (disk full, unwritable
  // directory) is reported in last_error and training goes on; the previous checkpoint stays.
  auto checkpoint = [&](int step) -> absl::Status {
    Update(id, [&](JobStatus* s) {
      s->set_state(lspo::v1::CHECKPOINTING);
      s->set_phase(absl::StrCat("writing the checkpoint of step ", step));
    });
    auto write = [&]() -> absl::StatusOr<std::string> {
      ASSIGN_OR_RETURN(std::string tmp, BeginCheckpoint(out_dir, step));
      absl::Status st = [&]() -> absl::Status {
        lspo::v1::SaveRequest save;
        save.set_job_id(id);
        save.set_dir(tmp);
        lspo::v1::SaveReply srep;
        RETURN_IF_ERROR(Call(worker_, &lspo::v1::Worker::StubInterface::SaveArtifacts, save,
                             &srep, dl, "worker"));
        lspo::v1::StateRequest sreq;
        sreq.set_job_id(id);
        sreq.set_dir(tmp);
        sreq.set_step(step);
        lspo::v1::StateReply strep;
        RETURN_IF_ERROR(Call(worker_, &lspo::v1::Worker::StubInterface::SaveState, sreq, &strep,
                             dl, "worker"));
        if (offload) {
          RETURN_IF_ERROR(Call(optimizer_, &lspo::v1::Optimizer::StubInterface::SaveModel, save,
                               &srep, dl, "optimizer"));
          RETURN_IF_ERROR(Call(optimizer_, &lspo::v1::Optimizer::StubInterface::SaveState, sreq,
                               &strep, dl, "optimizer"));
        }
        return absl::OkStatus();
      }();
      if (!st.ok()) {
        std::error_code ec;
        std::filesystem::remove_all(tmp, ec);
        return st;
      }
      nlohmann::json state;
      state["step"] = step;
      state["job_id"] = id;
      state["written_unix_seconds"] = absl::ToUnixSeconds(absl::Now());
      state["skipped_steps"] = skipped;
      state["nonfinite_in_a_row"] = nonfinite_in_a_row;
      state["lr_schedule"] = {{"schedule", spec.optim().schedule()},
                              {"peak_lr", spec.optim().lr()},
                              {"warmup_steps", spec.optim().warmup_steps()},
                              {"total_steps", spec.steps()},
                              {"lr_of_step", LearningRate(spec.optim(), step, spec.steps())},
                              {"next_step", step + 1}};
      const int64_t per_step = static_cast<int64_t>(spec.micro_batch_size()) * spec.grad_accum();
      state["data_cursor"] = {{"next_step", step + 1},
                              {"examples_per_step", per_step},
                              {"examples_consumed", per_step * step},
                              {"order", "data::ShuffledOrder(train size, seed, epoch) over the "
                                        "global example index (step - 1) * examples_per_step"}};
      state["rng"] = {{"seed", spec.seed()},
                      {"model_init_seed", spec.model().init_seed()},
                      {"derivation", "every random draw (data order, calibration subsets, "
                                     "projector draws) is a pure function of (seed, step); no "
                                     "generator state is carried between steps"}};
      nlohmann::json evals = nlohmann::json::array();
      {
        absl::MutexLock lock(&mu_);
        for (const auto& e : jobs_[id].status.evals()) evals.push_back(ToJson(e));
      }
      state["evals"] = std::move(evals);
      state["summary"] = summary;
      state["training_fingerprint"] = TrainingFingerprint(spec);
      state["spec"] = ToJson(spec);
      ASSIGN_OR_RETURN(std::string dir, CommitCheckpoint(tmp, state));
      RETURN_IF_ERROR(PruneCheckpoints(out_dir, spec.keep_checkpoints()));
      return dir;
    };
    absl::StatusOr<std::string> dir = write();
    if (dir.ok()) {
      log_json({{"kind", "checkpoint"}, {"step", step}, {"dir", *dir}});
      LOG(INFO) << "scheduler: " << id << ": checkpoint of step " << step << " in " << *dir;
    } else {
      LOG(ERROR) << "scheduler: " << id << ": checkpoint of step " << step
                 << " failed: " << dir.status();
      log_json({{"kind", "checkpoint_failed"},
                {"step", step},
                {"error", std::string(dir.status().message())}});
    }
    Update(id, [&](JobStatus* s) {
      s->set_state(lspo::v1::RUNNING);
      s->set_phase("training");
      if (dir.ok()) {
        s->set_last_checkpoint_step(step);
        s->set_last_checkpoint_dir(*dir);
      } else {
        s->set_last_error(absl::StrCat(
            "checkpoint of step ", step, " failed: ", dir.status().message(),
            s->last_checkpoint_step() > 0
                ? absl::StrCat("; the checkpoint of step ", s->last_checkpoint_step(), " is kept")
                : std::string("; no checkpoint yet")));
      }
    });
    // A peer that died while saving fails the job like any other call.
    if (!dir.ok() && (absl::IsUnavailable(dir.status()) ||
                      absl::IsDeadlineExceeded(dir.status()))) {
      return dir.status();
    }
    return absl::OkStatus();
  };

  phase("training");
  const double t_train = Now();
  double step_time_sum = 0;
  std::ofstream timeline;
  if (offload) {
    timeline.open(out_dir + "/timeline.jsonl", open_mode);
    if (!timeline) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write '", out_dir, "/timeline.jsonl'"));
    }
  }
  LayerCostModel cost_model(num_layers, spec.optim().max_grad_norm() > 0);
  const bool overlap_schedule = spec.schedule() == "overlap";
  double last_step_end = -1;  // Worker clock (CLOCK_MONOTONIC) at the end of the last step.
  for (int step = start_step + 1; step <= spec.steps(); ++step) {
    RETURN_IF_ERROR(check_cancel());
    const double t0 = Now();
    const double lr = LearningRate(spec.optim(), step, spec.steps());
    SplitChoice choice;
    const lspo::v1::StepPlan plan = cost_model.Plan(overlap_schedule, &choice);
    lspo::v1::TrainStepRequest treq;
    treq.set_job_id(id);
    treq.set_step(step);
    treq.set_lr(lr);
    *treq.mutable_plan() = plan;
    lspo::v1::UpdateRequest ureq;
    ureq.set_job_id(id);
    ureq.set_step(step);
    ureq.set_lr(lr);
    for (const auto& t : plan_tasks) *ureq.add_tasks() = t;
    lspo::v1::TrainStepReply trep;
    lspo::v1::UpdateReply urep;
    lspo::v1::ApplyReply arep;
    if (offload && plan.overlap()) {
      // The optimizer waits on each layer's gradient flag while the worker's backward runs.
      ureq.set_wait_for_grads(true);
      ureq.set_wait_timeout_seconds(dl);
      // When one side fails, the other may be waiting on this step's flags: release it.
      lspo::v1::AbortStepRequest abort_req;
      abort_req.set_job_id(id);
      abort_req.set_step(step);
      absl::Status ust;
      std::thread updater([&] {
        ust = Call(optimizer_, &lspo::v1::Optimizer::StubInterface::Update, ureq, &urep, dl,
                   "optimizer");
        lspo::v1::AbortStepReply ar;
        if (!ust.ok()) {
          (void)Call(worker_, &lspo::v1::Worker::StubInterface::AbortStep, abort_req, &ar, 60,
                     "worker");
        }
      });
      absl::Status tst = Call(worker_, &lspo::v1::Worker::StubInterface::TrainStep, treq, &trep,
                              dl, "worker");
      lspo::v1::AbortStepReply ar;
      if (!tst.ok()) {
        (void)Call(optimizer_, &lspo::v1::Optimizer::StubInterface::AbortStep, abort_req, &ar,
                   60, "optimizer");
      }
      updater.join();
      RETURN_IF_ERROR(ust);  // The root cause when both failed (the worker was released).
      RETURN_IF_ERROR(tst);
    } else {
      RETURN_IF_ERROR(Call(worker_, &lspo::v1::Worker::StubInterface::TrainStep, treq, &trep,
                           dl, "worker"));
    }
    if (trep.nonfinite()) {
      ++skipped;
      Update(id, [&](JobStatus* s) {
        s->set_skipped_steps(skipped);
        s->set_last_error(absl::StrCat("step ", step, " had a non-finite loss or gradient and "
                                       "was skipped (", nonfinite_in_a_row + 1, " in a row)"));
      });
      LOG(WARNING) << "scheduler: " << id << ": step " << step
                   << " had a non-finite loss or gradient and was skipped";
      const int max_in_a_row = spec.max_nonfinite_steps() > 0
                                   ? spec.max_nonfinite_steps()
                                   : options_.max_nonfinite_steps_in_a_row;
      if (++nonfinite_in_a_row >= max_in_a_row) {
        return absl::DataLossError(absl::StrCat(
            nonfinite_in_a_row, " non-finite steps in a row at step ", step,
            ": lower optim.lr, set optim.max_grad_norm, or check the data"));
      }
      continue;
    }
    nonfinite_in_a_row = 0;
    if (offload && !plan.overlap()) {
      RETURN_IF_ERROR(Call(optimizer_, &lspo::v1::Optimizer::StubInterface::Update, ureq, &urep,
                           dl, "optimizer"));
      lspo::v1::ApplyRequest areq;
      areq.set_job_id(id);
      areq.set_step(step);
      areq.set_lr(lr);
      for (const auto& t : plan_tasks) *areq.add_tasks() = t;
      RETURN_IF_ERROR(Call(worker_, &lspo::v1::Worker::StubInterface::ApplyUpdates, areq, &arep,
                           dl, "worker"));
    }
    lspo::v1::StepMetrics m = trep.metrics();
    if (offload) {
      m.set_update_seconds(urep.seconds());
      m.set_grad_norm(urep.grad_norm());
      m.set_apply_seconds(arep.seconds());
      m.set_optimizer_peak_rss_bytes(urep.peak_rss_bytes());
      // Timeline and cost model: every event of the step, worker and optimizer.
      std::vector<lspo::v1::LayerEvent> events(trep.events().begin(), trep.events().end());
      events.insert(events.end(), urep.events().begin(), urep.events().end());
      events.insert(events.end(), arep.events().begin(), arep.events().end());
      double first = std::numeric_limits<double>::infinity(), last = 0;
      for (const auto& e : trep.events()) {
        first = std::min(first, e.start());
        last = std::max(last, e.end());
      }
      for (const auto& e : arep.events()) last = std::max(last, e.end());
      const double gap = last_step_end > 0 && std::isfinite(first) ? first - last_step_end : -1;
      last_step_end = last;
      cost_model.Observe(events, gap);
      nlohmann::json tl;
      tl["step"] = step;
      tl["plan"] = {{"overlap", plan.overlap()},
                    {"split_layer", plan.split_layer()},
                    {"predicted_cost_seconds", choice.predicted_cost},
                    {"predicted_stall_seconds", choice.predicted_stall},
                    {"cost_by_split", choice.cost_by_split}};
      nlohmann::json ev = nlohmann::json::array();
      for (const auto& e : events) {
        ev.push_back({{"layer", e.layer()},
                      {"what", e.what()},
                      {"actor", e.actor()},
                      {"start", e.start()},
                      {"end", e.end()}});
      }
      tl["events"] = std::move(ev);
      tl["step_seconds"] = Now() - t0;
      tl["wait_seconds"] = m.wait_seconds();
      timeline << tl.dump() << "\n" << std::flush;
    }
    const double secs = Now() - t0;
    const double tokens_in = m.tokens_per_second() * m.step_seconds();
    m.set_step_seconds(secs);
    m.set_tokens_per_second(secs > 0 ? tokens_in / secs : 0);
    step_time_sum += secs;
    nlohmann::json j = ToJson(m);
    j["kind"] = "step";
    log_json(j);
    const double eta = (Now() - t_train) / (step - start_step) * (spec.steps() - step);
    LOG(INFO) << "scheduler: " << id << ": step " << step << "/" << spec.steps() << " loss "
              << m.loss() << " lr " << lr << " " << secs << " s"
              << (plan.overlap() ? absl::StrCat(" (overlap, split ", plan.split_layer(), ")")
                                 : std::string());
    {
      absl::MutexLock lock(&mu_);
      Job& job = jobs_[id];
      job.status.set_step(step);
      *job.status.mutable_last_step() = m;
      job.status.set_eta_seconds(eta);
      job.steps.push_back(m);
      ++job.version;
      PersistLocked(&job);
    }
    if (lsp && spec.lsp().check_freq() > 0 && step % spec.lsp().check_freq() == 0 &&
        step < spec.steps()) {
      RETURN_IF_ERROR(fit(step));
      if (spec.lsp().master_refresh() == "refit") {
        phase(absl::StrCat("refreshing worker weights from the master (step ", step, ")"));
        ASSIGN_OR_RETURN(double diff, refresh(/*measure_only=*/false));
        log_json({{"kind", "master_refresh"},
                  {"step", step},
                  {"max_abs_diff_before", diff},
                  {"max_abs_drift_beyond_rounding_before", last_drift}});
        LOG(INFO) << "scheduler: " << id << ": master refresh at step " << step
                  << ": max |W_worker - W_master| was " << diff;
      }
      phase("training");
    }
    if (has_eval && spec.eval_every() > 0 && step % spec.eval_every() == 0 &&
        step < spec.steps()) {
      ASSIGN_OR_RETURN(auto e, evaluate(step));
      (void)e;
      phase("training");
    }
    if (spec.checkpoint_every() > 0 &&
        (step % spec.checkpoint_every() == 0 || step == spec.steps())) {
      RETURN_IF_ERROR(checkpoint(step));
    }
  }
  if (lsp) {
    // How far the worker's weights drifted from the fp32 master since the last refresh.
    ASSIGN_OR_RETURN(double drift, refresh(/*measure_only=*/true));
    summary["final_worker_master_max_abs_diff"] = drift;
    summary["final_worker_master_drift_beyond_rounding"] = last_drift;
    log_json({{"kind", "master_drift"},
              {"step", spec.steps()},
              {"max_abs_diff", drift},
              {"max_abs_drift_beyond_rounding", last_drift}});
  }
  const int done_steps = spec.steps() - start_step - skipped;
  summary["skipped_steps"] = skipped;
  summary["train_seconds"] = Now() - t_train;
  summary["mean_step_seconds"] = done_steps > 0 ? step_time_sum / done_steps : 0.0;
  if (has_eval) {
    ASSIGN_OR_RETURN(lspo::v1::EvalMetrics fin, evaluate(spec.steps()));
    if (spec.data().format() == "classification") summary["final_accuracy"] = fin.accuracy();
    summary["final_eval_loss"] = fin.loss();
    if (fin.perplexity() > 0) summary["final_perplexity"] = fin.perplexity();
  }
  if (!spec.skip_checkpoint()) {
    Update(id, [&](JobStatus* s) {
      s->set_state(lspo::v1::CHECKPOINTING);
      s->set_phase("writing checkpoint");
    });
    lspo::v1::SaveRequest save;
    save.set_job_id(id);
    save.set_dir(out_dir);
    lspo::v1::SaveReply srep;
    RETURN_IF_ERROR(Call(worker_, &lspo::v1::Worker::StubInterface::SaveArtifacts, save, &srep,
                         dl, "worker"));
    if (offload) {
      lspo::v1::SaveReply orep;
      RETURN_IF_ERROR(Call(optimizer_, &lspo::v1::Optimizer::StubInterface::SaveModel, save,
                           &orep, dl, "optimizer"));
    }
  }
  summary["wall_seconds"] = Now() - t_start;
  summary["output_dir"] = out_dir;
  RETURN_IF_ERROR(runtime::WriteFileAtomically(out_dir + "/summary.json", summary.dump(2) + "\n"));
  LOG(INFO) << "scheduler: " << id << ": summary " << summary.dump();
  return absl::OkStatus();
}

}  // namespace lspo::scheduler
