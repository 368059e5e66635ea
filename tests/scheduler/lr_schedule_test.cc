// The learning-rate schedules (scheduler/lr_schedule.h) against values worked by hand from
// their formulas: warm-up, constant, cosine (SGDR eq. 5, one cycle) and linear decay
// (transformers' get_linear_schedule_with_warmup, of the 1-based step).
#include "scheduler/lr_schedule.h"

#include <cmath>

#include "gtest/gtest.h"
#include "proto/job_spec.pb.h"

namespace lspo::scheduler {
namespace {

namespace v1 = lspo::v1;

v1::OptimSpec Optim(v1::LrSchedule schedule, int warmup, double min_ratio) {
  v1::OptimSpec o;
  o.set_lr(2.0);
  o.set_warmup_steps(warmup);
  o.set_schedule(schedule);
  o.set_min_lr_ratio(min_ratio);
  return o;
}

TEST(LrScheduleTest, WarmupThenEachDecay) {
  // Warm-up over 2 steps: lr * step / 2.
  for (v1::LrSchedule s :
       {v1::LR_SCHEDULE_CONSTANT, v1::LR_SCHEDULE_COSINE, v1::LR_SCHEDULE_LINEAR}) {
    EXPECT_DOUBLE_EQ(LearningRate(Optim(s, 2, 0), 1, 10), 1.0) << s;
    EXPECT_DOUBLE_EQ(LearningRate(Optim(s, 2, 0), 2, 10), 2.0) << s;
  }
  // After it, t = (step - 2) / 8: step 6 is half-way, step 10 the end.
  EXPECT_DOUBLE_EQ(LearningRate(Optim(v1::LR_SCHEDULE_CONSTANT, 2, 0), 6, 10), 2.0);
  EXPECT_DOUBLE_EQ(LearningRate(Optim(v1::LR_SCHEDULE_LINEAR, 2, 0), 6, 10), 1.0);
  EXPECT_DOUBLE_EQ(LearningRate(Optim(v1::LR_SCHEDULE_LINEAR, 2, 0), 4, 10), 1.5);
  EXPECT_DOUBLE_EQ(LearningRate(Optim(v1::LR_SCHEDULE_LINEAR, 2, 0), 10, 10), 0.0);
  EXPECT_DOUBLE_EQ(LearningRate(Optim(v1::LR_SCHEDULE_COSINE, 2, 0), 6, 10), 1.0);
  // cos(pi / 4) at step 4: 2 * 0.5 * (1 + 0.7071...) = 1.7071...
  EXPECT_NEAR(LearningRate(Optim(v1::LR_SCHEDULE_COSINE, 2, 0), 4, 10), 1.0 + std::sqrt(0.5),
              1e-15);
  // A floor of min_lr_ratio * lr = 0.5: linear ends there, half-way is 1.25.
  EXPECT_DOUBLE_EQ(LearningRate(Optim(v1::LR_SCHEDULE_LINEAR, 2, 0.25), 10, 10), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(Optim(v1::LR_SCHEDULE_LINEAR, 2, 0.25), 6, 10), 1.25);
}

TEST(LrScheduleTest, WarmupRatioIsCeilOfItsShareOfTheSteps) {
  v1::OptimSpec o = Optim(v1::LR_SCHEDULE_LINEAR, 0, 0);
  o.set_warmup_ratio(0.1);
  EXPECT_EQ(WarmupSteps(o, 25), 3);  // ceil(2.5)
  EXPECT_EQ(WarmupSteps(o, 30), 3);
  // 100 * 0.07 is 7.000000000000001 in binary64: 8, as Python's math.ceil(100 * 0.07) in
  // transformers' get_warmup_steps.
  o.set_warmup_ratio(0.07);
  EXPECT_EQ(WarmupSteps(o, 100), 8);
  o.set_warmup_ratio(0.1);
  EXPECT_DOUBLE_EQ(LearningRate(o, 1, 25), 2.0 / 3);
  EXPECT_DOUBLE_EQ(LearningRate(o, 3, 25), 2.0);
  // After it, linear decay over the 22 steps left: half-way at step 3 + 11.
  EXPECT_DOUBLE_EQ(LearningRate(o, 14, 25), 1.0);
  o.set_warmup_ratio(0);
  o.set_warmup_steps(5);
  EXPECT_EQ(WarmupSteps(o, 25), 5);
}

}  // namespace
}  // namespace lspo::scheduler
