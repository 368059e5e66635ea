#include "scheduler/cost_model.h"

#include <algorithm>
#include <limits>
#include <map>

namespace lspo::scheduler {

namespace {

// cost(s) and the stall it implies (see the header).
std::pair<double, double> Simulate(const LayerTimes& t, const std::vector<double>& done, int s) {
  const int L = t.num_layers();
  double tb = 0;
  for (int l = 0; l < L; ++l) tb += t.bwd[l];
  double c = tb, stall = 0;
  for (int l = L - 1; l >= s; --l) {
    if (done[l] > c) {
      stall += done[l] - c;
      c = done[l];
    }
    c += t.apply[l];
  }
  double now = c + t.gap;
  for (int l = 0; l < L; ++l) {
    if (l < s) {
      if (done[l] > now) {
        stall += done[l] - now;
        now = done[l];
      }
      now += t.apply[l];
    }
    now += t.fwd[l];
  }
  return {now, stall};
}

}  // namespace

SplitChoice ChooseSplit(const LayerTimes& t, bool clipping) {
  SplitChoice out;
  const int L = t.num_layers();
  if (L == 0) {
    out.cost_by_split.push_back(0);
    return out;
  }
  std::vector<double> ready(L), done(L);
  double suffix = 0;
  for (int l = L - 1; l >= 0; --l) {
    suffix += t.bwd[l];
    ready[l] = suffix + t.offload[l];
  }
  double cpu = 0;
  for (int l = L - 1; l >= 0; --l) {
    const double start = std::max(clipping ? ready[0] : ready[l], cpu);
    cpu = start + t.update[l];
    done[l] = cpu;
  }
  double best = std::numeric_limits<double>::infinity();
  for (int s = 0; s <= L; ++s) {
    auto [cost, stall] = Simulate(t, done, s);
    out.cost_by_split.push_back(cost);
    if (cost <= best) {  // ties prefer the larger split
      best = cost;
      out.split = s;
      out.predicted_cost = cost;
      out.predicted_stall = stall;
    }
  }
  return out;
}

LayerCostModel::LayerCostModel(int num_layers, bool clipping, double smoothing)
    : clipping_(clipping), smoothing_(smoothing) {
  const size_t n = static_cast<size_t>(std::max(num_layers, 0));
  times_.fwd.assign(n, 0);
  times_.bwd.assign(n, 0);
  times_.offload.assign(n, 0);
  times_.update.assign(n, 0);
  times_.apply.assign(n, 0);
}

void LayerCostModel::Observe(const std::vector<lspo::v1::LayerEvent>& events, double gap) {
  const int L = times_.num_layers();
  std::map<std::string, std::vector<double>> sum;
  for (const char* k : {"forward", "backward", "offload", "update", "apply"}) {
    sum[k].assign(L, 0);
  }
  bool have_bwd = false, have_update = false;
  // A worker on CUDA also reports device-clock spans (actor "gpu": forward/backward/apply on
  // the compute stream, and compress inside backward; actor "pcie": d2h/h2d copies). Its host
  // spans then only time the enqueueing (and its "offload" runs from enqueue to landing), so
  // use the device's.
  const bool gpu = std::any_of(events.begin(), events.end(),
                               [](const lspo::v1::LayerEvent& e) { return e.actor() == "gpu"; });
  for (const auto& e : events) {
    if (e.layer() < 0 || e.layer() >= L) continue;
    std::string what = e.what();
    if (gpu) {
      if ((what == "forward" || what == "backward" || what == "apply") && e.actor() != "gpu") {
        continue;
      }
      if (what == "offload") continue;
      if (what == "d2h") what = "offload";
    }
    auto it = sum.find(what);
    if (it == sum.end()) continue;
    it->second[e.layer()] += std::max(0.0, e.end() - e.start());
    have_bwd |= what == "backward";
    have_update |= what == "update";
  }
  if (!have_bwd || !have_update) return;
  const double w = observed_ ? smoothing_ : 1.0;
  auto fold = [w](std::vector<double>* est, const std::vector<double>& x) {
    for (size_t l = 0; l < est->size(); ++l) (*est)[l] = (1 - w) * (*est)[l] + w * x[l];
  };
  fold(&times_.fwd, sum["forward"]);
  fold(&times_.bwd, sum["backward"]);
  fold(&times_.offload, sum["offload"]);
  fold(&times_.update, sum["update"]);
  fold(&times_.apply, sum["apply"]);
  if (gap >= 0) times_.gap = (1 - w) * times_.gap + w * gap;
  observed_ = true;
}

lspo::v1::StepPlan LayerCostModel::Plan(bool overlap_schedule, SplitChoice* choice) const {
  lspo::v1::StepPlan plan;
  if (!overlap_schedule || !observed_) {
    plan.set_overlap(false);
    plan.set_split_layer(0);
    return plan;
  }
  SplitChoice c = ChooseSplit(times_, clipping_);
  plan.set_overlap(true);
  plan.set_split_layer(c.split);
  if (choice != nullptr) *choice = std::move(c);
  return plan;
}

}  // namespace lspo::scheduler
