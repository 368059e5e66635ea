#include "gpu_worker/worker_state.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <limits>
#include <set>
#include <cstdlib>

#include <torch/torch.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "data/datasets.h"
#include "glog/logging.h"
#include "offload/arena_tensors.h"
#include "offload/state_file.h"
#include "gpu_worker/device_offload.h"
#include "offload/job_assets.h"
#include "offload/torch_call.h"
#include "lsp/fit.h"
#include "lsp/lsp_linear.h"
#include "lsp/projector.h"
#include "model/safetensors.h"
#include "runtime/clock.h"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"
#include "tbb/global_control.h"

#include "gpu_worker/worker_job.h"

namespace lspo::worker {

using runtime::MonotonicSeconds;

namespace {

const char* ModeName(const WorkerJob& job) {
  return job.lsp ? "lsp" : job.zero ? "zero" : "native";
}

absl::Status CheckStateMeta(const model::SafetensorsFile& file, const std::string& path,
                            const char* mode, int step) {
  const auto& meta = file.metadata();
  auto get = [&](const char* key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  if (get("mode") != mode || get("step") != std::to_string(step)) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "' holds the ", get("mode"), " state of step ", get("step"), ", expected ",
        mode, " at step ", step, ": the checkpoint directory is inconsistent"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<lspo::v1::StateReply> SaveWorkerState(WorkerJob* job, const std::string& dir,
                                                     int step) {
  auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(offload::TorchCall("flush updates", [&] { return ApplyPending(job, -1); }));
  lspo::v1::StateReply reply;
  RETURN_IF_ERROR(offload::TorchCall("save worker state", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    offload::NamedTensors tensors;
    for (size_t i = 0; i < job->linears.size(); ++i) {
      const std::string& name = job->linears[i].name;
      tensors.emplace_back(name, job->model->LinearWeight(static_cast<int64_t>(i)).detach());
      if (job->lsp && job->p[i].rows > 0) {
        offload::AppendProjector(name + ".p", job->p[i], &tensors);
        offload::AppendProjector(name + ".q", job->q[i], &tensors);
      }
    }
    const std::string path = dir + "/worker_state.safetensors";
    RETURN_IF_ERROR(offload::WriteTensorFile(
        path, tensors,
        {{"job_id", job->id}, {"mode", ModeName(*job)}, {"step", std::to_string(step)},
         {"fitted", job->fitted ? "1" : "0"}}));
    reply.add_files(path);
    if (job->adamw != nullptr) {
      const std::string opt_path = dir + "/worker_adamw.pt";
      torch::save(*job->adamw, opt_path);
      reply.add_files(opt_path);
    }
    return absl::OkStatus();
  }));
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::StateReply> LoadWorkerState(WorkerJob* job, const std::string& dir,
                                                     int step) {
  auto t0 = std::chrono::steady_clock::now();
  const std::string path = dir + "/worker_state.safetensors";
  ASSIGN_OR_RETURN(model::SafetensorsFile file, model::SafetensorsFile::Open(path));
  RETURN_IF_ERROR(CheckStateMeta(file, path, ModeName(*job), step));
  const std::string what = absl::StrCat("worker state '", path, "'");
  RETURN_IF_ERROR(offload::TorchCall("load worker state", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    // Read and validate everything first, then commit.
    std::vector<at::Tensor> weights;
    std::vector<lsp::SparseProjector> p(job->linears.size()), q(job->linears.size());
    const bool fitted = file.metadata().count("fitted") && file.metadata().at("fitted") == "1";
    for (size_t i = 0; i < job->linears.size(); ++i) {
      const offload::LinearShape& ls = job->linears[i];
      at::Tensor& w = job->model->LinearWeight(static_cast<int64_t>(i));
      ASSIGN_OR_RETURN(at::Tensor t,
                       offload::ViewStateTensor(file, what, ls.name, w.scalar_type(), w.sizes()));
      weights.push_back(std::move(t));
      if (job->lsp && fitted) {
        const int64_t d = job->layout.d(), r = job->layout.r();
        ASSIGN_OR_RETURN(p[i], offload::ReadStateProjector(file, what, ls.name + ".p", ls.m, d, r));
        ASSIGN_OR_RETURN(q[i], offload::ReadStateProjector(file, what, ls.name + ".q", ls.n, d, r));
      }
    }
    for (size_t i = 0; i < job->linears.size(); ++i) {
      job->model->LinearWeight(static_cast<int64_t>(i)).copy_(weights[i]);
      job->pending_step[i] = 0;
      if (job->lsp && fitted) {
        const auto& slot = job->layout.linears(static_cast<int>(i));
        RETURN_IF_ERROR(offload::WriteProjector(job->arena, slot.p_index(), slot.p_value(), p[i]));
        RETURN_IF_ERROR(offload::WriteProjector(job->arena, slot.q_index(), slot.q_value(), q[i]));
        if (job->cuda) {
          p[i] = p[i].To(job->device);
          q[i] = q[i].To(job->device);
        }
        RETURN_IF_ERROR(job->lsp_linears->SetProjectors(static_cast<int64_t>(i), p[i], q[i]));
        job->p[i] = std::move(p[i]);
        job->q[i] = std::move(q[i]);
      }
    }
    if (job->lsp && fitted) {
      job->model->SetLinearMode(model::LinearMode::kCustom);
      job->fitted = true;
    }
    if (job->adamw != nullptr) {
      const std::string opt_path = dir + "/worker_adamw.pt";
      if (access(opt_path.c_str(), R_OK) != 0) {
        return absl::NotFoundError(absl::StrCat("'", opt_path, "' is missing: the checkpoint "
                                                "has no AdamW state for this native job"));
      }
      torch::load(*job->adamw, opt_path);
    }
    return absl::OkStatus();
  }));
  LOG(INFO) << "worker: restored the state of step " << step << " from " << dir;
  lspo::v1::StateReply reply;
  reply.add_files(path);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

}  // namespace lspo::worker
