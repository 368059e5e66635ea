#include "cpu_optimizer_service/optimizer_core.h"

#include <sys/stat.h>

#include <cstring>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "third_party/torch/torch_api.h"

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "offload/arena_layout.h"
#include "offload/arena_tensors.h"
#include "offload/hf_export.h"
#include "offload/state_file.h"
#include "offload/job_assets.h"
#include "offload/spec_paths.h"
#include "offload/torch_call.h"
#include "lsp/adam.h"
#include "lsp/fit.h"
#include "lsp/projector.h"
#include "runtime/float16.h"
#include "model/safetensors.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"
#include "tbb/global_control.h"

namespace lspo::optimizer {

struct LinearState {
  at::Tensor base;      // (m, n) fp32 materialised master weight (zero: THE master weight).
  // lsp / GaLore-Offload: the master is base_scale * base + P sum_d Q^T. Decoupled weight
  // decay multiplies base_scale (a scalar) and sum_d (d x d) instead of base, so a step costs
  // O(d^2), not O(m n); base_scale is folded into base where base is rewritten anyway
  // (projector change) and applied where the master is read (export, refresh, save).
  double base_scale = 1.0;
  at::Tensor sum_d;     // lsp: (d, d) fp32 sum of this subspace's steps.
  lsp::SparseProjector p, q;
  std::unique_ptr<lsp::SubspaceAdam> adam;  // lsp
  // zero: full Adam moments (m * n fp32) and the step counter.
  std::vector<float> m, v;
  int64_t step = 0;
};

// Undo record of one lsp / galore linear for the step in progress (restored if the step is
// abandoned). GaLore-Offload's projector refresh replaces base, sum_d and the projectors with
// new tensors, so the record keeps the old ones.
struct LinearUndo {
  int index;
  int64_t step;
  std::vector<float> m, v;
  at::Tensor base;
  double base_scale;
  at::Tensor sum_d;
  lsp::SparseProjector p, q;
};

// Zero mode: where one matrix's state before the step in progress sits in the job's undo pool
// (OptimizerJob::zero_undo_pool: master, m, v back to back, n floats each).
struct ZeroUndo {
  int index;
  int64_t step;
  int64_t offset;  // in floats
};

// The most host memory a zero-mode job keeps for undo records of the matrices it updates
// before the worker's verdict on the step (overlap schedule; issue 43): 12 bytes per parameter
// (fp32 master, m, v). Past it the optimizer waits for the verdict. See docs/operations.md.
constexpr int64_t kZeroUndoBudgetBytes = int64_t{1} << 30;

struct OptimizerJob {
  std::string id;
  // Caps oneTBB (the CPU kernels: Adam, sparse projector loops) at JobSpec.num_threads for the
  // job's lifetime, like at::set_num_threads does for ATen (docs/known-failures.md #16).
  std::unique_ptr<tbb::global_control> tbb_threads;
  lspo::v1::JobSpec spec;
  lspo::v1::ArenaLayout layout;
  runtime::ShmArena arena;
  std::unique_ptr<model::LlamaModel> model;  // W0 and frozen tensors.
  std::vector<LinearState> linears;
  bool zero = false;
  // MODE_GALORE (GaLore-Offload): the lsp state and arena slots, GaLore's Adam form, the
  // projectors read with each refresh step's gradients (see Update).
  bool galore = false;
  runtime::CompletionFlags flags;
  // Zero mode, overlap schedule: the undo records' storage (allocated at the first such
  // Update: min(kZeroUndoBudgetBytes, 12 bytes x the trained parameters)).
  std::vector<float> zero_undo_pool;
};

namespace {

using runtime::MonotonicSeconds;

// The checkpoint's mode name of a job.
const char* ModeName(const OptimizerJob& job) {
  return job.zero ? "zero" : job.galore ? "galore" : "lsp";
}

// Writes the master weight of a matrix, W = base_scale base + P sum_d Q^T (zero: the master
// itself), into `out`, (m, n) fp32. LibTorch errors throw (callers run under
// offload::TorchCall).
void WriteMasterWeight(const LinearState& st, at::Tensor out) {
  out.copy_(st.base);
  if (st.base_scale != 1.0) out.mul_(st.base_scale);
  if (st.p.rows > 0) out.add_(lsp::ExpandStep(st.p, st.sum_d, st.q));
}

// The same, as a new tensor.
at::Tensor MasterWeight(const LinearState& st) {
  at::Tensor w = at::empty_like(st.base, at::MemoryFormat::Contiguous);
  WriteMasterWeight(st, w);
  return w;
}

// True when the projector a worker wrote into `value` (its value slot) differs from `held`
// (or nothing is held yet): GaLore-Offload's refresh signal. Compares the bytes, without a copy.
absl::StatusOr<bool> ProjectorChanged(const runtime::ShmArena& arena,
                                      const lspo::v1::TensorRef& value,
                                      const lsp::SparseProjector& held) {
  const int64_t n = offload::Numel(value);
  ASSIGN_OR_RETURN(const float* now, arena.At<float>(value.offset(), n));
  if (held.rows == 0 || held.value.numel() != n) return true;
  return std::memcmp(now, held.value.data_ptr<float>(), static_cast<size_t>(n) * 4) != 0;
}

// GaLore-Offload, linear i, before its Adam step: when the worker wrote a new projector with
// this gradient (a refresh step), folds the old subspace's steps into the master's base
// (base + P (sum D) Q^T, a new tensor), starts a new zero sum and installs the new projectors.
// The Adam moments are kept as they are, as galore-torch keeps them (baselines/galore.h).
// Errors: kDataLoss (a malformed projector in the arena), LibTorch errors.
absl::Status RefreshGaloreProjector(OptimizerJob* job, int i) {
  const auto& slot = job->layout.linears(i);
  LinearState& st = job->linears[i];
  ASSIGN_OR_RETURN(const bool p_changed, ProjectorChanged(job->arena, slot.p_value(), st.p));
  ASSIGN_OR_RETURN(const bool q_changed, ProjectorChanged(job->arena, slot.q_value(), st.q));
  if (!p_changed && !q_changed) return absl::OkStatus();
  return offload::TorchCall("galore projector refresh", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    ASSIGN_OR_RETURN(lsp::SparseProjector p, offload::ReadProjector(job->arena, slot.p_index(),
                                                                    slot.p_value(), slot.d_p()));
    ASSIGN_OR_RETURN(lsp::SparseProjector q, offload::ReadProjector(job->arena, slot.q_index(),
                                                                    slot.q_value(), slot.d_q()));
    if (!(p.identity || p.dense) || !(q.identity || q.dense) ||
        !at::isfinite(p.value).all().item<bool>() || !at::isfinite(q.value).all().item<bool>()) {
      return absl::DataLossError(absl::StrCat(
          "GaLore-Offload: the projector of ", slot.name(),
          " in the arena is not a finite dense / identity pair (a worker of another version?)"));
    }
    if (st.p.rows > 0 || st.base_scale != 1.0) st.base = MasterWeight(st);
    st.base_scale = 1.0;
    st.sum_d = at::zeros_like(st.sum_d);
    st.p = std::move(p);
    st.q = std::move(q);
    return absl::OkStatus();
  });
}

// The subspace-Adam hyper-parameters that give galore-torch's AdamW step (baselines/galore.h)
// at Adam step t (1-based, after the increment), from the job's `base` (lr = this step's lr):
//   galore-torch: W <- (W - lr sqrt(bc2)/bc1 * scale * back(m / (sqrt(v) + eps))) (1 - lr wd)
//   SubspaceAdam: D = -lr' m_hat / (sqrt(v_hat) + eps') = -lr' sqrt(bc2)/bc1 m / (sqrt(v) +
//                 eps' sqrt(bc2)),  with bc1 = 1 - b1^t, bc2 = 1 - b2^t,
// so eps' = eps / sqrt(bc2) and lr' = lr scale (1 - lr wd); the master and the worker apply the
// decay (1 - lr wd) to W before adding P D Q^T (Update, LspPath::WorkerDecay), which completes
// the product. scale: galore.scale (0 = 0.25, proto/job_spec.proto).
lsp::AdamHyper GaloreHyper(const lspo::v1::JobSpec& spec, const lsp::AdamHyper& base, double lr,
                           int64_t t) {
  const double scale = spec.galore().scale() > 0 ? spec.galore().scale() : 0.25;
  const double bc2 = 1.0 - std::pow(static_cast<double>(base.beta2), static_cast<double>(t));
  lsp::AdamHyper h = base;
  h.eps = static_cast<float>(static_cast<double>(base.eps) / std::sqrt(bc2));
  h.lr = static_cast<float>(lr * scale * (1.0 - lr * spec.optim().weight_decay()));
  return h;
}

}  // namespace

OptimizerCore::OptimizerCore() = default;
OptimizerCore::OptimizerCore(OptimizerOptions options)
    : roots_(std::move(options.allowed_roots), "optimizer", "lsp_cpu_optimizer") {}
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
  // The roots first, before anything is opened or looked for (and before a stale job goes):
  // an existence check would tell a client which files exist outside them.
  RETURN_IF_ERROR(offload::CheckJobSpecPaths(spec, roots_));
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr) {
    LOG(WARNING) << "optimizer: replacing stale job " << job_->id << " with " << job_id;
    aborter_.Detach();
    job_.reset();
  }
  const lspo::v1::TrainingMode spec_mode =
      spec.mode() == lspo::v1::MODE_UNSPECIFIED ? lspo::v1::MODE_LSP : spec.mode();
  if (layout.mode() != spec_mode) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the worker's arena '", layout.name(), "' is laid out for ",
        lspo::v1::TrainingMode_Name(layout.mode()), " but the job spec's mode is ",
        lspo::v1::TrainingMode_Name(spec_mode),
        ": load the job on the worker and the optimizer with the same spec"));
  }
  auto t0 = std::chrono::steady_clock::now();
  at::set_num_threads(spec.num_threads());
  auto job = std::make_unique<OptimizerJob>();
  job->tbb_threads = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, std::max(1, spec.num_threads()));
  job->id = job_id;
  job->spec = spec;
  job->layout = layout;
  ASSIGN_OR_RETURN(job->arena, runtime::ShmArena::Attach(layout.name(), layout.bytes()));
  ASSIGN_OR_RETURN(job->flags, offload::ArenaFlags(job->arena, layout));
  RETURN_IF_ERROR(offload::NumLayers(layout).status());
  job->zero = layout.mode() == lspo::v1::MODE_ZERO;
  job->galore = layout.mode() == lspo::v1::MODE_GALORE;
  ASSIGN_OR_RETURN(auto m, offload::LoadJobModel(spec));
  job->model = std::make_unique<model::LlamaModel>(std::move(m));
  if (layout.linears_size() != job->model->num_linears()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena layout has ", layout.linears_size(), " matrices, the model ",
        job->model->num_linears(), ": worker and optimizer loaded different models"));
  }
  int64_t params = 0, dd_total = 0, state_bytes = 0;
  for (int i = 0; i < layout.linears_size(); ++i) {
    const auto& slot = layout.linears(i);
    LinearState st;
    // (m, n) fp32. The master is the model's own tensor, moved out (the model keeps only the
    // embedding and norms, for the output folder): a clone held every matrix twice, Σ m n · 4
    // bytes more than the state (449 MiB of peak RSS on SmolLM2-135M; ~4 GB at 1.1B).
    st.base = std::move(job->model->LinearWeight(i)).detach().contiguous();
    if (st.base.size(0) != slot.m() || st.base.size(1) != slot.n()) {
      return absl::InvalidArgumentError(absl::StrCat("arena slot ", slot.name(),
                                                     " shape differs from the model"));
    }
    if (job->zero) {
      st.m.assign(st.base.numel(), 0.0f);
      st.v.assign(st.base.numel(), 0.0f);
    } else {
      if (slot.d_p() < 1 || slot.d_q() < 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "arena slot ", slot.name(), " has subspace (", slot.d_p(), ", ", slot.d_q(),
            "); expected both >= 1 (a worker of another version?)"));
      }
      st.sum_d = at::zeros({slot.d_p(), slot.d_q()}, at::kFloat);  // (d_p, d_q)
      st.adam = std::make_unique<lsp::SubspaceAdam>(slot.d_p(), slot.d_q());
      dd_total += static_cast<int64_t>(slot.d_p()) * slot.d_q();
    }
    // fp32 base (master) W, plus zero: m, v (m n each); lsp: sum_d, m, v (d_p d_q each).
    state_bytes += 4 * (st.base.numel() + (job->zero ? 2 * st.base.numel()
                                                     : 3 * static_cast<int64_t>(slot.d_p()) *
                                                           slot.d_q()));
    params += st.base.numel();
    job->linears.push_back(std::move(st));
  }
  lspo::v1::LoadJobReply reply;
  reply.set_trainable_parameters(params);
  reply.set_optimizer_state_bytes(state_bytes);
  reply.set_device("cpu");
  reply.set_seconds(runtime::SecondsSince(t0));
  LOG(INFO) << "optimizer: loaded job " << job_id << ": fp32 master weights of " << params
            << " parameters, "
            << (job->zero     ? std::string("full Adam (zero mode)")
                : job->galore ? absl::StrCat("GaLore-Offload Adam over ", dd_total,
                                             " elements (galore.rank = ", layout.d(), ")")
                              : absl::StrCat("subspace Adam over ", dd_total,
                                             " elements (lsp.d = ", layout.d(), ")"));
  aborter_.Attach(job_id, job->flags);
  job_ = std::move(job);
  return reply;
}

absl::Status OptimizerCore::SetProjectors(const std::string& job_id,
                                          const std::vector<int>& indices) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, Find(job_id));
  if (job->zero) return absl::FailedPreconditionError("SetProjectors needs MODE_LSP");
  if (job->galore) {
    return absl::FailedPreconditionError(
        "SetProjectors needs MODE_LSP: GaLore-Offload reads each projector from the arena with "
        "the gradient of its refresh step");
  }
  return offload::TorchCall("set projectors", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    for (int i : indices) {
      if (i < 0 || i >= static_cast<int>(job->linears.size())) {
        return absl::InvalidArgumentError(absl::StrCat("SetProjectors: bad index ", i));
      }
      const auto& slot = job->layout.linears(i);
      ASSIGN_OR_RETURN(lsp::SparseProjector p, offload::ReadProjector(job->arena, slot.p_index(),
                                                                      slot.p_value(), slot.d_p()));
      ASSIGN_OR_RETURN(lsp::SparseProjector q, offload::ReadProjector(job->arena, slot.q_index(),
                                                                      slot.q_value(), slot.d_q()));
      LinearState& st = job->linears[i];
      if (st.p.rows > 0) {
        // Fold the old subspace into the master weights, then move the moments into the new
        // subspace (paper Alg. 1). TransferAdamState returns new tensors: they are copied back
        // into the optimizer's own moment buffers (the shape (d_p, d_q) of a matrix never
        // changes between refits).
        if (st.base_scale != 1.0) st.base.mul_(st.base_scale);
        st.base_scale = 1.0;
        st.base.add_(lsp::ExpandStep(st.p, st.sum_d, st.q));
        st.sum_d.zero_();
        const std::vector<int64_t> shape = {slot.d_p(), slot.d_q()};
        at::Tensor m_buf = at::from_blob(st.adam->m().data(), shape, at::kFloat);
        at::Tensor v_buf = at::from_blob(st.adam->v().data(), shape, at::kFloat);
        at::Tensor m = m_buf, v = v_buf;
        lsp::TransferAdamState(st.p, st.q, p, q, m, v);
        m_buf.copy_(m);
        v_buf.copy_(v.clamp_min(0));  // rounding never makes a second moment negative
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
  // Published for UnloadJob, which may abandon this step while we wait (see the header).
  update_step_.store(request.step());
  struct ClearStep {
    std::atomic<int>* step;
    ~ClearStep() { step->store(0); }
  } clear_step{&update_step_};
  const double t_start = MonotonicSeconds();
  const auto& o = job->spec.optim();
  const uint32_t step = static_cast<uint32_t>(request.step());
  lsp::AdamHyper hyper;
  hyper.lr = static_cast<float>(request.lr());
  hyper.beta1 = static_cast<float>(o.beta1());
  hyper.beta2 = static_cast<float>(o.beta2());
  hyper.eps = static_cast<float>(o.eps());
  hyper.weight_decay = static_cast<float>(o.weight_decay());
  RETURN_IF_ERROR(lsp::ValidateAdamHyper(hyper));
  const absl::Duration timeout = absl::Seconds(
      request.wait_timeout_seconds() > 0 ? request.wait_timeout_seconds() : 600);
  for (const auto& task : request.tasks()) {
    const int i = task.index();
    if (i < 0 || i >= static_cast<int>(job->linears.size())) {
      return absl::InvalidArgumentError(absl::StrCat("Update: bad linear index ", i));
    }
    if (!job->zero && !job->galore && job->linears[i].p.rows == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("Update before SetProjectors for ", job->layout.linears(i).name()));
    }
  }
  lspo::v1::UpdateReply reply;
  std::vector<LinearUndo> undo;
  // All or nothing (issue 43): a step is kept only once the worker's verdict says the loss and
  // every gradient were finite. Serial schedule: the worker found them so before this call.
  // Overlap: the matrices updated before the verdict keep undo records (lsp: the d x d state;
  // zero: the full state, in the job's bounded pool, waiting for the verdict when it is full).
  bool verdict_known = !request.wait_for_grads();
  std::vector<ZeroUndo> zero_undo;
  int64_t pool_used = 0;
  // Restores the state of every linear updated so far in this step.
  auto roll_back = [&]() {
    for (const ZeroUndo& z : zero_undo) {
      LinearState& st = job->linears[z.index];
      lsp::RestoreAdamState(job->zero_undo_pool.data() + z.offset, st.base.data_ptr<float>(),
                            st.m.data(), st.v.data(), static_cast<int64_t>(st.m.size()));
      st.step = z.step;
    }
    zero_undo.clear();
    for (auto& u : undo) {
      LinearState& st = job->linears[u.index];
      (void)st.adam->Restore(u.step, std::move(u.m), std::move(u.v));
      st.base = u.base;
      st.base_scale = u.base_scale;
      st.sum_d = u.sum_d;
      st.p = std::move(u.p);
      st.q = std::move(u.q);
    }
    undo.clear();
  };
  // Waits for linear i's gradient (overlap) and checks it is there.
  auto wait = [&](int i) -> absl::Status {
    if (request.wait_for_grads()) return job->flags.WaitGrad(i, step, timeout);
    if (job->flags.grad_seq(i) < step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "Update: the worker has not published step ", step, " of ",
          job->layout.linears(i).name(), " (TrainStep first)"));
    }
    return absl::OkStatus();
  };
  // The gradient of linear i in the arena: lsp S (d, d) fp32 or zero G (m, n) bf16 (exactly one
  // of the two pointers is set).
  struct GradRef {
    const float* fp32 = nullptr;
    const uint16_t* bf16 = nullptr;
    int64_t n = 0;
  };
  auto grad_of = [&](int i) -> absl::StatusOr<GradRef> {
    const auto& slot = job->layout.linears(i);
    GradRef g;
    if (!job->zero) {
      g.n = static_cast<int64_t>(slot.d_p()) * slot.d_q();  // S (d_p, d_q)
      ASSIGN_OR_RETURN(g.fp32, job->arena.At<float>(slot.grad().offset(), g.n));
      return g;
    }
    g.n = slot.m() * slot.n();
    ASSIGN_OR_RETURN(g.bf16, job->arena.At<uint16_t>(slot.full_grad().offset(), g.n));
    return g;
  };
  // One read-only pass: finiteness (kInvalidArgument naming the weight) and sum g^2 (galore:
  // |G|_F^2 of the full gradient, from its grad_sq slot: clipping is GaLore's, of G).
  auto stats_of = [&](int i, const GradRef& g) -> absl::StatusOr<double> {
    const lsp::GradientStats gs = g.fp32 != nullptr ? lsp::ComputeGradientStats(g.fp32, g.n)
                                                    : lsp::ComputeGradientStats(g.bf16, g.n);
    if (gs.first_non_finite >= 0) {
      const int64_t k = gs.first_non_finite;
      return lsp::NonFiniteError(job->layout.linears(i).name(), k, g.n,
                                 g.fp32 != nullptr ? g.fp32[k] : runtime::Bf16ToFp32(g.bf16[k]));
    }
    if (!job->galore) return gs.sum_sq;
    ASSIGN_OR_RETURN(const float* sq,
                     job->arena.At<float>(job->layout.linears(i).grad_sq().offset(), 1));
    if (!std::isfinite(*sq) || *sq < 0) {
      return lsp::NonFiniteError(absl::StrCat(job->layout.linears(i).name(), " (|G|^2)"), 0, 1,
                                 *sq);
    }
    return static_cast<double>(*sq);
  };
  // Waits for the worker's verdict on this step (overlap), once. OK: keep the step; kAborted:
  // the worker skipped it; kDeadlineExceeded.
  double waited = 0;
  auto await_verdict = [&]() -> absl::Status {
    if (verdict_known) return absl::OkStatus();
    const double tw = MonotonicSeconds();
    absl::Status vs = job->flags.WaitVerdict(step, timeout);
    waited += MonotonicSeconds() - tw;
    verdict_known = vs.ok();
    return vs;
  };
  // Clipping needs the global norm before any update: wait for every gradient first. The
  // serial schedule checks every gradient first too, so that no bad gradient is found after
  // some matrices were updated.
  float clip = 1.0f;
  double norm2 = 0;
  const bool clipping = o.max_grad_norm() > 0;
  const bool prepass = clipping || !request.wait_for_grads();
  if (prepass) {
    for (const auto& task : request.tasks()) {
      absl::Status st = wait(task.index());
      if (absl::IsAborted(st)) {
        reply.set_aborted(true);
        return reply;
      }
      RETURN_IF_ERROR(st);
      ASSIGN_OR_RETURN(const GradRef g, grad_of(task.index()));
      ASSIGN_OR_RETURN(const double sq, stats_of(task.index(), g));
      norm2 += sq;
    }
    const double norm = std::sqrt(norm2);
    if (clipping && norm > o.max_grad_norm()) {
      clip = static_cast<float>(o.max_grad_norm() / (norm + 1e-6));
    }
    if (job->zero) {
      // Every gradient is in: the verdict follows at once (the worker's loss check), and
      // waiting for it costs less than undo records of the whole state.
      absl::Status vs = await_verdict();
      if (absl::IsAborted(vs)) {
        reply.set_aborted(true);
        return reply;
      }
      RETURN_IF_ERROR(vs);
    }
  }
  std::vector<float> scaled;
  int current_layer = -1;
  double layer_start = 0;
  auto close_layer = [&](double now) {
    if (current_layer < 0) return;
    lspo::v1::LayerEvent* e = reply.add_events();
    e->set_layer(current_layer);
    e->set_what("update");
    e->set_start(layer_start);
    e->set_end(now);
    e->set_actor("optimizer");
  };
  for (const auto& task : request.tasks()) {
    const int i = task.index();
    const auto& slot = job->layout.linears(i);
    LinearState& st = job->linears[i];
    if (!prepass) {
      const double tw = MonotonicSeconds();
      absl::Status ws = wait(i);
      waited += MonotonicSeconds() - tw;
      if (absl::IsAborted(ws)) {
        roll_back();
        reply.set_aborted(true);
        return reply;
      }
      if (!ws.ok()) {
        roll_back();
        return ws;
      }
    }
    const int layer = i / job->layout.linears_per_layer();
    if (layer != current_layer) {
      const double now = MonotonicSeconds();
      close_layer(now);
      current_layer = layer;
      layer_start = now;
    }
    absl::StatusOr<GradRef> grad = grad_of(i);
    if (!grad.ok()) {
      roll_back();
      return grad.status();
    }
    const GradRef g = *grad;
    const int64_t n = g.n;
    if (!prepass) {
      absl::StatusOr<double> sq = stats_of(i, g);
      if (!sq.ok()) {
        roll_back();
        return sq.status();
      }
      norm2 += *sq;
    }
    if (job->zero) {
      float* undo_record = nullptr;
      if (!verdict_known && job->flags.verdict_seq() >= step) verdict_known = true;
      if (!verdict_known) {
        // Before the verdict: keep the matrix's state to undo it, or, the pool full, wait.
        if (job->zero_undo_pool.empty()) {
          int64_t total = 0;
          for (const LinearState& l : job->linears) total += 3 * static_cast<int64_t>(l.m.size());
          job->zero_undo_pool.resize(std::min<int64_t>(
              total, kZeroUndoBudgetBytes / static_cast<int64_t>(sizeof(float))));
        }
        if (pool_used + 3 * n <= static_cast<int64_t>(job->zero_undo_pool.size())) {
          undo_record = job->zero_undo_pool.data() + pool_used;  // written by the step below
        } else {
          absl::Status vs = await_verdict();
          if (!vs.ok()) {
            roll_back();
            if (!absl::IsAborted(vs)) return vs;
            reply.set_aborted(true);
            return reply;
          }
        }
      }
      // Full AdamW on the fp32 master weight, clip folded in, bf16 parameter out: one fused
      // pass over memory (lsp/adam.h FusedAdamStep).
      absl::StatusOr<uint16_t*> param_slot = job->arena.At<uint16_t>(slot.param().offset(), n);
      if (!param_slot.ok()) {
        roll_back();
        return param_slot.status();
      }
      uint16_t* out = *param_slot;
      if (undo_record != nullptr) {  // recorded only once the step that writes it runs
        zero_undo.push_back({i, st.step, pool_used});
        pool_used += 3 * n;
      }
      ++st.step;
      lsp::AdamOperands ops;
      ops.grad_bf16 = g.bf16;
      ops.grad_scale = clip;
      ops.m = st.m.data();
      ops.v = st.v.data();
      ops.out = st.base.data_ptr<float>();
      ops.accumulate = true;
      ops.out_bf16 = out;
      ops.undo = undo_record;
      ops.n = n;
      lsp::FusedAdamStep(hyper, st.step, ops);
    } else {
      undo.push_back({i, st.adam->step(), st.adam->m(), st.adam->v(), st.base, st.base_scale,
                      st.sum_d.clone(), st.p, st.q});
      lsp::AdamHyper h = hyper;
      if (job->galore) {
        // A new projector came with this gradient (a refresh step): fold the old subspace's
        // steps into the base, keep the moments as they are (galore-torch does), start a new
        // sum (new tensors: the undo record keeps the old ones).
        absl::Status ps = RefreshGaloreProjector(job, i);
        if (!ps.ok()) {
          roll_back();
          return ps;
        }
        h = GaloreHyper(job->spec, hyper, request.lr(), st.adam->step() + 1);
      }
      absl::StatusOr<float*> step_slot = job->arena.At<float>(slot.step().offset(), n);
      if (!step_slot.ok()) {
        roll_back();
        return step_slot.status();
      }
      float* d = *step_slot;
      const float* s_in = g.fp32;  // S (d_p, d_q); clipped into a copy (small)
      if (clip != 1.0f) {
        scaled.assign(s_in, s_in + n);
        for (float& x : scaled) x *= clip;
        s_in = scaled.data();
      }
      absl::Status as = st.adam->Step(h, s_in, d);
      if (!as.ok()) {
        roll_back();
        return as;
      }
      // Decoupled weight decay W <- (1 - lr wd) W, on the master's two parts: base through
      // its scale (a rewrite of base cost O(m n) per step, and, with the undo record holding
      // the old base, a second copy of every master until the step ended).
      const double decay = 1.0 - request.lr() * o.weight_decay();
      if (decay != 1.0) {
        st.base_scale *= decay;
        st.sum_d.mul_(decay);
      }
      float* sum = st.sum_d.data_ptr<float>();
      for (int64_t k = 0; k < n; ++k) sum[k] += d[k];
    }
    job->flags.PublishStep(i, step);
  }
  close_layer(MonotonicSeconds());
  // Keep the step only on the worker's verdict (a non-finite loss seen after the backward, a
  // gradient of another rank): otherwise every matrix goes back to its state before it.
  if (absl::Status vs = await_verdict(); !vs.ok()) {
    roll_back();
    if (!absl::IsAborted(vs)) return vs;
    reply.set_aborted(true);
    return reply;
  }
  reply.set_grad_norm(std::sqrt(norm2));
  reply.set_peak_rss_bytes(runtime::PeakRssBytes());
  reply.set_clip_coefficient(clip);
  reply.set_seconds(MonotonicSeconds() - t_start - waited);
  return reply;
}

absl::Status OptimizerCore::AbortStep(const std::string& job_id, int step) {
  return aborter_.Abort(job_id, step, "optimizer");
}

absl::StatusOr<lspo::v1::LayerWeightsReply> OptimizerCore::ExportLayerWeights(
    const std::string& job_id, int layer) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, Find(job_id));
  if (job->zero) return absl::FailedPreconditionError("ExportLayerWeights needs MODE_LSP");
  ASSIGN_OR_RETURN(const int num_layers, offload::NumLayers(job->layout));
  if (layer < 0 || layer >= num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("ExportLayerWeights: layer ", layer,
                                                   " is not in [0, ", num_layers, ")"));
  }
  RETURN_IF_ERROR(offload::TorchCall("export layer weights", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    ASSIGN_OR_RETURN(at::Tensor staging, offload::ArenaF32(job->arena, job->layout.staging()));
    int64_t offset = 0;
    for (int k = 0; k < 7; ++k) {
      LinearState& st = job->linears[layer * 7 + k];
      at::Tensor dst = staging.narrow(0, offset, st.base.numel()).view(st.base.sizes());
      offset += st.base.numel();
      WriteMasterWeight(st, dst);
    }
    return absl::OkStatus();
  }));
  return lspo::v1::LayerWeightsReply();
}

absl::StatusOr<lspo::v1::SaveReply> OptimizerCore::SaveModel(const std::string& job_id,
                                                            const std::string& dir) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "SaveModel", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  RETURN_IF_ERROR(offload::TorchCall("materialise master weights", [&]() -> absl::Status {
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
      tensors.emplace_back(name, MasterWeight(st));
    }
    return absl::OkStatus();
  }));
  RETURN_IF_ERROR(runtime::MakeDirs(dir));
  const std::string path = dir + "/model.safetensors";
  RETURN_IF_ERROR(offload::WriteFp32Safetensors(tensors, path));
  lspo::v1::SaveReply reply;
  reply.add_files(path);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::StateReply> OptimizerCore::SaveState(const std::string& job_id,
                                                              const std::string& dir, int step) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "SaveState", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  lspo::v1::StateReply reply;
  const std::string path = dir + "/optimizer_state.safetensors";
  RETURN_IF_ERROR(offload::TorchCall("save optimizer state", [&]() -> absl::Status {
    offload::NamedTensors tensors;
    for (int i = 0; i < job->layout.linears_size(); ++i) {
      const std::string& name = job->layout.linears(i).name();
      LinearState& st = job->linears[i];
      tensors.emplace_back(name + ".master", st.base);
      if (job->zero) {
        tensors.emplace_back(name + ".adam_m", at::from_blob(st.m.data(), st.base.sizes(), at::kFloat));
        tensors.emplace_back(name + ".adam_v", at::from_blob(st.v.data(), st.base.sizes(), at::kFloat));
        tensors.emplace_back(name + ".adam_step", at::scalar_tensor(st.step, at::kLong));
      } else {
        const std::vector<int64_t> shape = {st.adam->rows(), st.adam->cols()};  // (d_p, d_q)
        tensors.emplace_back(name + ".master_scale", at::scalar_tensor(st.base_scale, at::kDouble));
        tensors.emplace_back(name + ".sum_d", st.sum_d);
        tensors.emplace_back(name + ".adam_m", at::from_blob(st.adam->m().data(), shape, at::kFloat));
        tensors.emplace_back(name + ".adam_v", at::from_blob(st.adam->v().data(), shape, at::kFloat));
        tensors.emplace_back(name + ".adam_step", at::scalar_tensor(st.adam->step(), at::kLong));
        if (st.p.rows > 0) {
          offload::AppendProjector(name + ".p", st.p, &tensors);
          offload::AppendProjector(name + ".q", st.q, &tensors);
        }
      }
    }
    return offload::WriteTensorFile(
        path, tensors,
        {{"job_id", job->id}, {"mode", ModeName(*job)}, {"step", std::to_string(step)}});
  }));
  reply.add_files(path);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::StateReply> OptimizerCore::LoadState(const std::string& job_id,
                                                              const std::string& dir, int step) {
  RETURN_IF_ERROR(offload::CheckRequestFolder(roots_, "LoadState", dir));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(OptimizerJob * job, Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  const std::string path = dir + "/optimizer_state.safetensors";
  ASSIGN_OR_RETURN(model::SafetensorsFile file, model::SafetensorsFile::Open(path));
  const std::string what = absl::StrCat("optimizer state '", path, "'");
  {
    const auto& meta = file.metadata();
    auto get = [&](const char* key) {
      auto it = meta.find(key);
      return it == meta.end() ? std::string() : it->second;
    };
    const std::string mode = ModeName(*job);
    if (get("mode") != mode || get("step") != std::to_string(step)) {
      return absl::DataLossError(absl::StrCat(what, " holds the ", get("mode"),
                                              " state of step ", get("step"), ", expected ",
                                              mode, " at step ", step));
    }
  }
  RETURN_IF_ERROR(offload::TorchCall("load optimizer state", [&]() -> absl::Status {
    // Views into the mapped file: everything is validated before anything is copied.
    struct Loaded {
      at::Tensor master, sum_d, m, v;
      double master_scale = 1.0;
      int64_t step = 0;
      lsp::SparseProjector p, q;
    };
    std::vector<Loaded> loaded(job->linears.size());
    for (int i = 0; i < job->layout.linears_size(); ++i) {
      const auto& slot = job->layout.linears(i);
      const lsp::MatrixSubspace sub = offload::SlotSubspace(slot);  // S (d_p, d_q)
      const std::string& name = slot.name();
      Loaded& l = loaded[i];
      ASSIGN_OR_RETURN(l.master, offload::ViewStateTensor(file, what, name + ".master", at::kFloat,
                                                         {slot.m(), slot.n()}));
      const std::vector<int64_t> mshape =
          job->zero ? std::vector<int64_t>{slot.m(), slot.n()}
                    : std::vector<int64_t>{sub.p.dim, sub.q.dim};
      ASSIGN_OR_RETURN(l.m, offload::ViewStateTensor(file, what, name + ".adam_m", at::kFloat, mshape));
      ASSIGN_OR_RETURN(l.v, offload::ViewStateTensor(file, what, name + ".adam_v", at::kFloat, mshape));
      ASSIGN_OR_RETURN(at::Tensor step_t, offload::ReadStateTensor(file, what, name + ".adam_step",
                                                                  at::kLong, {}));
      l.step = step_t.item<int64_t>();
      if (l.step < 0 || (l.v < 0).any().item<bool>()) {
        return absl::DataLossError(absl::StrCat(what, ": ", name,
                                                " has a negative Adam step or second moment"));
      }
      if (!job->zero) {
        ASSIGN_OR_RETURN(l.sum_d, offload::ViewStateTensor(file, what, name + ".sum_d",
                                                          at::kFloat, {sub.p.dim, sub.q.dim}));
        // Written since the decay became a scale; an older checkpoint's master is all of it.
        if (file.Find(name + ".master_scale") != nullptr) {
          ASSIGN_OR_RETURN(
              at::Tensor scale,
              offload::ReadStateTensor(file, what, name + ".master_scale", at::kDouble, {}));
          l.master_scale = scale.item<double>();
          // >= 0: the spec keeps lr wd < 1, but a long decay may underflow to 0.
          if (!std::isfinite(l.master_scale) || l.master_scale < 0) {
            return absl::DataLossError(absl::StrCat(what, ": ", name, ".master_scale is ",
                                                    l.master_scale, ", not a number >= 0"));
          }
        }
        if (file.Find(name + ".p_index") != nullptr) {
          ASSIGN_OR_RETURN(l.p, offload::ReadStateProjector(file, what, name + ".p", slot.m(),
                                                            sub.p.dim, sub.p.r));
          ASSIGN_OR_RETURN(l.q, offload::ReadStateProjector(file, what, name + ".q", slot.n(),
                                                            sub.q.dim, sub.q.r));
        }
      }
    }
    for (size_t i = 0; i < loaded.size(); ++i) {
      LinearState& st = job->linears[i];
      Loaded& l = loaded[i];
      st.base.copy_(l.master);  // In place: no second copy of the state (known failure #15).
      if (job->zero) {
        std::memcpy(st.m.data(), l.m.data_ptr<float>(), st.m.size() * sizeof(float));
        std::memcpy(st.v.data(), l.v.data_ptr<float>(), st.v.size() * sizeof(float));
        st.step = l.step;
      } else {
        st.base_scale = l.master_scale;
        st.sum_d.copy_(l.sum_d);
        std::vector<float> m(l.m.data_ptr<float>(), l.m.data_ptr<float>() + l.m.numel());
        std::vector<float> v(l.v.data_ptr<float>(), l.v.data_ptr<float>() + l.v.numel());
        RETURN_IF_ERROR(st.adam->Restore(l.step, std::move(m), std::move(v)));
        st.p = std::move(l.p);
        st.q = std::move(l.q);
      }
    }
    return absl::OkStatus();
  }));
  LOG(INFO) << "optimizer: restored the state of step " << step << " from " << dir;
  lspo::v1::StateReply reply;
  reply.add_files(path);
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::Status OptimizerCore::UnloadJob(const std::string& job_id) {
  // An Update waiting for gradients holds mu_: abandon its step first (a no-op for another
  // job's id or when none waits). An Update that starts between this and the lock below is
  // one the caller itself sent, and runs to its end as usual.
  if (const int step = update_step_.load(); step > 0) {
    (void)aborter_.Abort(job_id, step, "optimizer");
  }
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr && job_->id == job_id) {
    aborter_.Detach();
    job_.reset();
  }
  return absl::OkStatus();
}

}  // namespace lspo::optimizer
