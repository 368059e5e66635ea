// Learning-rate schedule: linear warm-up then constant, cosine or linear decay.
#ifndef LSPO_SCHEDULER_LR_SCHEDULE_H_
#define LSPO_SCHEDULER_LR_SCHEDULE_H_

#include <cmath>

#include "proto/job_spec.pb.h"

namespace lspo::scheduler {

// Warm-up steps of a job of `total_steps`: optim.warmup_steps, or with optim.warmup_ratio
// ceil(warmup_ratio * total_steps) (transformers TrainingArguments.get_warmup_steps).
inline int WarmupSteps(const lspo::v1::OptimSpec& o, int total_steps) {
  if (o.warmup_ratio() > 0) return static_cast<int>(std::ceil(o.warmup_ratio() * total_steps));
  return o.warmup_steps();
}

// Learning rate of 1-based optimizer step `step` out of `total_steps`.
// Warm-up (WarmupSteps): lr * step / warmup for step <= warmup (linear from lr/warmup).
// "cosine": lr_min + (lr - lr_min) * 0.5 * (1 + cos(pi * t)), t = (step - warmup) /
// max(1, total - warmup) in [0, 1], lr_min = min_lr_ratio * lr (Loshchilov & Hutter 2017,
// SGDR eq. 5, single cycle). "linear": lr_min + (lr - lr_min) * (1 - t), the same t
// (the shape of transformers' get_linear_schedule_with_warmup when min_lr_ratio = 0, which
// evaluates it at the 0-based step: one step later than here; docs/spec.md). "constant": lr
// after warm-up.
inline double LearningRate(const lspo::v1::OptimSpec& o, int step, int total_steps) {
  const double lr = o.lr();
  const int warmup = WarmupSteps(o, total_steps);
  if (warmup > 0 && step <= warmup) return lr * static_cast<double>(step) / warmup;
  const bool cosine = o.schedule() == lspo::v1::LR_SCHEDULE_COSINE;
  if (!cosine && o.schedule() != lspo::v1::LR_SCHEDULE_LINEAR) return lr;
  const double lr_min = o.min_lr_ratio() * lr;
  const int span = total_steps - warmup;
  const double t = span <= 0 ? 1.0 : static_cast<double>(step - warmup) / span;
  if (!cosine) return lr_min + (lr - lr_min) * (1.0 - t);
  return lr_min + (lr - lr_min) * 0.5 * (1.0 + std::cos(M_PI * t));
}

}  // namespace lspo::scheduler

#endif  // LSPO_SCHEDULER_LR_SCHEDULE_H_
