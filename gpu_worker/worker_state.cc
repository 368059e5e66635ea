// Shapes: W (m, n), m out features, n in features, as stored (fp32 or bf16).
#include "gpu_worker/worker_state.h"

#include <chrono>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gpu_worker/update_path.h"
#include "gpu_worker/worker_job.h"
#include "model/safetensors.h"
#include "offload/state_file.h"
#include "offload/torch_call.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

namespace {

absl::Status CheckStateMeta(const model::SafetensorsFile& file, const std::string& path,
                            const char* mode, int step) {
  const auto& meta = file.metadata();
  auto get = [&](const char* key) {
    auto it = meta.find(key);
    return it == meta.end() ? std::string() : it->second;
  };
  if (get("mode") != mode || get("step") != std::to_string(step)) {
    return absl::DataLossError(absl::StrCat(
        "'", path, "' holds the ", get("mode"), " state of step ", get("step"), ", expected ", mode,
        " at step ", step, ": the checkpoint directory is inconsistent"));
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
      tensors.emplace_back(job->linears[i].name,
                           job->model->LinearWeight(static_cast<int64_t>(i)).detach());
    }
    std::map<std::string, std::string> metadata = {
        {"job_id", job->id}, {"mode", job->path->name()}, {"step", std::to_string(step)}};
    // The mode's tensors (lsp: projectors) and metadata; its own files (native: AdamW).
    lspo::v1::StateReply mode_files;
    RETURN_IF_ERROR(job->path->SaveState(job, dir, &tensors, &metadata, &mode_files));
    const std::string path = dir + "/worker_state.safetensors";
    RETURN_IF_ERROR(offload::WriteTensorFile(path, tensors, metadata));
    reply.add_files(path);
    for (const std::string& f : mode_files.files()) reply.add_files(f);
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
  RETURN_IF_ERROR(CheckStateMeta(file, path, job->path->name(), step));
  const std::string what = absl::StrCat("worker state '", path, "'");
  RETURN_IF_ERROR(offload::TorchCall("load worker state", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    // Read and validate everything first, then commit.
    std::vector<at::Tensor> weights;  // per linear (m, n) in W's dtype: file views
    for (size_t i = 0; i < job->linears.size(); ++i) {
      const offload::LinearShape& ls = job->linears[i];
      at::Tensor& w = job->model->LinearWeight(static_cast<int64_t>(i));  // (m, n) as stored
      // (m, n) in W's dtype, a read-only view of the file.
      ASSIGN_OR_RETURN(at::Tensor t,
                       offload::ViewStateTensor(file, what, ls.name, w.scalar_type(), w.sizes()));
      weights.push_back(std::move(t));
    }
    ASSIGN_OR_RETURN(UpdatePath::Commit commit, job->path->ReadState(job, file, what, dir));
    for (size_t i = 0; i < job->linears.size(); ++i) {
      job->model->LinearWeight(static_cast<int64_t>(i)).copy_(weights[i]);
      job->plane.pending_step[i] = 0;
    }
    return commit();
  }));
  LOG(INFO) << "worker: restored the state of step " << step << " from " << dir;
  lspo::v1::StateReply reply;
  reply.add_files(path);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

}  // namespace lspo::worker
