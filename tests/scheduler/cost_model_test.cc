// The offload schedule's cost model against hand-computed schedules (scheduler/cost_model.h).
#include "scheduler/cost_model.h"

#include "gtest/gtest.h"

namespace lspo::scheduler {
namespace {

// Two layers: backward 1 s each, forward 1 s each, CPU update 0.5 s, apply 0.1 s, no gap.
LayerTimes TwoLayers() {
  LayerTimes t;
  t.fwd = {1, 1};
  t.bwd = {1, 1};
  t.offload = {0, 0};
  t.update = {0.5, 0.5};
  t.apply = {0.1, 0.1};
  return t;
}

TEST(CostModelTest, ChoosesSplitFromHandComputedSchedule) {
  // Layer 1's update is done at 1.5 s (its gradient at 1 s), layer 0's at 2.5 s; the backward
  // ends at 2 s. s = 0: apply 1 at 2.0-2.1, wait for 0 until 2.5, apply to 2.6, forward to
  // 4.6. s = 1: apply 1 to 2.1, next forward waits for layer 0 until 2.5: 4.6. s = 2: wait
  // until 2.5 before layer 0, layer 1 applied at 3.6: 4.7.
  SplitChoice c = ChooseSplit(TwoLayers(), /*clipping=*/false);
  ASSERT_EQ(c.cost_by_split.size(), 3u);
  EXPECT_NEAR(c.cost_by_split[0], 4.6, 1e-12);
  EXPECT_NEAR(c.cost_by_split[1], 4.6, 1e-12);
  EXPECT_NEAR(c.cost_by_split[2], 4.7, 1e-12);
  EXPECT_EQ(c.split, 1);  // ties prefer the larger split
  EXPECT_NEAR(c.predicted_cost, 4.6, 1e-12);
  EXPECT_NEAR(c.predicted_stall, 0.4, 1e-12);
}

TEST(CostModelTest, ClippingDelaysEveryUpdateUntilTheLastGradient) {
  // Updates start at 2 s (all gradients in): layer 1 done 2.5, layer 0 done 3.0.
  SplitChoice c = ChooseSplit(TwoLayers(), /*clipping=*/true);
  EXPECT_NEAR(c.cost_by_split[0], 5.1, 1e-12);
  EXPECT_NEAR(c.cost_by_split[1], 5.1, 1e-12);
  EXPECT_NEAR(c.cost_by_split[2], 5.2, 1e-12);
  EXPECT_EQ(c.split, 1);
}

TEST(CostModelTest, SlowCpuPushesLayersToTheNextForward) {
  // With a 3 s CPU update per layer the stall moves but cannot be hidden by two layers of
  // forward: every split costs about the same and the numbers follow the recurrences.
  LayerTimes t = TwoLayers();
  t.update = {3, 3};
  SplitChoice c = ChooseSplit(t, false);
  // done1 = 4, done0 = 7. s=0: c = 4.1 then 7.1, + 2 = 9.1. s=1: 4.1, l0 waits to 7, 7.1,
  // 8.1, 9.1. s=2: now 2, l0 waits 7 -> 7.1, 8.1, l1 8.2, 9.2.
  EXPECT_NEAR(c.cost_by_split[0], 9.1, 1e-12);
  EXPECT_NEAR(c.cost_by_split[1], 9.1, 1e-12);
  EXPECT_NEAR(c.cost_by_split[2], 9.2, 1e-12);
}

TEST(CostModelTest, PlansSeriallyUntilATimelineWasObservedThenUsesIt) {
  LayerCostModel model(2, /*clipping=*/false);
  SplitChoice c;
  EXPECT_FALSE(model.Plan(true, &c).overlap());
  std::vector<lspo::v1::LayerEvent> events;
  auto add = [&](int layer, const char* what, double start, double end) {
    lspo::v1::LayerEvent e;
    e.set_layer(layer);
    e.set_what(what);
    e.set_start(start);
    e.set_end(end);
    events.push_back(e);
  };
  add(0, "forward", 0, 1);
  add(1, "forward", 1, 2);
  add(1, "backward", 2, 3);
  add(0, "backward", 3, 4);
  add(1, "update", 3, 3.5);
  add(0, "update", 4, 4.5);
  add(1, "apply", 4.5, 4.6);
  add(0, "apply", 4.6, 4.7);
  add(5, "update", 0, 100);    // layer out of range: ignored
  add(0, "mystery", 0, 100);   // unknown kind: ignored
  model.Observe(events, /*gap=*/0);
  ASSERT_TRUE(model.ready());
  EXPECT_DOUBLE_EQ(model.times().update[0], 0.5);
  EXPECT_DOUBLE_EQ(model.times().bwd[1], 1.0);
  lspo::v1::StepPlan plan = model.Plan(true, &c);
  EXPECT_TRUE(plan.overlap());
  EXPECT_EQ(plan.split_layer(), 1);
  EXPECT_FALSE(model.Plan(false, &c).overlap());  // serial schedule requested
  // A second observation with doubled update times moves the average halfway (smoothing 0.5).
  for (auto& e : events) {
    if (e.what() == "update") e.set_end(e.start() + 2 * (e.end() - e.start()));
  }
  model.Observe(events, 0);
  EXPECT_DOUBLE_EQ(model.times().update[0], 0.75);
}

TEST(CostModelTest, ACudaWorkersDeviceSpansReplaceItsHostSpans) {
  LayerCostModel model(2, /*clipping=*/false);
  std::vector<lspo::v1::LayerEvent> events;
  auto add = [&](int layer, const char* what, const char* actor, double start, double end) {
    lspo::v1::LayerEvent e;
    e.set_layer(layer);
    e.set_what(what);
    e.set_actor(actor);
    e.set_start(start);
    e.set_end(end);
    events.push_back(e);
  };
  // Host spans: enqueue times only (tiny forward, an offload from enqueue to landing).
  add(0, "forward", "worker", 0, 0.01);
  add(1, "forward", "worker", 0.01, 0.02);
  add(1, "backward", "worker", 0.02, 0.03);
  add(0, "backward", "worker", 0.03, 0.04);
  add(1, "offload", "worker", 0.02, 3.0);
  // Device spans: what the GPU really did.
  add(0, "forward", "gpu", 0, 1);
  add(1, "forward", "gpu", 1, 2);
  add(1, "backward", "gpu", 2, 3);
  add(0, "backward", "gpu", 3, 4);
  add(1, "d2h", "pcie", 3, 3.25);
  add(1, "update", "optimizer", 3.25, 3.75);
  add(0, "update", "optimizer", 4, 4.5);
  // The apply: the host's span (enqueue) and the device's two matrices; compress spans inside
  // the backward count nowhere.
  add(1, "apply", "worker", 4.5, 4.51);
  add(1, "apply", "gpu", 4.5, 4.55);
  add(1, "apply", "gpu", 4.55, 4.6);
  add(1, "compress", "gpu", 2.5, 2.6);
  model.Observe(events, /*gap=*/0);
  ASSERT_TRUE(model.ready());
  EXPECT_DOUBLE_EQ(model.times().fwd[0], 1.0);
  EXPECT_DOUBLE_EQ(model.times().bwd[1], 1.0);
  EXPECT_DOUBLE_EQ(model.times().offload[1], 0.25);  // the copy, not enqueue-to-landing
  EXPECT_DOUBLE_EQ(model.times().offload[0], 0.0);
  EXPECT_NEAR(model.times().apply[1], 0.1, 1e-12);    // the device's, not the host's too
  EXPECT_DOUBLE_EQ(model.times().apply[0], 0.0);
}

}  // namespace
}  // namespace lspo::scheduler
