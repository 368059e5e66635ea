// JobRunner's projector fits and master-weight refreshes (scheduler/job_runner.h): the fit at a
// projector check, the refresh of every layer after it (or the drift measured at the end), and
// lsp.refresh_every's rolling refresh of a few layers after each step.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "runtime/status_macros.h"
#include "scheduler/job_runner.h"

namespace lspo::scheduler {

namespace v1 = lspo::v1;

absl::Status JobRunner::Fit(int step) {
  Phase(absl::StrCat("fitting projectors (step ", step, ")"));
  v1::FitProjectorsRequest req;
  req.set_job_id(id_);
  req.set_step(step);
  ASSIGN_OR_RETURN(v1::FitProjectorsReply rep, worker_->FitProjectors(req, dl_));
  v1::SetProjectorsRequest sp;
  sp.set_job_id(id_);
  *sp.mutable_indices() = rep.refitted();
  RETURN_IF_ERROR(optimizer_->SetProjectors(sp, dl_).status());
  double init = 0, fin = 0;
  int n = 0;
  for (int k = 0; k < rep.final_error_size(); ++k) {
    if (!std::isfinite(rep.final_error(k)) || !std::isfinite(rep.initial_error(k))) continue;
    init += rep.initial_error(k);
    fin += rep.final_error(k);
    ++n;
  }
  n = std::max(n, 1);
  Log({{"kind", "projector_fit"},
       {"step", step},
       {"refitted", rep.refitted_size()},
       {"mean_initial_relative_bias", init / n},
       {"mean_final_relative_bias", fin / n},
       {"seconds", rep.seconds()}});
  LOG(INFO) << "scheduler: " << id_ << ": projectors: " << rep.refitted_size()
            << " refitted, mean relative estimation bias " << init / n << " -> " << fin / n << " ("
            << rep.seconds() << " s)";
  host_->UpdateStatus([&](v1::JobStatus* s) { s->set_mean_projector_error(fin / n); });
  if (step == 0) {
    summary_["projector_initial_relative_bias"] = init / n;
    summary_["projector_fitted_relative_bias"] = fin / n;
    summary_["projector_fit_seconds"] = rep.seconds();
  }
  return absl::OkStatus();
}

absl::StatusOr<double> JobRunner::Refresh(bool measure_only) {
  // The optimizer writes each layer's fp32 master weights into the arena staging region and
  // the worker copies them in (or, measure_only, reports max |W_worker - W_master| without
  // copying). Returns that maximum over all layers.
  double max_diff = 0;
  last_drift_ = 0;
  last_drift_ulps_ = 0;
  for (int l = 0; l < num_layers_; ++l) {
    v1::LayerWeightsRequest req;
    req.set_job_id(id_);
    req.set_layer(l);
    req.set_measure_only(measure_only);
    RETURN_IF_ERROR(optimizer_->ExportLayerWeights(req, dl_).status());
    ASSIGN_OR_RETURN(v1::LayerWeightsReply rep, worker_->ImportLayerWeights(req, dl_));
    max_diff = std::max(max_diff, rep.max_abs_change());
    last_drift_ = std::max(last_drift_, rep.max_abs_drift());
    last_drift_ulps_ = std::max(last_drift_ulps_, rep.max_drift_ulps());
  }
  return max_diff;
}

std::vector<int> RollingRefreshLayers(int step, int every, int num_layers) {
  std::vector<int> layers;
  if (every <= 0 || num_layers <= 0) return layers;
  for (int l = 0; l < num_layers; ++l) {
    const int64_t phase = static_cast<int64_t>(l) * every / num_layers;  // in [0, every)
    if ((static_cast<int64_t>(step) + phase) % every == 0) layers.push_back(l);
  }
  return layers;
}

absl::Status JobRunner::RollingRefresh(int step) {
  const double t0 = Now();
  for (int l : RollingRefreshLayers(step, spec_.lsp().refresh_every(), num_layers_)) {
    v1::LayerWeightsRequest req;
    req.set_job_id(id_);
    req.set_layer(l);
    req.set_skip_measure(true);
    RETURN_IF_ERROR(optimizer_->ExportLayerWeights(req, dl_).status());
    RETURN_IF_ERROR(worker_->ImportLayerWeights(req, dl_).status());
    ++rolling_refreshes_;
  }
  rolling_refresh_seconds_ += Now() - t0;
  return absl::OkStatus();
}

}  // namespace lspo::scheduler
