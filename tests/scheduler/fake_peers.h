// Fakes of the scheduler's peers (scheduler/peer_clients.h) and of its JobHost, for unit tests
// of the job runner and the scheduler core without services, models or an arena.
//
// The fakes record every call as "peer.Method:step" (step = the request's step, or -1) in one
// shared, mutex-guarded log (the overlapped step calls both peers from two threads). A fake
// model has `layers` decoder layers of 7 linears; TrainStep reports one backward event per
// layer and Update one update event per layer, so the scheduler's cost model becomes ready
// after step 1 and later steps of an overlap job really overlap. Behaviours are injected per
// step: non-finite steps, a failing call, a hang (the call waits its full deadline and fails
// with kDeadlineExceeded, as a frozen gRPC peer would, or returns kAborted earlier when that
// step is aborted with AbortStep), or a callback run inside TrainStep (e.g. to request a
// cancel mid-step). As the real optimizer does, an Update with wait_for_grads waits until the
// worker's TrainStep of that step has published its gradients (CallLog::published_step), or
// until the step is aborted (then it answers OK with aborted = true), or until its
// wait_timeout_seconds pass (kDeadlineExceeded). Save calls write a small file into the
// checkpoint directory so checksums have content.
#ifndef LSPO_TESTS_SCHEDULER_FAKE_PEERS_H_
#define LSPO_TESTS_SCHEDULER_FAKE_PEERS_H_

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "offload/training_mode.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/job_runner.h"
#include "runtime/status_macros.h"
#include "scheduler/peer_clients.h"

namespace lspo::scheduler::testing {

// The calls both fakes made, in order.
class CallLog {
 public:
  void Add(const std::string& peer, const std::string& method, int step) {
    absl::MutexLock lock(&mu_);
    calls_.push_back(absl::StrCat(peer, ".", method, ":", step));
  }
  std::vector<std::string> All() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // Steps of the calls of `peer.method`, in order.
  std::vector<int> Steps(const std::string& peer_method) const {
    std::vector<int> out;
    for (const std::string& c : All()) {
      const size_t colon = c.rfind(':');
      if (c.substr(0, colon) == peer_method) out.push_back(std::stoi(c.substr(colon + 1)));
    }
    return out;
  }
  int Count(const std::string& peer_method) const {
    return static_cast<int>(Steps(peer_method).size());
  }
  // The last step whose TrainStep completed (its gradients "published" to the optimizer).
  std::atomic<int> published_step{0};

 private:
  mutable absl::Mutex mu_;
  std::vector<std::string> calls_ ABSL_GUARDED_BY(mu_);
};

// What one fake does at a given step (or, step -1, whenever the method is called).
struct Behaviour {
  std::map<int, absl::Status> fail;  // step -> the status the call returns
  std::set<int> hang;                // steps at which the call hangs (see the file comment)
};

inline void WriteMarker(const std::string& dir, const std::string& name) {
  if (std::FILE* f = std::fopen((dir + "/" + name).c_str(), "w")) {
    std::fputs(name.c_str(), f);
    std::fclose(f);
  }
}

// Waits until `ready()` or `deadline_s`; true when ready() became true.
inline bool WaitFor(const std::function<bool()>& ready, double deadline_s) {
  const auto end = std::chrono::steady_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000));
  while (!ready()) {
    if (std::chrono::steady_clock::now() >= end) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// Waits until step `step` is aborted or `deadline_s` pass, then fails like a frozen peer.
inline absl::Status Hang(const std::atomic<int>& aborted_step, int step, double deadline_s,
                         const std::string& peer) {
  if (WaitFor([&] { return aborted_step == step; }, deadline_s)) {
    return absl::AbortedError(absl::StrCat(peer, ": step ", step, " abandoned (AbortStep)"));
  }
  return absl::DeadlineExceededError(absl::StrCat(peer, ": Deadline Exceeded"));
}

inline absl::Status Inject(const Behaviour& b, int step, const std::atomic<int>& aborted_step,
                           double deadline_s, const std::string& peer) {
  for (int key : {step, -1}) {
    if (b.hang.count(key)) return Hang(aborted_step, step, deadline_s, peer);
    auto it = b.fail.find(key);
    if (it != b.fail.end()) return it->second;
  }
  return absl::OkStatus();
}

class FakeWorker final : public WorkerClient {
 public:
  FakeWorker(CallLog* log, int layers, int eval_examples)
      : log_(log), layers_(layers), eval_examples_(eval_examples) {}

  std::map<std::string, Behaviour> behaviour;  // method name -> behaviour
  std::set<int> nonfinite_steps;
  std::function<void(int step)> on_train_step;  // runs inside TrainStep
  // The micro-batch this worker "chooses" when the spec leaves it unset (0: none, the reply
  // says 0, as a worker of an older version), and the spec of the last LoadJob.
  int32_t chosen_micro_batch = 0;
  lspo::v1::JobSpec loaded_spec;
  std::string device = "cpu";  // what LoadJob says the job trains on

  absl::StatusOr<lspo::v1::LoadJobReply> LoadJob(const lspo::v1::LoadJobRequest& r,
                                                 double d) override {
    RETURN_IF_ERROR(Record("LoadJob", -1, d));
    loaded_spec = r.spec();
    lspo::v1::LoadJobReply rep;
    rep.set_device(device);
    rep.set_micro_batch_size(r.spec().has_micro_batch_size() ? r.spec().micro_batch_size()
                                                             : chosen_micro_batch);
    // As the worker resolves it: the default for the weights of `device` when unset.
    rep.set_refresh_every(offload::LspRefreshEvery(
        r.spec(), offload::SixteenBitWorkerWeights(r.spec(), device.rfind("cuda", 0) == 0)));
    if (r.spec().mode() != lspo::v1::MODE_NATIVE) {
      lspo::v1::ArenaLayout* a = rep.mutable_arena();
      a->set_linears_per_layer(7);
      for (int i = 0; i < 7 * layers_; ++i) {
        auto* slot = a->add_linears();
        slot->set_index(i);
        slot->set_name(absl::StrCat("model.layers.", i / 7, ".linear", i % 7));
      }
    }
    rep.set_train_examples(64);
    rep.set_eval_examples(eval_examples_);
    rep.set_trainable_parameters(1000);
    return rep;
  }
  absl::StatusOr<lspo::v1::UnloadJobReply> UnloadJob(const lspo::v1::UnloadJobRequest&,
                                                     double d) override {
    RETURN_IF_ERROR(Record("UnloadJob", -1, d));
    return lspo::v1::UnloadJobReply();
  }
  absl::StatusOr<lspo::v1::FitProjectorsReply> FitProjectors(
      const lspo::v1::FitProjectorsRequest& r, double d) override {
    RETURN_IF_ERROR(Record("FitProjectors", r.step(), d));
    lspo::v1::FitProjectorsReply rep;
    for (int i = 0; i < 7 * layers_; ++i) {
      rep.add_refitted(i);
      rep.add_initial_error(0.5);
      rep.add_final_error(0.25);
    }
    return rep;
  }
  absl::StatusOr<lspo::v1::TrainStepReply> TrainStep(const lspo::v1::TrainStepRequest& r,
                                                     double d) override {
    if (on_train_step) on_train_step(r.step());
    plans.push_back(r.plan().overlap());
    RETURN_IF_ERROR(Record("TrainStep", r.step(), d));
    log_->published_step = r.step();
    lspo::v1::TrainStepReply rep;
    rep.set_nonfinite(nonfinite_steps.count(r.step()) > 0);
    rep.mutable_metrics()->set_step(r.step());
    rep.mutable_metrics()->set_loss(1.0 / r.step());
    const double t = 100.0 * r.step();
    for (int l = 0; l < layers_; ++l) {
      auto* e = rep.add_events();
      e->set_layer(l);
      e->set_what("backward");
      e->set_actor("worker");
      e->set_start(t + l);
      e->set_end(t + l + 0.5);
    }
    return rep;
  }
  absl::StatusOr<lspo::v1::ApplyReply> ApplyUpdates(const lspo::v1::ApplyRequest& r,
                                                    double d) override {
    RETURN_IF_ERROR(Record("ApplyUpdates", r.step(), d));
    return lspo::v1::ApplyReply();
  }
  absl::StatusOr<lspo::v1::EvaluateReply> Evaluate(const lspo::v1::EvaluateRequest& r,
                                                   double d,
                                                   const std::function<bool()>&) override {
    RETURN_IF_ERROR(Record("Evaluate", r.step(), d));
    lspo::v1::EvaluateReply rep;
    rep.mutable_metrics()->set_step(r.step());
    rep.mutable_metrics()->set_accuracy(0.05 + 0.1 * r.step());
    rep.mutable_metrics()->set_loss(2.0 / (1 + r.step()));
    return rep;
  }
  absl::StatusOr<lspo::v1::SaveReply> SaveArtifacts(const lspo::v1::SaveRequest& r,
                                                    double d) override {
    RETURN_IF_ERROR(Record("SaveArtifacts", -1, d));
    WriteMarker(r.dir(), "config.json");
    return lspo::v1::SaveReply();
  }
  absl::StatusOr<lspo::v1::LayerWeightsReply> ImportLayerWeights(
      const lspo::v1::LayerWeightsRequest& r, double d) override {
    RETURN_IF_ERROR(Record(r.measure_only()   ? "MeasureLayerWeights"
                           : r.skip_measure() ? "RefreshLayerWeights"
                                              : "ImportLayerWeights",
                           r.layer(), d));
    lspo::v1::LayerWeightsReply rep;
    rep.set_max_abs_change(0.001 * (r.layer() + 1));
    return rep;
  }
  absl::StatusOr<lspo::v1::AbortStepReply> AbortStep(const lspo::v1::AbortStepRequest& r,
                                                     double) override {
    log_->Add("worker", "AbortStep", r.step());
    aborted_step_ = r.step();
    return lspo::v1::AbortStepReply();
  }
  absl::StatusOr<lspo::v1::StateReply> SaveState(const lspo::v1::StateRequest& r,
                                                 double d) override {
    RETURN_IF_ERROR(Record("SaveState", r.step(), d));
    WriteMarker(r.dir(), "worker_state.safetensors");
    return lspo::v1::StateReply();
  }
  absl::StatusOr<lspo::v1::StateReply> LoadState(const lspo::v1::StateRequest& r,
                                                 double d) override {
    RETURN_IF_ERROR(Record("LoadState", r.step(), d));
    loaded_state_dir = r.dir();
    return lspo::v1::StateReply();
  }

  std::vector<bool> plans;  // TrainStep: plan().overlap() per call
  std::string loaded_state_dir;

 private:
  // Records the call and applies the injected behaviour; a non-OK status is returned.
  absl::Status Record(const std::string& method, int step, double deadline_s) {
    log_->Add("worker", method, step);
    auto it = behaviour.find(method);
    if (it == behaviour.end()) return absl::OkStatus();
    return Inject(it->second, step, aborted_step_, deadline_s, "worker");
  }

  CallLog* log_;
  int layers_;
  int eval_examples_;
  std::atomic<int> aborted_step_{-1};
};

class FakeOptimizer final : public OptimizerClient {
 public:
  FakeOptimizer(CallLog* log, int layers) : log_(log), layers_(layers) {}

  std::map<std::string, Behaviour> behaviour;

  absl::StatusOr<lspo::v1::LoadJobReply> LoadJob(const lspo::v1::LoadJobRequest& r,
                                                 double d) override {
    RETURN_IF_ERROR(Record("LoadJob", -1, d));
    arena_layers = r.arena().linears_size() / std::max(1, r.arena().linears_per_layer());
    return lspo::v1::LoadJobReply();
  }
  absl::StatusOr<lspo::v1::UnloadJobReply> UnloadJob(const lspo::v1::UnloadJobRequest&,
                                                     double d) override {
    RETURN_IF_ERROR(Record("UnloadJob", -1, d));
    return lspo::v1::UnloadJobReply();
  }
  absl::StatusOr<lspo::v1::SetProjectorsReply> SetProjectors(
      const lspo::v1::SetProjectorsRequest& r, double d) override {
    RETURN_IF_ERROR(Record("SetProjectors", r.indices_size(), d));
    return lspo::v1::SetProjectorsReply();
  }
  absl::StatusOr<lspo::v1::UpdateReply> Update(const lspo::v1::UpdateRequest& r,
                                               double d) override {
    RETURN_IF_ERROR(Record("Update", r.step(), d));
    lspo::v1::UpdateReply rep;
    if (r.wait_for_grads()) {
      const int step = r.step();
      if (!WaitFor([&] { return log_->published_step >= step || aborted_step_ == step; },
                   r.wait_timeout_seconds())) {
        return absl::DeadlineExceededError(
            absl::StrCat("optimizer: the gradients of step ", step, " did not arrive"));
      }
      if (aborted_step_ == step) {
        rep.set_aborted(true);
        return rep;
      }
    }
    const double t = 100.0 * r.step();
    for (int l = 0; l < layers_; ++l) {
      auto* e = rep.add_events();
      e->set_layer(l);
      e->set_what("update");
      e->set_actor("optimizer");
      e->set_start(t + l + 0.5);
      e->set_end(t + l + 0.7);
    }
    return rep;
  }
  absl::StatusOr<lspo::v1::SaveReply> SaveModel(const lspo::v1::SaveRequest& r,
                                                double d) override {
    RETURN_IF_ERROR(Record("SaveModel", -1, d));
    WriteMarker(r.dir(), "model.safetensors");
    return lspo::v1::SaveReply();
  }
  absl::StatusOr<lspo::v1::AbortStepReply> AbortStep(const lspo::v1::AbortStepRequest& r,
                                                     double) override {
    log_->Add("optimizer", "AbortStep", r.step());
    aborted_step_ = r.step();
    return lspo::v1::AbortStepReply();
  }
  absl::StatusOr<lspo::v1::LayerWeightsReply> ExportLayerWeights(
      const lspo::v1::LayerWeightsRequest& r, double d) override {
    RETURN_IF_ERROR(Record("ExportLayerWeights", r.layer(), d));
    return lspo::v1::LayerWeightsReply();
  }
  absl::StatusOr<lspo::v1::StateReply> SaveState(const lspo::v1::StateRequest& r,
                                                 double d) override {
    RETURN_IF_ERROR(Record("SaveState", r.step(), d));
    WriteMarker(r.dir(), "optimizer_state.safetensors");
    return lspo::v1::StateReply();
  }
  absl::StatusOr<lspo::v1::StateReply> LoadState(const lspo::v1::StateRequest& r,
                                                 double d) override {
    RETURN_IF_ERROR(Record("LoadState", r.step(), d));
    return lspo::v1::StateReply();
  }

  int arena_layers = 0;

 private:
  absl::Status Record(const std::string& method, int step, double deadline_s) {
    log_->Add("optimizer", method, step);
    auto it = behaviour.find(method);
    if (it == behaviour.end()) return absl::OkStatus();
    return Inject(it->second, step, aborted_step_, deadline_s, "optimizer");
  }

  CallLog* log_;
  int layers_;
  std::atomic<int> aborted_step_{-1};
};

// A JobHost that keeps one status, like the scheduler core does for one job.
class FakeHost final : public JobHost {
 public:
  void UpdateStatus(const std::function<void(lspo::v1::JobStatus*)>& fn) override {
    absl::MutexLock lock(&mu_);
    fn(&status_);
  }
  void RecordStep(const lspo::v1::StepMetrics& m, double eta_seconds) override {
    absl::MutexLock lock(&mu_);
    status_.set_step(m.step());
    *status_.mutable_last_step() = m;
    status_.set_eta_seconds(eta_seconds);
    steps_.push_back(m.step());
  }
  bool CancelRequested() const override { return cancel; }
  std::vector<lspo::v1::EvalMetrics> Evals() const override {
    absl::MutexLock lock(&mu_);
    return {status_.evals().begin(), status_.evals().end()};
  }
  lspo::v1::JobStatus status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  std::vector<int> steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  std::atomic<bool> cancel{false};

 private:
  mutable absl::Mutex mu_;
  lspo::v1::JobStatus status_ ABSL_GUARDED_BY(mu_);
  std::vector<int> steps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lspo::scheduler::testing

#endif  // LSPO_TESTS_SCHEDULER_FAKE_PEERS_H_
