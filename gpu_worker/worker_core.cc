#include "gpu_worker/worker_core.h"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <chrono>
#include <cmath>
#include <map>
#include <numeric>

#include <torch/torch.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "data/datasets.h"
#include "glog/logging.h"
#include "gpu_worker/arena_io.h"
#include "gpu_worker/job_assets.h"
#include "gpu_worker/torch_call.h"
#include "lsp/fit.h"
#include "lsp/projector.h"
#include "model/safetensors.h"
#include "runtime/status_macros.h"
#include "runtime/util.h"

namespace lspo::worker {

using lspo::v1::JobSpec;

// Everything the worker holds for its one job.
struct WorkerJob {
  std::string id;
  JobSpec spec;
  bool lsp = true;
  bool classification = true;
  std::unique_ptr<model::BpeTokenizer> tokenizer;
  std::unique_ptr<model::LlamaModel> model;
  std::vector<data::TokenizedExample> train;
  std::vector<int32_t> train_class;  // Classification: label id per training example.
  std::vector<data::TokenizedExample> eval;
  std::vector<LinearShape> linears;
  // MODE_LSP.
  runtime::ShmArena arena;
  lspo::v1::ArenaLayout layout;
  std::vector<lsp::SparseProjector> p, q;  // Per linear; rows == 0 until the first fit.
  std::vector<at::Tensor> s_accum;          // Per linear, (d, d) fp32, summed over micro-batches.
  bool fitted = false;
  // MODE_NATIVE.
  std::unique_ptr<torch::optim::AdamW> adamw;
  // Data order cache.
  int64_t order_epoch = -1;
  std::vector<int64_t> order;
};

namespace {


// A token's text, trimmed of white space and lower-cased (for answer matching).
std::string NormalizedToken(const model::BpeTokenizer& tok, int64_t id) {
  const int32_t one = static_cast<int32_t>(id);
  return absl::AsciiStrToLower(absl::StripAsciiWhitespace(tok.Decode(absl::MakeConstSpan(&one, 1))));
}

at::Tensor ToTensor(const std::vector<int64_t>& v, int64_t rows, int64_t cols) {
  return at::from_blob(const_cast<int64_t*>(v.data()), {rows, cols},
                       at::TensorOptions().dtype(at::kLong))
      .clone();
}

// Tokenised examples of `path`; for classification data also each example's label id
// (labels numbered in order of first appearance) in `*class_of` when non-null.
absl::StatusOr<std::vector<data::TokenizedExample>> LoadExamples(
    const JobSpec& spec, const model::BpeTokenizer& tok, const std::string& path, int max,
    std::vector<int32_t>* class_of = nullptr) {
  std::vector<data::TokenizedExample> out;
  if (spec.data().format() == "classification") {
    ASSIGN_OR_RETURN(auto rows, data::LoadLabeled(path));
    std::map<std::string, int32_t> label_ids;
    for (const auto& row : rows) {
      if (max > 0 && static_cast<int>(out.size()) >= max) break;
      if (class_of != nullptr) {
        auto it = label_ids.emplace(row.label, static_cast<int32_t>(label_ids.size())).first;
        class_of->push_back(it->second);
      }
      ASSIGN_OR_RETURN(auto ex, data::BuildClassificationChat(tok, row.text, row.label,
                                                              spec.data().question(),
                                                              spec.data().system_prompt(),
                                                              spec.seq_len()));
      out.push_back(std::move(ex));
    }
  } else {
    ASSIGN_OR_RETURN(auto blocks, data::PackTextBlocks(tok, path, spec.seq_len(),
                                                       spec.data().max_blocks()));
    for (auto& b : blocks) {
      if (max > 0 && static_cast<int>(out.size()) >= max) break;
      data::TokenizedExample ex;
      ex.labels.assign(b.begin(), b.end());
      ex.input_ids = std::move(b);
      ex.answer_start = 0;
      out.push_back(std::move(ex));
    }
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("data file '", path,
                                                   "' produced no examples: check its format"));
  }
  return out;
}

}  // namespace

WorkerCore::WorkerCore() = default;
WorkerCore::~WorkerCore() = default;

absl::StatusOr<WorkerJob*> WorkerCore::Find(const std::string& job_id) {
  if (job_ == nullptr || job_->id != job_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id, "' is not loaded on this worker (LoadJob first)"));
  }
  return job_.get();
}

absl::StatusOr<lspo::v1::LoadJobReply> WorkerCore::LoadJob(const std::string& job_id,
                                                          const JobSpec& spec) {
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr) {
    if (job_->id == job_id) {
      return absl::FailedPreconditionError(absl::StrCat("job '", job_id, "' already loaded"));
    }
    LOG(WARNING) << "worker: replacing stale job " << job_->id << " with " << job_id;
    job_.reset();
  }
  auto t0 = std::chrono::steady_clock::now();
  at::set_num_threads(spec.num_threads());
  if (spec.device() == "cuda" && !torch::cuda::is_available()) {
    return absl::FailedPreconditionError(
        "job spec field device = cuda, but this worker's LibTorch sees no CUDA device: use "
        "device: cpu, or build against a CUDA LibTorch on a GPU host");
  }
  auto job = std::make_unique<WorkerJob>();
  job->id = job_id;
  job->spec = spec;
  job->lsp = spec.mode() != lspo::v1::MODE_NATIVE;
  job->classification = spec.data().format() == "classification";
  ASSIGN_OR_RETURN(auto tok, LoadJobTokenizer(spec));
  job->tokenizer = std::make_unique<model::BpeTokenizer>(std::move(tok));
  ASSIGN_OR_RETURN(auto m, LoadJobModel(spec));
  job->model = std::make_unique<model::LlamaModel>(std::move(m));
  ASSIGN_OR_RETURN(job->train, LoadExamples(spec, *job->tokenizer, spec.data().train_path(),
                                            spec.data().max_train_examples(),
                                            &job->train_class));
  if (!spec.data().eval_path().empty()) {
    ASSIGN_OR_RETURN(job->eval, LoadExamples(spec, *job->tokenizer, spec.data().eval_path(),
                                             spec.data().max_eval_examples()));
  }
  auto& model = *job->model;
  int64_t trainable = 0;
  for (int64_t i = 0; i < model.num_linears(); ++i) {
    const at::Tensor& w = model.LinearWeight(i);
    job->linears.push_back(
        {static_cast<int32_t>(i), model.LinearName(i), w.size(0), w.size(1)});
    trainable += w.numel();
  }
  lspo::v1::LoadJobReply reply;
  if (job->lsp) {
    const int d = spec.lsp().d(), r = spec.lsp().r();
    for (const auto& l : job->linears) {
      absl::Status s = lsp::CheckProjectorShapes(l.m, l.n, d, r);
      if (!s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "job spec field lsp.d = ", d, " / lsp.r = ", r, " does not fit ", l.name, " (",
            l.m, " x ", l.n, "): ", s.message()));
      }
    }
    ASSIGN_OR_RETURN(job->layout, BuildArenaLayout(job->linears, d, r,
                                                   runtime::ShmArena::UniqueName(job_id)));
    ASSIGN_OR_RETURN(job->arena,
                     runtime::ShmArena::Create(job->layout.name(), job->layout.bytes()));
    job->p.resize(job->linears.size());
    job->q.resize(job->linears.size());
    job->s_accum.resize(job->linears.size());
    for (auto& s : job->s_accum) s = at::zeros({d, d}, at::kFloat);
    model.SetLinearMode(model::LinearMode::kLsp);
    WorkerJob* raw = job.get();
    model.SetCompressedGradSink([raw](int64_t i, const at::Tensor& s) {
      raw->s_accum[i].add_(s);
    });
    *reply.mutable_arena() = job->layout;
  } else {
    model.SetLinearMode(model::LinearMode::kDense);
    std::vector<at::Tensor> params;
    for (int64_t i = 0; i < model.num_linears(); ++i) params.push_back(model.LinearWeight(i));
    const auto& o = spec.optim();
    job->adamw = std::make_unique<torch::optim::AdamW>(
        params, torch::optim::AdamWOptions(o.lr())
                    .betas({o.beta1(), o.beta2()})
                    .eps(o.eps())
                    .weight_decay(o.weight_decay()));
  }
  reply.set_train_examples(job->train.size());
  reply.set_eval_examples(job->eval.size());
  reply.set_trainable_parameters(trainable);
  reply.set_device("cpu");
  reply.set_seconds(runtime::SecondsSince(t0));
  LOG(INFO) << "worker: loaded job " << job_id << ": " << job->train.size() << " train / "
            << job->eval.size() << " eval examples, " << trainable
            << " trainable parameters in " << job->linears.size() << " matrices";
  job_ = std::move(job);
  return reply;
}

absl::StatusOr<lspo::v1::FitProjectorsReply> WorkerCore::FitProjectors(
    const std::string& job_id, int step) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  if (!job->lsp) return absl::FailedPreconditionError("FitProjectors needs MODE_LSP");
  auto t0 = std::chrono::steady_clock::now();
  auto& model = *job->model;
  const auto& spec = job->spec;
  // The scheduler calls FitProjectors only after the optimizer attached the arena, so its
  // name is no longer needed: unlinking now means a crash later leaves nothing in /dev/shm.
  job->arena.Unlink();
  lspo::v1::FitProjectorsReply reply;
  absl::Status st = TorchCall("calibration gradients", [&]() -> absl::Status {
    // Calibration gradient: dense G of every trained matrix, mean over the calibration
    // examples' answer tokens (a fixed subset drawn with seed + 1).
    const int64_t n_cal =
        std::min<int64_t>(spec.lsp().calibration_examples(), job->train.size());
    std::vector<int64_t> cal =
        data::ShuffledOrder(job->train.size(), spec.seed() + 1, /*epoch=*/step);
    cal.resize(n_cal);
    model.SetLinearMode(model::LinearMode::kDense);
    for (int64_t i = 0; i < model.num_linears(); ++i) {
      at::Tensor& w = model.LinearWeight(i);
      if (w.grad().defined()) w.mutable_grad().zero_();
    }
    const int64_t mb = spec.micro_batch_size();
    std::vector<data::Batch> batches;
    int64_t total = 0;
    for (int64_t s = 0; s < n_cal; s += mb) {
      std::vector<const data::TokenizedExample*> rows;
      for (int64_t k = s; k < std::min(n_cal, s + mb); ++k) rows.push_back(&job->train[cal[k]]);
      batches.push_back(data::MakeBatch(rows, job->tokenizer->pad_id()));
      total += batches.back().num_loss_tokens;
    }
    for (const auto& b : batches) {
      const int64_t targets = b.num_loss_tokens;
      if (targets == 0) continue;
      at::Tensor loss = model.CausalLmLoss(ToTensor(b.input_ids, b.batch_size, b.seq_len),
                                           ToTensor(b.labels, b.batch_size, b.seq_len));
      (loss * (static_cast<double>(targets) / total)).backward();
    }
    const int d = spec.lsp().d(), r = spec.lsp().r();
    lsp::FitOptions opts;
    opts.max_iters = std::max(0, spec.lsp().fit_iters());
    opts.lr = spec.lsp().fit_lr();
    opts.alpha = 0.0;
    // fp32 objective: ~1.5x faster than fp64 here (bench/lsp_fit_bench); the reported errors
    // are recomputed exactly (RelativeBias, fp64) by FitProjectors.
    opts.float64 = false;
    double err_sum = 0;
    for (int64_t i = 0; i < model.num_linears(); ++i) {
      at::Tensor& w = model.LinearWeight(i);
      at::Tensor g = w.grad().detach().clone();  // (m, n) fp32
      w.mutable_grad() = at::Tensor();
      const bool finite = at::isfinite(g).all().item<bool>();
      const bool have = job->p[i].rows > 0;
      if (!finite) {
        LOG(WARNING) << "worker: non-finite calibration gradient for " << job->linears[i].name
                     << "; keeping " << (have ? "its projectors" : "random projectors");
      }
      if (have && finite) {
        const double err = lsp::RelativeBias(g, job->p[i], job->q[i]);
        if (err <= spec.lsp().alpha()) {
          reply.add_initial_error(err);
          reply.add_final_error(err);
          err_sum += err;
          continue;
        }
      }
      if (have && !finite) {
        reply.add_initial_error(NAN);
        reply.add_final_error(NAN);
        continue;
      }
      const uint64_t seed = spec.seed() * 1000003ull + static_cast<uint64_t>(i) * 7919ull +
                            static_cast<uint64_t>(step) * 104729ull;
      ASSIGN_OR_RETURN(lsp::SparseProjector p,
                       lsp::SparseProjector::Random(job->linears[i].m, d, r, seed));
      ASSIGN_OR_RETURN(lsp::SparseProjector q,
                       lsp::SparseProjector::Random(job->linears[i].n, d, r, seed + 1));
      double init_err = NAN, final_err = NAN;
      if (finite && opts.max_iters > 0 && g.abs().max().item<float>() > 0) {
        ASSIGN_OR_RETURN(lsp::FitResult fit, lsp::FitProjectors(g, &p, &q, opts));
        init_err = fit.initial_error;
        final_err = fit.final_error;
      } else if (finite && g.abs().max().item<float>() > 0) {
        init_err = final_err = lsp::RelativeBias(g, p, q);
      }
      reply.add_initial_error(init_err);
      reply.add_final_error(final_err);
      if (std::isfinite(final_err)) err_sum += final_err;
      const auto& slot = job->layout.linears(i);
      RETURN_IF_ERROR(WriteProjector(job->arena, slot.p_index(), slot.p_value(), p));
      RETURN_IF_ERROR(WriteProjector(job->arena, slot.q_index(), slot.q_value(), q));
      RETURN_IF_ERROR(model.SetProjectors(i, p, q));
      job->p[i] = std::move(p);
      job->q[i] = std::move(q);
      reply.add_refitted(i);
    }
    model.SetLinearMode(model::LinearMode::kLsp);
    job->fitted = true;
    LOG(INFO) << "worker: projector check at step " << step << ": " << reply.refitted_size()
              << " of " << model.num_linears() << " matrices (re)fitted, mean relative bias "
              << err_sum / std::max(1, reply.final_error_size());
    return absl::OkStatus();
  });
  if (!st.ok()) {
    model.SetLinearMode(model::LinearMode::kLsp);
    return st;
  }
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::TrainStepReply> WorkerCore::TrainStep(const std::string& job_id,
                                                              int step, double lr) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  if (job->lsp && !job->fitted) {
    return absl::FailedPreconditionError("TrainStep before FitProjectors in MODE_LSP");
  }
  if (step < 1) return absl::InvalidArgumentError("TrainStep: step is 1-based");
  auto t_step = std::chrono::steady_clock::now();
  const auto& spec = job->spec;
  auto& model = *job->model;
  lspo::v1::TrainStepReply reply;
  auto* metrics = reply.mutable_metrics();
  metrics->set_step(step);
  metrics->set_lr(lr);
  absl::Status st = TorchCall("train step", [&]() -> absl::Status {
    const bool balanced = spec.data().balance_classes() && !job->train_class.empty();
    // Epoch length: every example once, or (balanced) classes x largest class size.
    const int64_t n = balanced ? static_cast<int64_t>(
                                     data::BalancedOrder(job->train_class, spec.seed(), 0).size())
                               : static_cast<int64_t>(job->train.size());
    const int64_t mb = spec.micro_batch_size(), accum = spec.grad_accum();
    std::vector<data::Batch> batches;
    int64_t total = 0, input_tokens = 0;
    for (int64_t a = 0; a < accum; ++a) {
      std::vector<const data::TokenizedExample*> rows;
      for (int64_t b = 0; b < mb; ++b) {
        const int64_t g = ((step - 1) * accum + a) * mb + b;
        const int64_t epoch = g / n;
        if (epoch != job->order_epoch) {
          job->order = balanced ? data::BalancedOrder(job->train_class, spec.seed(), epoch)
                                : data::ShuffledOrder(n, spec.seed(), epoch);
          job->order_epoch = epoch;
        }
        rows.push_back(&job->train[job->order[g % n]]);
      }
      batches.push_back(data::MakeBatch(rows, job->tokenizer->pad_id()));
      total += batches.back().num_loss_tokens;
      input_tokens += batches.back().batch_size * batches.back().seq_len;
    }
    if (job->lsp) {
      for (auto& s : job->s_accum) s.zero_();
    } else {
      job->adamw->zero_grad();
    }
    double loss_sum = 0, fwd = 0, bwd = 0;
    for (const auto& b : batches) {
      const int64_t targets = b.num_loss_tokens;
      if (targets == 0) continue;
      auto t0 = std::chrono::steady_clock::now();
      at::Tensor loss = model.CausalLmLoss(ToTensor(b.input_ids, b.batch_size, b.seq_len),
                                           ToTensor(b.labels, b.batch_size, b.seq_len));
      fwd += runtime::SecondsSince(t0);
      const double lv = loss.item<double>();
      if (!std::isfinite(lv)) {
        reply.set_nonfinite(true);
        return absl::OkStatus();
      }
      loss_sum += lv * targets;
      t0 = std::chrono::steady_clock::now();
      (loss * (static_cast<double>(targets) / total)).backward();
      bwd += runtime::SecondsSince(t0);
    }
    metrics->set_loss(total > 0 ? loss_sum / total : 0.0);
    metrics->set_tokens(total);
    metrics->set_forward_seconds(fwd);
    metrics->set_backward_seconds(bwd);
    if (job->lsp) {
      for (size_t i = 0; i < job->s_accum.size(); ++i) {
        if (!at::isfinite(job->s_accum[i]).all().item<bool>()) {
          LOG(WARNING) << "worker: non-finite compressed gradient for " << job->linears[i].name
                       << " at step " << step << "; step skipped";
          reply.set_nonfinite(true);
          return absl::OkStatus();
        }
      }
      for (size_t i = 0; i < job->s_accum.size(); ++i) {
        ASSIGN_OR_RETURN(at::Tensor slot, ArenaF32(job->arena, job->layout.linears(i).grad()));
        slot.copy_(job->s_accum[i]);
      }
    } else {
      auto t0 = std::chrono::steady_clock::now();
      for (auto& group : job->adamw->param_groups()) {
        static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
      }
      job->adamw->step();
      metrics->set_update_seconds(runtime::SecondsSince(t0));
    }
    const double secs = runtime::SecondsSince(t_step);
    metrics->set_step_seconds(secs);
    metrics->set_tokens_per_second(secs > 0 ? input_tokens / secs : 0);
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  return reply;
}

absl::StatusOr<lspo::v1::ApplyReply> WorkerCore::ApplyUpdates(
    const std::string& job_id, int step, const lspo::v1::ApplyRequest& request) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  if (!job->lsp) return absl::FailedPreconditionError("ApplyUpdates needs MODE_LSP");
  auto t0 = std::chrono::steady_clock::now();
  // Validate every step first so that a bad one leaves all weights untouched.
  std::vector<std::pair<int, at::Tensor>> steps;
  for (const auto& task : request.tasks()) {
    if (task.index() < 0 || task.index() >= job->layout.linears_size()) {
      return absl::InvalidArgumentError(absl::StrCat("ApplyUpdates: linear index ",
                                                     task.index(), " out of range"));
    }
    ASSIGN_OR_RETURN(at::Tensor d, ArenaF32(job->arena, job->layout.linears(task.index()).step()));
    if (!at::isfinite(d).all().item<bool>()) {
      return absl::DataLossError(absl::StrCat("step D for ", job->linears[task.index()].name,
                                              " at step ", step,
                                              " is not finite; weights left untouched"));
    }
    steps.emplace_back(task.index(), d);
  }
  absl::Status st = TorchCall("apply", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    for (auto& [i, d] : steps) {
      lsp::ApplyStep(job->model->LinearWeight(i), job->p[i], d, job->q[i]);
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  lspo::v1::ApplyReply reply;
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::StatusOr<lspo::v1::EvalMetrics> WorkerCore::Evaluate(const std::string& job_id, int step) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  lspo::v1::EvalMetrics out;
  out.set_step(step);
  if (job->eval.empty()) return out;
  absl::Status st = TorchCall("evaluate", [&]() -> absl::Status {
    at::NoGradGuard no_grad;
    auto& model = *job->model;
    ASSIGN_OR_RETURN(at::Tensor lm_head,
                     model.GetTensor(model.config().tie_word_embeddings
                                         ? "model.embed_tokens.weight"
                                         : "lm_head.weight"));  // (V, H)
    // Sort by length so batches carry little padding (right padding; causal attention).
    std::vector<int64_t> idx(job->eval.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
      return job->eval[a].input_ids.size() < job->eval[b].input_ids.size();
    });
    const int64_t bs = std::max(1, job->spec.micro_batch_size() * 2);
    int64_t correct = 0, counted = 0, targets = 0;
    double loss_sum = 0;
    for (size_t s = 0; s < idx.size(); s += bs) {
      std::vector<const data::TokenizedExample*> rows;
      for (size_t k = s; k < std::min(idx.size(), s + bs); ++k) rows.push_back(&job->eval[idx[k]]);
      data::Batch b = data::MakeBatch(rows, job->tokenizer->pad_id());
      at::Tensor ids = ToTensor(b.input_ids, b.batch_size, b.seq_len);
      at::Tensor hidden = model.Hidden(ids);  // (B, T, H)
      // Gather every position that predicts a target, plus (classification) the position
      // before the first answer token for the greedy prediction.
      std::vector<int64_t> pos_b, pos_t, tgt;
      std::vector<int64_t> first_row;  // Index into pos_* of each row's first answer target.
      for (int64_t i = 0; i < b.batch_size; ++i) {
        int64_t first = -1;
        for (int64_t t = 1; t < b.seq_len; ++t) {
          const int64_t label = b.labels[i * b.seq_len + t];
          if (label == -100) continue;
          if (first < 0) first = pos_b.size();
          pos_b.push_back(i);
          pos_t.push_back(t - 1);
          tgt.push_back(label);
        }
        first_row.push_back(first);
      }
      if (tgt.empty()) continue;
      const int64_t k = tgt.size();
      at::Tensor rows_h = hidden.index({ToTensor(pos_b, k, 1).view(-1),
                                        ToTensor(pos_t, k, 1).view(-1)});  // (K, H)
      at::Tensor logits = at::matmul(rows_h, lm_head.t());                 // (K, V)
      at::Tensor target = ToTensor(tgt, k, 1).view(-1);
      at::Tensor nll = at::cross_entropy_loss(logits, target, {}, at::Reduction::Sum);
      loss_sum += nll.item<double>();
      targets += k;
      if (job->classification) {
        // Greedy first answer token, compared after decoding, trimming and lower-casing
        // (so "Spam" and " spam" count as "spam").
        at::Tensor pred = logits.argmax(-1);
        auto pred_a = pred.accessor<int64_t, 1>();
        for (int64_t i = 0; i < b.batch_size; ++i) {
          if (first_row[i] < 0) continue;
          ++counted;
          correct += NormalizedToken(*job->tokenizer, pred_a[first_row[i]]) ==
                     NormalizedToken(*job->tokenizer, tgt[first_row[i]]);
        }
      }
    }
    out.set_examples(job->eval.size());
    out.set_loss(targets > 0 ? loss_sum / targets : 0.0);
    out.set_accuracy(counted > 0 ? static_cast<double>(correct) / counted : 0.0);
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  out.set_seconds(runtime::SecondsSince(t0));
  return out;
}

absl::StatusOr<lspo::v1::SaveReply> WorkerCore::SaveArtifacts(const std::string& job_id,
                                                             const std::string& dir) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(WorkerJob * job, Find(job_id));
  auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(runtime::MakeDirs(dir));
  lspo::v1::SaveReply reply;
  {
    const std::string path = dir + "/config.json";
    std::ofstream out(path);
    out << job->model->config().ToHfConfigJson("float32").dump(2) << "\n";
    if (!out.good()) {
      return absl::InternalError(absl::StrCat("cannot write '", path, "' (disk full?)"));
    }
    reply.add_files(path);
  }
  RETURN_IF_ERROR(job->tokenizer->WriteHfFiles(dir));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}) {
    reply.add_files(dir + "/" + f);
  }
  if (!job->lsp) {
    std::vector<std::pair<std::string, at::Tensor>> tensors = job->model->NamedTensors();
    std::vector<model::SafetensorsEntry> entries;
    for (auto& [name, t] : tensors) {
      t = t.detach().to(at::kFloat).contiguous();
      entries.push_back({name, "F32", t.sizes().vec(), t.data_ptr(),
                         static_cast<size_t>(t.numel() * 4)});
    }
    const std::string path = dir + "/model.safetensors";
    RETURN_IF_ERROR(model::WriteSafetensors(path, entries, {{"format", "pt"}}));
    reply.add_files(path);
  }
  reply.set_seconds(runtime::SecondsSince(t0));
  return reply;
}

absl::Status WorkerCore::UnloadJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (job_ != nullptr && job_->id == job_id) job_.reset();
  return absl::OkStatus();
}

}  // namespace lspo::worker
