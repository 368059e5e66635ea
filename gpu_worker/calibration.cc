// Shapes: W and G (m, n), m out features, n in features; P (m, d_p), Q (n, d_q), stored as index /
// value (rows, r) int64 / fp32 (r non-zeros per row).
#include "gpu_worker/calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "data/datasets.h"
#include "glog/logging.h"
#include "gpu_worker/lsp_path.h"
#include "gpu_worker/worker_job.h"
#include "lsp/fit.h"
#include "lsp/projector.h"
#include "lsp/subspace.h"
#include "offload/arena_layout.h"
#include "offload/collective.h"
#include "offload/torch_call.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"

namespace lspo::worker {
namespace {

// CRC-32C of every matrix's P and Q (index and value bytes, in matrix order).
uint32_t ProjectorChecksum(const LspPath& path) {
  uint32_t crc = 0;
  for (size_t i = 0; i < path.p().size(); ++i) {
    for (const at::Tensor& t :  // index (rows, r) int64 or value (rows, r) fp32
         {path.p()[i].index, path.p()[i].value, path.q()[i].index, path.q()[i].value}) {
      crc = offload::Crc32cExtendTensor(crc, t);
    }
  }
  return crc;
}

// Data parallel: after rank 0's projectors reached every rank (ShareRankZerosProjectors),
// their checksums are all-gathered and compared with rank 0's: a guard on the transfer and the
// install. Errors: kFailedPrecondition naming the ranks that differ, the collective's errors.
absl::Status CheckProjectorsAgree(const WorkerJob& job, const LspPath& path, int step) {
  offload::Collective* group = job.ranks.collective.get();
  if (group == nullptr || group->world_size() <= 1) return absl::OkStatus();
  ASSIGN_OR_RETURN(std::vector<int64_t> crcs, group->AllGather(ProjectorChecksum(path)));
  std::vector<std::string> differ;
  for (size_t r = 1; r < crcs.size(); ++r) {
    if (crcs[r] != crcs[0]) {
      differ.push_back(absl::StrFormat("rank %d (%s) %08x", r, group->labels()[r], crcs[r]));
    }
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "distributed: the projectors fitted at step ", step,
      " differ across the ranks (CRC-32C of "
      "P and Q: rank 0 (",
      group->labels()[0], ") ", absl::StrFormat("%08x", crcs[0]), ", ", absl::StrJoin(differ, ", "),
      "): rank 0's projectors were not installed alike on every rank; rerun, and report it if "
      "it recurs"));
}

// The fresh projector pair (P, Q) of matrix `i` at the check of step `step`, on the CPU: the
// sides of the matrix's subspace as laid out (lsp/subspace.h; an identity side is exact and
// drawn as the identity), seeds lsp::ProjectorSeed(spec.seed, i, step) and + 1. Errors: those
// of lsp::SparseProjector::ForSide.
absl::StatusOr<std::pair<lsp::SparseProjector, lsp::SparseProjector>> DrawProjectors(
    const WorkerJob& job, int64_t i, int step) {
  const lsp::MatrixSubspace sub =
      offload::SlotSubspace(job.plane.layout.linears(static_cast<int>(i)));
  const uint64_t seed = lsp::ProjectorSeed(job.spec.seed(), i, step);
  ASSIGN_OR_RETURN(
      lsp::SparseProjector p,
      lsp::SparseProjector::ForSide(sub.p.rows, sub.p.dim, sub.p.r, sub.p.identity, seed));
  ASSIGN_OR_RETURN(
      lsp::SparseProjector q,
      lsp::SparseProjector::ForSide(sub.q.rows, sub.q.dim, sub.q.r, sub.q.identity, seed + 1));
  return std::make_pair(std::move(p), std::move(q));
}

// This rank's projector check (every rank of a one-rank job, rank 0 of a data-parallel one):
// dense calibration gradients, then per matrix a bias check or a fit; the new projectors are
// installed and named in `reply` (initial/final errors per matrix, refitted ones). Leaves the
// trained matrices' linear mode to the caller.
absl::Status FitOnThisRank(WorkerJob* job, LspPath* lsp_path, int step,
                           lspo::v1::FitProjectorsReply* reply_ptr) {
  lspo::v1::FitProjectorsReply& reply = *reply_ptr;
  auto& model = *job->model;
  const auto& spec = job->spec;
  // Calibration gradient: dense G of every trained matrix, mean over the calibration
  // examples' answer tokens (a fixed subset drawn with seed + 1, re-drawn per check).
  const int64_t n_cal =
      std::min<int64_t>(spec.lsp().calibration_examples(), job->data.train.size());
  std::vector<int64_t> cal =
      data::ShuffledOrder(job->data.train.size(), spec.seed() + 1, /*epoch=*/step);
  cal.resize(n_cal);
  const int64_t mb = spec.micro_batch_size();
  std::vector<data::Batch> batches;
  int64_t total = 0;
  for (int64_t s = 0; s < n_cal; s += mb) {
    std::vector<const data::TokenizedExample*> rows;
    for (int64_t k = s; k < std::min(n_cal, s + mb); ++k) rows.push_back(&job->data.train[cal[k]]);
    batches.push_back(data::MakeBatch(rows, job->data.tokenizer->pad_id()));
    total += batches.back().num_loss_tokens;
  }
  lsp::FitOptions opts;
  opts.max_iters = std::max(0, spec.lsp().fit_iters());
  opts.lr = spec.lsp().fit_lr();
  opts.beta = spec.lsp().beta();
  opts.alpha = spec.lsp().fit_stop() > 0 ? spec.lsp().fit_stop() : spec.lsp().alpha();
  // fp32 objective: ~1.5x faster than fp64 here (bench/lsp_fit_bench); the reported errors
  // are recomputed exactly (RelativeBias, fp64) by FitProjectors.
  opts.float64 = false;
  reply.mutable_initial_error()->Resize(model.num_linears(), NAN);
  reply.mutable_final_error()->Resize(model.num_linears(), NAN);
  const int64_t num_layers = model.config().num_layers;
  int64_t per_pass = spec.lsp().calibration_layers_per_pass();
  if (per_pass <= 0) {
    int64_t layer_bytes = 1;
    for (int64_t i = 0; i < std::min<int64_t>(model::kLinearsPerLayer, model.num_linears()); ++i) {
      layer_bytes += model.LinearWeight(i).numel() * 4;
    }
    const int64_t budget = static_cast<int64_t>(spec.lsp().calibration_memory_mb() > 0
                                                    ? spec.lsp().calibration_memory_mb()
                                                    : 1024)
                           << 20;
    per_pass = std::max<int64_t>(1, budget / layer_bytes);
  }
  // Layers are processed in groups of `per_pass`: one forward + backward per group forms
  // the dense G of the group's matrices only (the others frozen), so peak extra memory is
  // one group's weights in fp32; each G is fitted and freed before the next group.
  for (int64_t l0 = 0; l0 < num_layers; l0 += per_pass) {
    const int64_t l1 = std::min(num_layers, l0 + per_pass);
    const int64_t i0 = l0 * model::kLinearsPerLayer, i1 = l1 * model::kLinearsPerLayer;
    model.SetLinearMode(model::LinearMode::kFrozen);
    for (int64_t i = i0; i < i1; ++i) model.SetLinearMode(i, model::LinearMode::kDense);
    model.ZeroLinearGrads();
    for (const auto& b : batches) {
      const int64_t targets = b.num_loss_tokens;
      if (targets == 0) continue;
      // () fp32, the mean over the micro-batch's targets.
      at::Tensor loss = model.CausalLmLoss(
          ToTensor(b.input_ids, b.batch_size, b.seq_len, job->device),
          ToTensor(b.labels, b.batch_size, b.seq_len, job->device), LayoutOf(b, job->device));
      RETURN_IF_ERROR(model.HookStatus());
      (loss * (static_cast<double>(targets) / total)).backward();
      RETURN_IF_ERROR(model.HookStatus());
    }
    for (int64_t i = i0; i < i1; ++i) {
      at::Tensor& w = model.LinearWeight(i);  // (m, n) as stored
      // G (m, n) fp32 on the job's device.
      at::Tensor g =
          w.grad().defined()
              ? w.grad().detach().to(at::kFloat)
              : at::zeros(w.sizes(),
                          at::TensorOptions().dtype(at::kFloat).device(job->device));  // (m, n)
      w.mutable_grad() = at::Tensor();
      const bool finite = at::isfinite(g).all().item<bool>();
      const bool have = lsp_path->p()[i].rows > 0;
      if (!finite) {
        LOG(WARNING) << "worker: non-finite calibration gradient for " << job->linears[i].name
                     << "; check skipped, keeping "
                     << (have ? "its projectors" : "random projectors");
      }
      if (have && finite) {
        const double err = lsp::RelativeBias(g, lsp_path->p()[i], lsp_path->q()[i]);
        if (err <= spec.lsp().alpha()) {
          reply.set_initial_error(i, err);
          reply.set_final_error(i, err);
          continue;
        }
      }
      if (have && !finite) continue;
      ASSIGN_OR_RETURN(auto pq, DrawProjectors(*job, i, step));
      lsp::SparseProjector p = std::move(pq.first), q = std::move(pq.second);
      if (job->cuda) {  // Fit and apply next to G and W (the draw itself is on the CPU).
        p = p.To(job->device);
        q = q.To(job->device);
      }
      double init_err = NAN, final_err = NAN;
      const bool nonzero = finite && g.abs().max().item<float>() > 0;
      if (nonzero && opts.max_iters > 0) {
        ASSIGN_OR_RETURN(lsp::FitResult fit, lsp::FitProjectors(g, &p, &q, opts));
        init_err = fit.initial_error;
        final_err = fit.final_error;
      } else if (nonzero) {
        init_err = final_err = lsp::RelativeBias(g, p, q);
      }
      reply.set_initial_error(i, init_err);
      reply.set_final_error(i, final_err);
      RETURN_IF_ERROR(lsp_path->InstallProjectors(job, i, std::move(p), std::move(q)));
      reply.add_refitted(i);
    }
  }
  return absl::OkStatus();
}

// Data parallel: rank 0's check reaches every rank. Rank 0 broadcasts, per matrix, whether it
// was refitted and its errors, then the refitted matrices' P and Q (int64 positions and fp32
// values, one broadcast per dtype); the other ranks validate and install them as rank 0 did.
// So the ranks hold identical projectors whatever their CPU kinds or thread counts, and only
// rank 0 spends the calibration passes and the fit. Errors: the collective's (a rank gone,
// the timeout), kInvalidArgument (received projectors that break the invariants), arena and
// LibTorch errors.
absl::Status ShareRankZerosProjectors(WorkerJob* job, LspPath* lsp_path, int step,
                                      lspo::v1::FitProjectorsReply* reply) {
  offload::Collective& group = *job->ranks.collective;
  const bool root = group.rank() == 0;
  const int64_t n = job->model->num_linears();
  // (n_linears, 3) fp64 CPU: per matrix refitted (0/1), initial and final error.
  std::vector<at::Tensor> header = {at::full({n, 3}, NAN, at::kDouble)};
  if (root) {
    auto h = header[0].accessor<double, 2>();
    for (int64_t i = 0; i < n; ++i) {
      h[i][0] = 0;
      h[i][1] = reply->initial_error(static_cast<int>(i));
      h[i][2] = reply->final_error(static_cast<int>(i));
    }
    for (int32_t i : reply->refitted()) h[i][0] = 1;
  }
  RETURN_IF_ERROR(offload::BroadcastTensors(group, header, 0));
  auto h = header[0].accessor<double, 2>();
  std::vector<int64_t> refitted;
  for (int64_t i = 0; i < n; ++i) {
    if (h[i][0] == 1) refitted.push_back(i);
  }
  // The refitted matrices' projectors: rank 0's as installed, the others' shaped by a draw of
  // the same sides (DrawProjectors), then overwritten.
  std::vector<lsp::SparseProjector> ps, qs;
  std::vector<at::Tensor> tensors;  // P, Q index (rows, r) int64, value fp32, CPU
  for (int64_t i : refitted) {
    if (root) {
      ps.push_back(lsp_path->p()[i].To(at::kCPU));
      qs.push_back(lsp_path->q()[i].To(at::kCPU));
    } else {
      ASSIGN_OR_RETURN(auto pq, DrawProjectors(*job, i, step));
      ps.push_back(std::move(pq.first));
      qs.push_back(std::move(pq.second));
    }
    for (lsp::SparseProjector* side : {&ps.back(), &qs.back()}) {
      side->index = side->index.contiguous();
      side->value = side->value.contiguous();
      tensors.push_back(side->index);
      tensors.push_back(side->value);
    }
  }
  RETURN_IF_ERROR(offload::BroadcastTensors(group, tensors, 0));
  if (root) return absl::OkStatus();
  reply->mutable_initial_error()->Resize(static_cast<int>(n), NAN);
  reply->mutable_final_error()->Resize(static_cast<int>(n), NAN);
  for (int64_t i = 0; i < n; ++i) {
    reply->set_initial_error(static_cast<int>(i), h[i][1]);
    reply->set_final_error(static_cast<int>(i), h[i][2]);
  }
  for (size_t k = 0; k < refitted.size(); ++k) {
    const int64_t i = refitted[k];
    ASSIGN_OR_RETURN(lsp::SparseProjector p,
                     lsp::SparseProjector::FromTensors(ps[k].index, ps[k].value, ps[k].d));
    ASSIGN_OR_RETURN(lsp::SparseProjector q,
                     lsp::SparseProjector::FromTensors(qs[k].index, qs[k].value, qs[k].d));
    if (job->cuda) {
      p = p.To(job->device);
      q = q.To(job->device);
    }
    RETURN_IF_ERROR(lsp_path->InstallProjectors(job, i, std::move(p), std::move(q)));
    reply->add_refitted(static_cast<int32_t>(i));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<lspo::v1::FitProjectorsReply> RunProjectorCheck(WorkerJob* job, int step) {
  ASSIGN_OR_RETURN(LspPath * lsp_path, LspPathOf(job, "FitProjectors"));
  auto t0 = std::chrono::steady_clock::now();
  auto& model = *job->model;
  // The scheduler calls FitProjectors only after the optimizer attached the arena, so its
  // name is no longer needed: unlinking now means a crash later leaves nothing in /dev/shm.
  job->plane.arena.Unlink();
  lspo::v1::FitProjectorsReply reply;
  offload::Collective* group = job->ranks.collective.get();
  const bool data_parallel = group != nullptr && group->world_size() > 1;
  absl::Status st = offload::TorchCall("calibration gradients", [&]() -> absl::Status {
    model.ClearHookStatus();
    RETURN_IF_ERROR(ApplyPending(job, -1));
    if (!data_parallel || group->rank() == 0) {
      RETURN_IF_ERROR(FitOnThisRank(job, lsp_path, step, &reply));
    }
    if (data_parallel) {
      RETURN_IF_ERROR(ShareRankZerosProjectors(job, lsp_path, step, &reply));
    }
    model.SetLinearMode(model::LinearMode::kCustom);
    if (data_parallel) RETURN_IF_ERROR(CheckProjectorsAgree(*job, *lsp_path, step));
    lsp_path->set_fitted();
    job->times.events.clear();
    double err_sum = 0;
    int err_n = 0;
    for (double e : reply.final_error()) {
      if (std::isfinite(e)) err_sum += e, ++err_n;
    }
    LOG(INFO) << "worker: projector check at step " << step << ": " << reply.refitted_size()
              << " of " << model.num_linears() << " matrices (re)fitted"
              << (data_parallel && group->rank() != 0 ? " by rank 0" : "")
              << ", mean relative bias " << err_sum / std::max(1, err_n);
    return absl::OkStatus();
  });
  if (!st.ok()) {
    model.SetLinearMode(model::LinearMode::kCustom);
    return st;
  }
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

}  // namespace lspo::worker
