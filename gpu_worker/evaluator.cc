#include "gpu_worker/evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "data/datasets.h"
#include "gpu_worker/worker_job.h"
#include "offload/torch_call.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

using runtime::MonotonicSeconds;

absl::StatusOr<lspo::v1::EvalMetrics> EvaluateJob(WorkerJob* job, int step) {
  auto t0 = std::chrono::steady_clock::now();
  lspo::v1::EvalMetrics out;
  out.set_step(step);
  if (job->eval.empty() && job->ppl_blocks.empty()) return out;
  absl::Status st = offload::TorchCall("evaluate", [&]() -> absl::Status {
    job->model->ClearHookStatus();
    RETURN_IF_ERROR(ApplyPending(job, -1));
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
      at::Tensor ids = ToTensor(b.input_ids, b.batch_size, b.seq_len, job->device);
      at::Tensor hidden = model.Hidden(ids);  // (B, T, H)
      RETURN_IF_ERROR(model.HookStatus());
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
      at::Tensor rows_h = hidden.index({ToTensor(pos_b, k, 1, job->device).view(-1),
                                        ToTensor(pos_t, k, 1, job->device).view(-1)});  // (K, H)
      at::Tensor logits = at::matmul(rows_h, lm_head.t());                 // (K, V)
      at::Tensor target = ToTensor(tgt, k, 1, job->device).view(-1);
      at::Tensor nll = at::cross_entropy_loss(logits, target, {}, at::Reduction::Sum);
      loss_sum += nll.item<double>();
      targets += k;
      if (job->classification) {
        // Greedy first answer token, compared after decoding, trimming and lower-casing
        // (so "Spam" and " spam" count as "spam").
        at::Tensor pred = logits.argmax(-1);
        pred = pred.cpu();
        auto pred_a = pred.accessor<int64_t, 1>();
        for (int64_t i = 0; i < b.batch_size; ++i) {
          if (first_row[i] < 0) continue;
          ++counted;
          correct += NormalizedToken(*job->tokenizer, pred_a[first_row[i]]) ==
                     NormalizedToken(*job->tokenizer, tgt[first_row[i]]);
        }
      }
    }
    // Perplexity of the text corpus: exp of the mean next-token loss over every token.
    if (!job->ppl_blocks.empty()) {
      double nll = 0;
      int64_t tokens = 0;
      const int64_t T = job->ppl_blocks[0].size();
      for (size_t s = 0; s < job->ppl_blocks.size(); s += bs) {
        const int64_t rows = std::min<int64_t>(bs, job->ppl_blocks.size() - s);
        std::vector<int64_t> ids;
        for (int64_t k = 0; k < rows; ++k) {
          ids.insert(ids.end(), job->ppl_blocks[s + k].begin(), job->ppl_blocks[s + k].end());
        }
        at::Tensor t = ToTensor(ids, rows, T, job->device);
        const int64_t targets = rows * (T - 1);
        nll += model.CausalLmLoss(t, t).item<double>() * targets;
        RETURN_IF_ERROR(model.HookStatus());
        tokens += targets;
      }
      out.set_perplexity(std::exp(nll / std::max<int64_t>(tokens, 1)));
      out.set_perplexity_tokens(tokens);
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

}  // namespace lspo::worker
