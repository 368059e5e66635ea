// Shapes: B batch rows, T tokens per row, H hidden size, V vocabulary size, K target positions of a
// batch; hidden states and logits are fp32.
#include "gpu_worker/evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "data/answer_metrics.h"
#include "data/datasets.h"
#include "gpu_worker/worker_job.h"
#include "model/generate.h"
#include "offload/torch_call.h"
#include "runtime/clock.h"
#include "runtime/status_macros.h"
#include "runtime/utf8.h"

namespace lspo::worker {

using runtime::MonotonicSeconds;

namespace {

// `ids` decoded without their special tokens (the end-of-turn token, a BOS).
std::string DecodeText(const model::BpeTokenizer& tok, absl::Span<const int32_t> ids) {
  std::vector<int32_t> kept;
  for (int32_t id : ids) {
    if (!tok.IsSpecial(id)) kept.push_back(id);
  }
  return tok.Decode(kept);
}

// kCancelled when `cancelled` says so, else OK.
absl::Status CheckCancelled(const EvalCancelled& cancelled) {
  if (cancelled && cancelled()) {
    return absl::CancelledError(
        "evaluation cancelled (its caller went away or the job was "
        "cancelled)");
  }
  return absl::OkStatus();
}

// Greedy generation from each evaluation example's prompt (the tokens before its first loss
// token), scored against its answer (the loss tokens from there up to the next non-loss
// token: the first assistant turn). Fills the generative fields of `out`.
absl::Status GenerateAndScore(WorkerJob* job, const EvalCancelled& cancelled,
                              lspo::v1::EvalMetrics* out) {
  const auto& ev = job->spec.eval();
  const int64_t max_new = ev.max_new_tokens() > 0 ? ev.max_new_tokens() : 64;
  const size_t n = job->data.generate.size();  // already capped at max_generate_examples
  const int64_t max_positions = job->model->config().max_position_embeddings;
  const model::BpeTokenizer& tok = *job->data.tokenizer;
  std::vector<int64_t> extra_stops;
  if (tok.eos_id() >= 0) extra_stops.push_back(tok.eos_id());
  const std::vector<int64_t> model_stops = model::StopIds(job->model->config(), extra_stops);
  const auto t0 = std::chrono::steady_clock::now();
  double em = 0, precision = 0, recall = 0, f1 = 0;
  int32_t scored = 0;
  for (size_t i = 0; i < n; ++i) {
    RETURN_IF_ERROR(CheckCancelled(cancelled));
    const data::TokenizedExample& ex = job->data.generate[i];
    const size_t start = static_cast<size_t>(ex.answer_start);
    if (start == 0 || start >= ex.input_ids.size()) continue;  // no prompt or no answer
    size_t end = start;
    while (end < ex.input_ids.size() && ex.labels[end] != data::kIgnoreIndex) ++end;
    const absl::Span<const int32_t> answer =
        absl::MakeConstSpan(ex.input_ids).subspan(start, end - start);
    model::GenerationOptions opts;
    // Within the trained context when the prompt leaves room (RoPE extrapolates past it).
    opts.max_new_tokens =
        max_positions > static_cast<int64_t>(start)
            ? std::min<int64_t>(max_new, max_positions - static_cast<int64_t>(start))
            : 1;
    opts.stop_ids = model_stops;
    // The answer's end-of-turn token (<|im_end|>, <|eot_id|>, </s>) ends the turn too.
    if (!answer.empty() && tok.IsSpecial(answer.back()) &&
        std::find(opts.stop_ids.begin(), opts.stop_ids.end(), answer.back()) ==
            opts.stop_ids.end()) {
      opts.stop_ids.push_back(answer.back());
    }
    ASSIGN_OR_RETURN(
        model::GenerationResult gen,
        model::Generate(*job->model, absl::MakeConstSpan(ex.input_ids).subspan(0, start), opts));
    const std::string reference = DecodeText(tok, answer);
    const std::string prediction = DecodeText(tok, gen.tokens);
    const data::AnswerScore score = data::ScoreAnswer(prediction, reference);
    em += score.exact_match;
    precision += score.precision;
    recall += score.recall;
    f1 += score.f1;
    ++scored;
    if (out->samples_size() < 3) {
      auto* sample = out->add_samples();
      // Protobuf strings must be valid UTF-8: a generation cut mid-character (byte-level
      // tokens) is shown as tokenizers' decode shows it, with U+FFFD.
      sample->set_reference(runtime::Utf8Lossy(reference));
      sample->set_prediction(runtime::Utf8Lossy(prediction));
      sample->set_f1(score.f1);
    }
  }
  if (scored > 0) {
    out->set_exact_match(em / scored);
    out->set_precision(precision / scored);
    out->set_recall(recall / scored);
    out->set_f1(f1 / scored);
  }
  out->set_generated_examples(scored);
  out->set_generation_seconds(runtime::SecondsSince(t0));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<lspo::v1::EvalMetrics> EvaluateJob(WorkerJob* job, int step,
                                                  const EvalCancelled& cancelled) {
  auto t0 = std::chrono::steady_clock::now();
  lspo::v1::EvalMetrics out;
  out.set_step(step);
  if (job->data.eval.empty() && job->data.ppl_blocks.empty()) return out;
  absl::Status st = offload::TorchCall("evaluate", [&]() -> absl::Status {
    job->model->ClearHookStatus();
    RETURN_IF_ERROR(ApplyPending(job, -1));
    at::NoGradGuard no_grad;
    auto& model = *job->model;
    ASSIGN_OR_RETURN(
        at::Tensor lm_head,
        model.GetTensor(model.config().tie_word_embeddings ? "model.embed_tokens.weight"
                                                           : "lm_head.weight"));  // (V, H) fp32
    // Sort by length so batches carry little padding (right padding; causal attention).
    std::vector<int64_t> idx(job->data.eval.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
      return job->data.eval[a].input_ids.size() < job->data.eval[b].input_ids.size();
    });
    const int64_t bs = std::max(1, job->spec.micro_batch_size() * 2);
    int64_t correct = 0, counted = 0, targets = 0;
    double loss_sum = 0;
    for (size_t s = 0; s < idx.size(); s += bs) {
      RETURN_IF_ERROR(CheckCancelled(cancelled));
      std::vector<const data::TokenizedExample*> rows;
      for (size_t k = s; k < std::min(idx.size(), s + bs); ++k)
        rows.push_back(&job->data.eval[idx[k]]);
      data::Batch b = data::MakeBatch(rows, job->data.tokenizer->pad_id());
      at::Tensor ids = ToTensor(b.input_ids, b.batch_size, b.seq_len, job->device);  // (B, T) int64
      at::Tensor hidden = model.Hidden(ids);  // (B, T, H) fp32
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
      at::Tensor logits = at::matmul(rows_h, lm_head.t());                              // (K, V)
      at::Tensor target = ToTensor(tgt, k, 1, job->device).view(-1);                    // (K) int64
      at::Tensor nll = at::cross_entropy_loss(logits, target, {}, at::Reduction::Sum);  // () fp32
      loss_sum += nll.item<double>();
      targets += k;
      if (job->data.classification) {
        // Greedy first answer token, compared after decoding, trimming and lower-casing
        // (so "Spam" and " spam" count as "spam").
        at::Tensor pred = logits.argmax(-1);  // (K) int64
        pred = pred.cpu();
        auto pred_a = pred.accessor<int64_t, 1>();
        for (int64_t i = 0; i < b.batch_size; ++i) {
          if (first_row[i] < 0) continue;
          ++counted;
          correct += NormalizedToken(*job->data.tokenizer, pred_a[first_row[i]]) ==
                     NormalizedToken(*job->data.tokenizer, tgt[first_row[i]]);
        }
      }
    }
    // Perplexity of the text corpus: exp of the mean next-token loss over every token.
    if (!job->data.ppl_blocks.empty()) {
      double nll = 0;
      int64_t tokens = 0;
      const int64_t T = job->data.ppl_blocks[0].size();
      for (size_t s = 0; s < job->data.ppl_blocks.size(); s += bs) {
        RETURN_IF_ERROR(CheckCancelled(cancelled));
        const int64_t rows = std::min<int64_t>(bs, job->data.ppl_blocks.size() - s);
        std::vector<int64_t> ids;
        for (int64_t k = 0; k < rows; ++k) {
          ids.insert(ids.end(), job->data.ppl_blocks[s + k].begin(),
                     job->data.ppl_blocks[s + k].end());
        }
        at::Tensor t = ToTensor(ids, rows, T, job->device);  // (rows, T) int64
        const int64_t targets = rows * (T - 1);
        nll += model.CausalLmLoss(t, t).item<double>() * targets;
        RETURN_IF_ERROR(model.HookStatus());
        tokens += targets;
      }
      out.set_perplexity(std::exp(nll / std::max<int64_t>(tokens, 1)));
      out.set_perplexity_tokens(tokens);
    }
    out.set_examples(job->data.eval.size());
    out.set_loss(targets > 0 ? loss_sum / targets : 0.0);
    out.set_accuracy(counted > 0 ? static_cast<double>(correct) / counted : 0.0);
    if (job->spec.eval().metric() == lspo::v1::EVAL_METRIC_GENERATIVE &&
        !job->data.generate.empty()) {
      RETURN_IF_ERROR(GenerateAndScore(job, cancelled, &out));
    }
    return absl::OkStatus();
  });
  if (!st.ok()) return st;
  out.set_seconds(runtime::SecondsSince(t0));
  return out;
}

}  // namespace lspo::worker
