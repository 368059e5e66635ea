#include "cpu_optimizer_service/optimizer_core.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gpu_worker/arena_io.h"
#include "gpu_worker/job_assets.h"
#include "gpu_worker/torch_call.h"
#include "lsp/adam.h"
#include "lsp/fit.h"
#include "lsp/projector.h"
#include "model/safetensors.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"

namespace lspo::optimizer {

struct LinearState {
  at::Tensor base;      // (m, n) fp32 materialised master weight.
  at::Tensor sum_d;     // (d, d) fp32 sum of this subspace's steps.
  lsp::SparseProjector p, q;
  std::unique_ptr<lsp::SubspaceAdam> adam;
};

struct OptimizerJob {
  std::string id;
  lspo::v1::JobSpec spec;
  lspo::v1::ArenaLayout layout;
  runtime::ShmArena arena;
  std::unique_ptr<model::LlamaModel> model;  // W0 and frozen tensors.
  std::vector<LinearState> linears;
};

namespace {

}  // namespace

OptimizerCore::OptimizerCore() = default;
OptimizerCore::~OptimizerCore() = default;

absl::StatusOr<OptimizerJob*> OptimizerCore::Find(const std::string& job_id) {
  if (job_ == nullptr || job_->id != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' is not loaded on this optimizer (LoadJob first)"));
  }
  return job_.get();
}

absl::StatusOr<lspo::v1::LoadJobReply> OptimizerCore::LoadJob(
    const std::string& job_id, const lspo::v1::JobSpec& spec,
    const lspo::v1::ArenaLayout& layout) {
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr) {
    LOG(WARNING) << "optimizer: replacing stale job " << job_->id << " with " << job_id;
    job_.reset();
  }
  auto t0 = std::chrono::steady_clock::now();
  at::set_num_threads(spec.num_threads());
  auto job = std::make_unique<OptimizerJob>();
  job->id = job_id;
  job->spec = spec;
  job->layout = layout;
  ASSIGN_OR_RETURN(job->arena, runtime::ShmArena::Attach(layout.name(), layout.bytes()));
  ASSIGN_OR_RETURN(auto m, worker::LoadJobModel(spec));
  job->model = std::make_unique<model::LlamaModel>(std::move(m));
  if (layout.linears_size() != job->model->num_linears()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena layout has ", layout.linears_size(), " matrices, the model ",
        job->model->num_linears(), ": worker and optimizer loaded different models"));
  }
  int64_t params = 0;
  for (int i = 0; i < layout.linears_size(); ++i) {
    const auto& slot = layout.linears(i);
    LinearState st;
    st.base = job->model->LinearWeight(i).detach().clone();  // (m, n) fp32
    if (st.base.size(0) != slot.m() || st.base.size(1) != slot.n()) {
      return absl::InvalidArgumentError(absl::StrCat("arena slot ", slot.name(),
                                                     " shape differs from the model"));
    }
    st.sum_d = at::zeros({layout.d(), layout.d()}, at::kFloat);
    st.adam = std::make_unique<lsp::SubspaceAdam>(layout.d());
    params += st.base.numel();
    job->linears.push_back(std::move(st));
  }
  lspo::v1::LoadJobReply reply;
  reply.set_trainable_parameters(params);
  reply.set_device("cpu");
  reply.set_seconds(runtime::SecondsSince(t0));
  LOG(INFO) << "optimizer: loaded job " << job_id << ": fp32 master weights of " << params
            << " parameters, subspace d = " << layout.d();
  job_ = std::move(job);
  return reply;
}

absl::Status OptimizerCore::SetProjectors(const std::string& job_id,
                                          const std::vector<int>& indices) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, Find(job_id));
  return worker::TorchCall("set projectors", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    const int64_t d = job->layout.d();
    for (int i : indices) {
      if (i < 0 || i >= static_cast<int>(job->linears.size())) {
        return absl::InvalidArgumentError(absl::StrCat("SetProjectors: bad index ", i));
      }
      const auto& slot = job->layout.linears(i);
      ASSIGN_OR_RETURN(lsp::SparseProjector p,
                       worker::ReadProjector(job->arena, slot.p_index(), slot.p_value(), d));
      ASSIGN_OR_RETURN(lsp::SparseProjector q,
                       worker::ReadProjector(job->arena, slot.q_index(), slot.q_value(), d));
      LinearState& st = job->linears[i];
      if (st.p.rows > 0) {
        // Fold the old subspace into the master weights, then move the moments.
        st.base.add_(lsp::ExpandStep(st.p, st.sum_d, st.q));
        st.sum_d.zero_();
        at::Tensor m = at::from_blob(st.adam->m().data(), {d, d}, at::kFloat);
        at::Tensor v = at::from_blob(st.adam->v().data(), {d, d}, at::kFloat);
        lsp::TransferAdamState(st.p, st.q, p, q, m, v);
      }
      st.p = std::move(p);
      st.q = std::move(q);
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<lspo::v1::UpdateReply> OptimizerCore::Update(
    const lspo::v1::UpdateRequest& request) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, Find(request.job_id()));
  auto t0 = std::chrono::steady_clock::now();
  const auto& o = job->spec.optim();
  lsp::AdamHyper hyper;
  hyper.lr = static_cast<float>(request.lr());
  hyper.beta1 = static_cast<float>(o.beta1());
  hyper.beta2 = static_cast<float>(o.beta2());
  hyper.eps = static_cast<float>(o.eps());
  // Check every S first: a non-finite gradient anywhere leaves the whole step unapplied.
  std::vector<std::pair<int, std::pair<float*, float*>>> work;
  double norm2 = 0;
  const int64_t dd = static_cast<int64_t>(job->layout.d()) * job->layout.d();
  for (const auto& task : request.tasks()) {
    const int i = task.index();
    if (i < 0 || i >= static_cast<int>(job->linears.size())) {
      return absl::InvalidArgumentError(absl::StrCat("Update: bad linear index ", i));
    }
    if (job->linears[i].p.rows == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("Update before SetProjectors for ", job->layout.linears(i).name()));
    }
    const auto& slot = job->layout.linears(i);
    ASSIGN_OR_RETURN(float* s, job->arena.At<float>(slot.grad().offset(), dd));
    ASSIGN_OR_RETURN(float* d, job->arena.At<float>(slot.step().offset(), dd));
    RETURN_IF_ERROR(lsp::CheckFinite(s, dd, slot.name()));
    for (int64_t k = 0; k < dd; ++k) norm2 += static_cast<double>(s[k]) * s[k];
    work.push_back({i, {s, d}});
  }
  for (auto& [i, sd] : work) {
    LinearState& st = job->linears[i];
    RETURN_IF_ERROR(st.adam->Step(hyper, sd.first, sd.second));
    float* sum = st.sum_d.data_ptr<float>();
    for (int64_t k = 0; k < dd; ++k) sum[k] += sd.second[k];
  }
  lspo::v1::UpdateReply reply;
  reply.set_grad_norm(std::sqrt(norm2));
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::SaveReply> OptimizerCore::SaveModel(const std::string& job_id,
                                                            const std::string& dir) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  RETURN_IF_ERROR(worker::TorchCall("materialise master weights", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    absl::flat_hash_map<std::string, int> linear_of;
    for (int i = 0; i < job->layout.linears_size(); ++i) {
      linear_of[job->layout.linears(i).name()] = i;
    }
    for (auto& [name, t] : job->model->NamedTensors()) {
      auto it = linear_of.find(name);
      if (it == linear_of.end()) {
        tensors.emplace_back(name, t.detach().to(at::kFloat).contiguous());
        continue;
      }
      LinearState& st = job->linears[it->second];
      at::Tensor w = st.base.clone();
      if (st.p.rows > 0) w.add_(lsp::ExpandStep(st.p, st.sum_d, st.q));
      tensors.emplace_back(name, w.contiguous());
    }
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(runtime::MakeDirs(dir));
  std::vector<model::SafetensorsEntry> entries;
  for (auto& [name, t] : tensors) {
    entries.push_back({name, "F32", t.sizes().vec(), t.data_ptr(),
                       static_cast<size_t>(t.numel() * 4)});
  }
  const std::string path = dir + "/model.safetensors";
  RETURN_IF_ERROR(model::WriteSafetensors(path, entries, {{"format", "pt"}}));
  lspo::v1::SaveReply reply;
  reply.add_files(path);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::Status OptimizerCore::UnloadJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr && job_->id == job_id) job_.reset();
  return absl::OkStatus();
}

}  // namespace lspo::optimizer
