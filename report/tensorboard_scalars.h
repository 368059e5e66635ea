// Which TensorBoard scalars a metrics.jsonl line gives (the run log writes them into the
// job's events file, report/run_log.h). The step of every scalar is the line's "step"
// (the optimizer step; 0 = before training). Tags by kind of line (docs/outputs.md has the
// full table):
//   step           train/loss, train/learning_rate (lr), train/grad_norm,
//                  train/tokens_per_second, train/loss_tokens (tokens);
//                  time/step_s and time/<phase>_s for every <phase>_seconds (forward,
//                  backward, update, apply, wait, offload, d2h, h2d);
//                  offload/bytes_to_cpu (d2h_bytes), offload/bytes_to_gpu (h2d_bytes);
//                  memory/<name> for the other *_bytes counters (peak RSS, GPU memory);
//                  schedule/split_layer; any other number train/<field>
//   eval           eval/<field> for every number (loss, accuracy, examples, ...);
//                  seconds -> eval/time_s; perplexity and perplexity_tokens only when a
//                  perplexity was measured (perplexity > 0)
//   projector_fit  projector/bias_before_fit (mean_initial_relative_bias),
//                  projector/bias_after_fit (mean_final_relative_bias),
//                  projector/refitted_matrices (refitted), projector/fit_time_s (seconds)
//   master_refresh, master_drift
//                  master/worker_max_abs_diff (max |W_worker - W_master|, before a refresh or
//                  at the end), master/drift_beyond_rounding
//   any other kind <kind>/<field> for every number (checkpoint and resume lines have none)
// Numbers are JSON numbers or, for the int64 fields of the protos (protobuf's JSON mapping
// writes them as strings), strings holding a decimal integer in step, eval and data lines.
// Booleans, nulls, other strings, arrays and objects give no scalar.
//
// Thread-safety: pure functions.
#ifndef LSPO_REPORT_TENSORBOARD_SCALARS_H_
#define LSPO_REPORT_TENSORBOARD_SCALARS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace lspo::scheduler {

struct TensorBoardScalar {
  std::string tag;  // e.g. "train/loss".
  float value;      // The field's value rounded to float32 (TensorBoard's simple_value).
};

struct LineScalars {
  int64_t step = 0;                        // The line's "step".
  std::vector<TensorBoardScalar> scalars;  // In the line's field order (sorted keys).
};

// The scalars of one metrics.jsonl line (an object with "kind" and "step"). A line without
// a string "kind" or an integral "step" gives none.
LineScalars TensorBoardScalars(const nlohmann::json& line);

}  // namespace lspo::scheduler

#endif  // LSPO_REPORT_TENSORBOARD_SCALARS_H_
