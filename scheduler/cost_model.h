// The per-layer offload schedule's cost model (docs/method.md "Layer-wise schedule"; paper
// Sec. 4.3, whose reference implementation hand-tunes the split point per model — here it is chosen
// from measured per-layer times).
//
// One step of an L-layer model, times in seconds measured from the previous steps' timelines:
//   fwd[l], bwd[l]  worker forward / backward of layer l
//   offload[l]      worker time to write layer l's gradients into the arena
//   update[l]       optimizer time for layer l (subspace Adam for lsp, full Adam for zero)
//   apply[l]        worker time to apply layer l's update (W += P D Q^T, or copy params)
// Model (times relative to the start of the backward; the backward visits L-1 .. 0):
//   grad ready      g[l]   = sum_{k >= l} bwd[k] + offload[l]
//   CPU (FCFS)      done[l] = max(g[l], done[l+1]) + update[l]    (deepest first)
//                   with clipping, no update starts before every gradient is in:
//                   done[l] = max(g[0], done[l+1]) + update[l]
//   worker          after the backward (T_b = sum bwd) applies layers L-1 .. s as their
//                   updates arrive: c = max(c, done[l]) + apply[l]; then the next step's
//                   forward starts after `gap` and each layer l < s first waits for done[l]
//                   and applies it: start[l] = max(t, done[l]) + apply[l], t += fwd[l].
//   cost(s)         = time at which the next step's forward has passed every layer.
// The split s in [0, L] with the lowest cost is chosen (ties: the larger s, i.e. more layers
// applied eagerly, which keeps fewer updates pending).
//
// Thread-safety: plain values; LayerCostModel is not thread-safe.
#ifndef LSPO_SCHEDULER_COST_MODEL_H_
#define LSPO_SCHEDULER_COST_MODEL_H_

#include <vector>

#include "proto/metrics.pb.h"
#include "proto/worker.pb.h"

namespace lspo::scheduler {

// Per-layer times, seconds; every vector has L entries.
struct LayerTimes {
  std::vector<double> fwd, bwd, offload, update, apply;
  double gap = 0;  // Seconds between the end of a TrainStep and the next step's forward.
  int num_layers() const { return static_cast<int>(fwd.size()); }
};

struct SplitChoice {
  int split = 0;                      // Layers >= split are applied right after the backward.
  double predicted_cost = 0;          // cost(split), seconds (see the file comment).
  double predicted_stall = 0;         // Worker seconds waiting for updates under this split.
  std::vector<double> cost_by_split;  // cost(s) for s = 0 .. L.
};

// Evaluates every split (see the file comment). `clipping`: updates wait for all gradients.
// An empty model (L = 0) gives split 0 and cost 0.
SplitChoice ChooseSplit(const LayerTimes& t, bool clipping);

// Keeps a running estimate (exponential moving average, weight `smoothing` on the newest
// measurement) of every per-layer time from step timelines, and turns it into a plan.
class LayerCostModel {
 public:
  LayerCostModel(int num_layers, bool clipping, double smoothing = 0.5);

  // Folds in one step's timeline: worker events (forward, backward, offload, wait, apply) and
  // optimizer events (update), as produced by TrainStep / Update. Unknown kinds and layers
  // outside [0, L) are ignored. `gap`: seconds between the previous TrainStep's end and this
  // one's first forward (< 0 = unknown).
  void Observe(const std::vector<lspo::v1::LayerEvent>& events, double gap);

  // True once at least one step with per-layer backward and update times was observed.
  bool ready() const { return observed_; }

  // The plan for the next step: serial until ready(), then overlap with ChooseSplit's split.
  lspo::v1::StepPlan Plan(bool overlap_schedule, SplitChoice* choice) const;

  const LayerTimes& times() const { return times_; }

 private:
  LayerTimes times_;
  bool clipping_;
  double smoothing_;
  bool observed_ = false;
};

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_COST_MODEL_H_
