// Evaluation of a job's model (WorkerCore::Evaluate documents the metrics): answer accuracy
// and answer loss on the eval set (classification), loss on held-out text blocks, and the
// perplexity of data.perplexity_path; with eval.metric = generative also greedy generation
// from each example's prompt (at most eval.max_generate_examples, eval.max_new_tokens tokens
// each and at most to max_position_embeddings, stopping at the model's EOS ids and the
// answer's end-of-turn token) scored against the example's answer (its first loss span in the
// example tokenized without the seq_len cut, special tokens removed) by exact match and tag-set
// precision / recall / F1 (data/answer_metrics.h), with the first 3 generations as samples.
#ifndef LSPO_GPU_WORKER_EVALUATOR_H_
#define LSPO_GPU_WORKER_EVALUATOR_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "gpu_worker/worker_job.h"
#include "proto/metrics.pb.h"

namespace lspo::worker {

// Returns true once the caller gave up on the evaluation (e.g. its RPC was cancelled).
using EvalCancelled = std::function<bool()>;

// Evaluates `job` after step `step`. `cancelled` (may be empty) is polled between batches
// and between generated answers. Errors: a pending update's error, kInternal from LibTorch,
// kCancelled once `cancelled` returns true (the model is left as it was; nothing is
// reported).
absl::StatusOr<lspo::v1::EvalMetrics> EvaluateJob(WorkerJob* job, int step,
                                                  const EvalCancelled& cancelled = {});

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_EVALUATOR_H_
