// The offload schedules and baselines end to end (embedded mode, tiny seeded Llama on
// Moby-Dick): serial and overlapped plans give bitwise-identical weights (lsp and zero); zero
// mode's first AdamW step equals native's up to the bf16 rounding of the gradient (with and
// without decoupled weight decay); the worker's weights track the fp32 master exactly in fp32
// (weight decay included), and with bf16 weights the master-weight refresh bounds the drift;
// the narrow-matrix rules: full subspaces equal native AdamW, one-sided ones track the master.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "client/embedded.h"
#include "tests/integration/start_embedded.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

struct RunResult {
  v1::JobStatus status;
  nlohmann::json summary;
  std::vector<double> losses;
};

RunResult RunJob(const v1::JobSpec& spec) {
  RunResult out;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobReply rep;
  grpc::Status st = stub->SubmitJob(&ctx, req, &rep);
  EXPECT_TRUE(st.ok()) << st.error_message();
  grpc::ClientContext wctx;
  v1::WatchJobRequest wreq;
  wreq.set_job_id(rep.job_id());
  auto reader = stub->WatchJob(&wctx, wreq);
  for (v1::JobStatus s; reader->Read(&s);) out.status = s;
  (void)reader->Finish();
  std::ifstream sf(spec.output_dir() + "/summary.json");
  if (sf.good()) out.summary = nlohmann::json::parse(sf);
  std::ifstream mf(spec.output_dir() + "/metrics.jsonl");
  for (std::string line; std::getline(mf, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["kind"] == "step") out.losses.push_back(j["loss"].get<double>());
  }
  return out;
}

v1::JobSpec Spec(const std::string& tag, v1::TrainingMode mode, int steps,
                 const std::string& schedule) {
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir(tag), mode, steps);
  spec.set_schedule(schedule == "serial" ? v1::STEP_SCHEDULE_SERIAL : v1::STEP_SCHEDULE_OVERLAP);
  spec.set_skip_initial_eval(true);
  return spec;
}

std::vector<uint8_t> FileBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

void ExpectSameRun(v1::TrainingMode mode, const char* tag) {
  RunResult serial = RunJob(Spec(std::string(tag) + "-serial", mode, 4, "serial"));
  RunResult overlap = RunJob(Spec(std::string(tag) + "-overlap", mode, 4, "overlap"));
  ASSERT_EQ(serial.status.state(), v1::SUCCEEDED) << serial.status.error();
  ASSERT_EQ(overlap.status.state(), v1::SUCCEEDED) << overlap.status.error();
  // Every step's loss and the final eval loss (worker weights) bitwise equal; the fp32 master
  // weights (model.safetensors) byte for byte.
  EXPECT_EQ(serial.losses, overlap.losses);
  EXPECT_EQ(serial.summary["final_eval_loss"].get<double>(),
            overlap.summary["final_eval_loss"].get<double>());
  const auto a = FileBytes(serial.status.output_dir() + "/model.safetensors");
  const auto b = FileBytes(overlap.status.output_dir() + "/model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "master weights differ between the serial and overlapped plans";
  // The overlapped run really overlapped: steps 2.. ran with a plan from the cost model.
  std::ifstream tl(overlap.status.output_dir() + "/timeline.jsonl");
  int overlapped = 0, lines = 0;
  for (std::string line; std::getline(tl, line); ++lines) {
    auto j = nlohmann::json::parse(line);
    overlapped += j["plan"]["overlap"].get<bool>();
    EXPECT_FALSE(j["events"].empty());
  }
  EXPECT_EQ(lines, 4);
  EXPECT_EQ(overlapped, 3);
}

TEST(ScheduleTest, LspSerialAndOverlappedPlansGiveIdenticalWeights) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectSameRun(v1::MODE_LSP, "sched-lsp");
}

TEST(ScheduleTest, ZeroSerialAndOverlappedPlansGiveIdenticalWeights) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectSameRun(v1::MODE_ZERO, "sched-zero");
}

// Calibration gradients formed one decoder layer per pass (bounded memory) are the same as
// those of one pass over all layers, so the fitted projectors and the trained weights are
// bitwise identical.
TEST(ScheduleTest, CalibrationOneLayerPerPassMatchesOnePass) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  v1::JobSpec one = Spec("calib-one", v1::MODE_LSP, 2, "serial");
  v1::JobSpec all = Spec("calib-all", v1::MODE_LSP, 2, "serial");
  one.mutable_lsp()->set_calibration_layers_per_pass(1);
  RunResult a = RunJob(one), b = RunJob(all);
  ASSERT_EQ(a.status.state(), v1::SUCCEEDED) << a.status.error();
  ASSERT_EQ(b.status.state(), v1::SUCCEEDED) << b.status.error();
  EXPECT_EQ(a.summary["projector_fitted_relative_bias"].get<double>(),
            b.summary["projector_fitted_relative_bias"].get<double>());
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_TRUE(FileBytes(one.output_dir() + "/model.safetensors") ==
              FileBytes(all.output_dir() + "/model.safetensors"));
}

// The trained matrices (*_proj.weight) of two runs' model.safetensors, element by element:
// how many elements, how many differ by more than `tol`, and the largest difference.
struct WeightDiff {
  int64_t total = 0, off = 0;
  double worst = 0;
};
WeightDiff CompareTrainedWeights(const std::string& dir_a, const std::string& dir_b, double tol) {
  WeightDiff out;
  auto fa = model::SafetensorsFile::Open(dir_a + "/model.safetensors");
  auto fb = model::SafetensorsFile::Open(dir_b + "/model.safetensors");
  EXPECT_TRUE(fa.ok() && fb.ok());
  if (!fa.ok() || !fb.ok()) return out;
  for (const std::string& name : fa->names()) {
    if (name.find("_proj.weight") == std::string::npos) continue;
    auto a = fa->ReadF32(name);
    auto b = fb->ReadF32(name);
    EXPECT_TRUE(a.ok() && b.ok() && a->size() == b->size()) << name;
    if (!a.ok() || !b.ok() || a->size() != b->size()) continue;
    for (size_t k = 0; k < a->size(); ++k) {
      const double diff = std::fabs((*a)[k] - (*b)[k]);
      ++out.total;
      out.off += diff > tol;
      out.worst = std::max(out.worst, diff);
    }
  }
  return out;
}

// Zero mode's master after one step vs native AdamW's weights: AdamW step 1 is
// W (1 - lr wd) - lr g / (|g| + eps), so the bf16 rounding of g only matters where |g| is
// within a few eps; nearly every element must agree to 1% of lr.
void ExpectZeroMatchesNative(double weight_decay) {
  const double lr = 1e-2;
  v1::JobSpec zs = Spec("zero-vs-native-z", v1::MODE_ZERO, 1, "overlap");
  v1::JobSpec ns = Spec("zero-vs-native-n", v1::MODE_NATIVE, 1, "overlap");
  for (v1::JobSpec* s : {&zs, &ns}) {
    s->mutable_optim()->set_lr(lr);
    s->mutable_optim()->set_weight_decay(weight_decay);
  }
  RunResult z = RunJob(zs), n = RunJob(ns);
  ASSERT_EQ(z.status.state(), v1::SUCCEEDED) << z.status.error();
  ASSERT_EQ(n.status.state(), v1::SUCCEEDED) << n.status.error();
  EXPECT_EQ(z.losses, n.losses);  // same data, same initial weights
  const WeightDiff diff = CompareTrainedWeights(zs.output_dir(), ns.output_dir(), 0.01 * lr);
  const int64_t total = diff.total, off = diff.off;
  auto nf = model::SafetensorsFile::Open(ns.output_dir() + "/model.safetensors");
  ASSERT_TRUE(nf.ok());
  int64_t moved = 0;
  // The initial weights: compare one matrix with the native run's to make sure both moved.
  auto initial = RunJob([&] {
    v1::JobSpec s = Spec("zero-vs-native-0", v1::MODE_NATIVE, 1, "overlap");
    s.mutable_optim()->set_lr(1e-12);
    return s;
  }());
  auto f0 = model::SafetensorsFile::Open(initial.status.output_dir() + "/model.safetensors");
  ASSERT_TRUE(f0.ok());
  auto w0 = f0->ReadF32("model.layers.0.mlp.down_proj.weight");
  auto w1 = nf->ReadF32("model.layers.0.mlp.down_proj.weight");
  for (size_t k = 0; k < w0->size(); ++k) moved += std::fabs((*w0)[k] - (*w1)[k]) > 0.5 * lr;
  EXPECT_GT(total, 50000);
  EXPECT_LT(off, total / 1000) << off << " of " << total << " elements differ by > 1% of lr";
  EXPECT_GT(moved, static_cast<int64_t>(w0->size()) / 2) << "native weights barely moved";
}

TEST(ScheduleTest, ZeroMatchesNativeAdamWAfterOneStep) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectZeroMatchesNative(0.0);
}

TEST(ScheduleTest, ZeroMatchesNativeAdamWWithWeightDecay) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectZeroMatchesNative(0.5);
}

// fp32 worker weights track W_master = base + P (sum D) Q^T to fp32 rounding (weight decay,
// clipping and a projector refit with state transfer included); with bf16 weights at a tiny lr
// and round-to-nearest applies the updates are lost in rounding unless the worker is
// refreshed from the master.
TEST(ScheduleTest, WorkerTracksMasterAndRefreshBoundsBf16Drift) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto spec = [](const std::string& tag, const std::string& dtype, const std::string& refresh,
                 double lr, int steps) {
    v1::JobSpec s = Spec(tag, v1::MODE_LSP, steps, "overlap");
    s.set_weight_dtype(dtype == "bf16" ? v1::WEIGHT_DTYPE_BF16 : v1::WEIGHT_DTYPE_FP32);
    s.mutable_lsp()->set_master_refresh(refresh == "refit" ? v1::MASTER_REFRESH_REFIT
                                                           : v1::MASTER_REFRESH_NEVER);
    s.mutable_lsp()->set_check_freq(5);
    s.mutable_lsp()->set_alpha(1e-3);  // every check refits (and transfers the Adam state)
    s.mutable_optim()->set_lr(lr);
    s.set_eval_every(0);
    return s;
  };
  v1::JobSpec fp32 = spec("drift-fp32", "fp32", "never", 1e-2, 8);
  fp32.mutable_optim()->set_weight_decay(0.1);
  fp32.mutable_optim()->set_max_grad_norm(0.5);
  RunResult r = RunJob(fp32);
  ASSERT_EQ(r.status.state(), v1::SUCCEEDED) << r.status.error();
  EXPECT_LT(r.summary["final_worker_master_max_abs_diff"].get<double>(), 1e-6);

  // Round-to-nearest applies (no compensation): what the refresh alone bounds.
  v1::JobSpec never_spec = spec("drift-never", "bf16", "never", 1e-5, 30);
  v1::JobSpec refit_spec = spec("drift-refit", "bf16", "refit", 1e-5, 30);
  never_spec.mutable_lsp()->set_apply_rounding(v1::APPLY_ROUNDING_NEAREST);
  refit_spec.mutable_lsp()->set_apply_rounding(v1::APPLY_ROUNDING_NEAREST);
  RunResult never = RunJob(never_spec);
  RunResult refit = RunJob(refit_spec);
  ASSERT_EQ(never.status.state(), v1::SUCCEEDED) << never.status.error();
  ASSERT_EQ(refit.status.state(), v1::SUCCEEDED) << refit.status.error();
  // Drift beyond one bf16 rounding of the master (lost updates), in ulps of the weights.
  const double d_never = never.summary["final_worker_master_drift_ulps"].get<double>();
  const double d_refit = refit.summary["final_worker_master_drift_ulps"].get<double>();
  std::printf("after 30 steps at lr 1e-5 with bf16 worker weights: max |W_worker - W_master| "
              "no refresh %.3g, refresh every 5 steps %.3g; beyond one bf16 rounding: %.3g vs "
              "%.3g ulp\n",
              never.summary["final_worker_master_max_abs_diff"].get<double>(),
              refit.summary["final_worker_master_max_abs_diff"].get<double>(), d_never, d_refit);
  EXPECT_GT(d_never, 0);
  // The refresh every 5 steps bounds what 30 steps lose.
  EXPECT_LT(d_refit, d_never);
}

// lsp.narrow (lsp/subspace.h). With d = 128 every side of the tiny model (64, 32 and 128 wide)
// is narrow, and the full rule gives every matrix the identity on both sides: S = G and the
// optimizer service runs Adam over whole matrices in fp32. One step must then equal native
// AdamW on the worker up to fp32 summation order (step 1 is -lr g / (|g| + eps)).
TEST(ScheduleTest, LspFullSubspaceMatchesNativeAdamW) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const double lr = 1e-2;
  v1::JobSpec ls = Spec("full-vs-native-l", v1::MODE_LSP, 1, "serial");
  v1::JobSpec ns = Spec("full-vs-native-n", v1::MODE_NATIVE, 1, "serial");
  ls.mutable_lsp()->set_d(128);
  ls.mutable_lsp()->set_narrow(v1::NARROW_RULE_FULL);
  for (v1::JobSpec* s : {&ls, &ns}) s->mutable_optim()->set_lr(lr);
  RunResult l = RunJob(ls), n = RunJob(ns);
  ASSERT_EQ(l.status.state(), v1::SUCCEEDED) << l.status.error();
  ASSERT_EQ(n.status.state(), v1::SUCCEEDED) << n.status.error();
  EXPECT_EQ(l.summary["narrow"], "full");
  ASSERT_EQ(l.losses.size(), 1u);
  ASSERT_EQ(n.losses.size(), 1u);
  EXPECT_NEAR(l.losses[0], n.losses[0], 1e-6 * n.losses[0]);  // same data and weights
  const WeightDiff diff = CompareTrainedWeights(ls.output_dir(), ns.output_dir(), 1e-3 * lr);
  const int64_t total = diff.total, off = diff.off;
  const double worst = diff.worst;
  std::printf("full subspace vs native AdamW after one step: %lld of %lld elements differ by "
              "> 1e-3 lr, max |diff| %.3g (lr %g)\n",
              static_cast<long long>(off), static_cast<long long>(total), worst, lr);
  EXPECT_GT(total, 50000);
  // Only elements with |g| within a few eps of 0 may differ (fp32 sums in another order).
  EXPECT_LT(off, total / 1000);
  EXPECT_LT(worst, 1e-4 * lr);  // measured 7.5e-9 at lr 1e-2
}

// One-sided subspaces (d = 48: k/v_proj 32 x 64 get P = I (32) and Q (64, 48); S (32, 48)), with
// refits every 2 steps (state transfer on the rectangular moments), weight decay and clipping:
// the fp32 worker tracks the master W0 + sum P D Q^T to fp32 rounding, and the loss falls.
TEST(ScheduleTest, LspOneSidedTracksTheMasterThroughRefits) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  v1::JobSpec s = Spec("one-sided", v1::MODE_LSP, 8, "overlap");
  s.set_weight_dtype(v1::WEIGHT_DTYPE_FP32);
  s.mutable_lsp()->set_d(48);
  s.mutable_lsp()->set_narrow(v1::NARROW_RULE_ONE_SIDED);
  s.mutable_lsp()->set_check_freq(2);
  s.mutable_lsp()->set_alpha(1e-3);  // every check refits
  s.mutable_optim()->set_weight_decay(0.1);
  s.mutable_optim()->set_max_grad_norm(0.5);
  s.set_eval_every(0);
  RunResult r = RunJob(s);
  ASSERT_EQ(r.status.state(), v1::SUCCEEDED) << r.status.error();
  EXPECT_EQ(r.summary["narrow"], "one-sided");
  EXPECT_LT(r.summary["final_worker_master_max_abs_diff"].get<double>(), 1e-6);
  ASSERT_EQ(r.losses.size(), 8u);
  EXPECT_LT(r.losses.back(), r.losses.front());
}

// lsp.apply_rounding compensated (the default for bf16 weights): over 200 steps at lr 1e-5,
// where nearly every update is below half a bf16 ulp, with no master refresh at all, the
// worker's weights stay within one ulp of the rounded fp32 master; round-to-nearest (control)
// drifts several ulps.
TEST(ScheduleTest, CompensatedBf16ApplyStaysWithinOneUlpOfTheMasterOver200Steps) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const auto spec = [](const std::string& tag, v1::ApplyRounding rounding) {
    v1::JobSpec s = Spec(tag, v1::MODE_LSP, 200, "overlap");
    s.set_weight_dtype(v1::WEIGHT_DTYPE_BF16);
    s.mutable_lsp()->set_apply_rounding(rounding);
    s.mutable_lsp()->set_master_refresh(v1::MASTER_REFRESH_NEVER);
    s.mutable_optim()->set_lr(1e-5);
    s.set_eval_every(0);
    s.mutable_data()->set_max_eval_examples(1);
    s.set_skip_checkpoint(true);
    return s;
  };
  RunResult comp = RunJob(spec("kahan-comp", v1::APPLY_ROUNDING_COMPENSATED));
  RunResult near = RunJob(spec("kahan-near", v1::APPLY_ROUNDING_NEAREST));
  ASSERT_EQ(comp.status.state(), v1::SUCCEEDED) << comp.status.error();
  ASSERT_EQ(near.status.state(), v1::SUCCEEDED) << near.status.error();
  const double u_comp = comp.summary["final_worker_master_drift_ulps"].get<double>();
  const double u_near = near.summary["final_worker_master_drift_ulps"].get<double>();
  std::printf("200 steps at lr 1e-5, bf16 worker weights, no refresh: max drift from the "
              "rounded master %.3g ulp compensated, %.3g ulp round-to-nearest; max |W - W_master| "
              "%.3g vs %.3g\n",
              u_comp, u_near, comp.summary["final_worker_master_max_abs_diff"].get<double>(),
              near.summary["final_worker_master_max_abs_diff"].get<double>());
  EXPECT_LE(u_comp, 1.0);
  EXPECT_GT(u_near, 1.0);
}

// lsp.refresh_every bounds stochastic rounding's random walk: every layer is re-rounded from
// the master once in any K steps (scheduler::RollingRefreshLayers). K = 1: every weight is the
// rounded master after every step (drift exactly 0); K = 8: 5 refreshes of each layer in 40
// steps and less drift than no refresh (same seed, same rounding noise up to the first refresh).
TEST(ScheduleTest, RollingRefreshBoundsTheStochasticDrift) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const auto spec = [](const std::string& tag, int every) {
    v1::JobSpec s = Spec(tag, v1::MODE_LSP, 40, "overlap");
    s.set_weight_dtype(v1::WEIGHT_DTYPE_BF16);
    s.mutable_lsp()->set_apply_rounding(v1::APPLY_ROUNDING_STOCHASTIC);
    s.mutable_lsp()->set_refresh_every(every);
    s.mutable_optim()->set_lr(1e-4);
    s.set_eval_every(0);
    s.mutable_data()->set_max_eval_examples(1);
    s.set_skip_checkpoint(true);
    return s;
  };
  RunResult none = RunJob(spec("rolling-0", 0));
  RunResult each = RunJob(spec("rolling-1", 1));
  RunResult k8 = RunJob(spec("rolling-8", 8));
  for (const RunResult* r : {&none, &each, &k8}) {
    ASSERT_EQ(r->status.state(), v1::SUCCEEDED) << r->status.error();
  }
  // With K = 1 every layer is refreshed after each of the 40 steps: that count gives L.
  const int64_t every_step = each.summary["rolling_refresh_layers"].get<int64_t>();
  ASSERT_EQ(every_step % 40, 0) << every_step;
  const int64_t layers = every_step / 40;
  ASSERT_GE(layers, 2);
  const auto ulps = [](const RunResult& r) {
    return r.summary["final_worker_master_drift_ulps"].get<double>();
  };
  std::printf("40 stochastic steps at lr 1e-4, bf16: max drift %.3g ulp without a refresh, %.3g "
              "with refresh_every 8, %.3g with refresh_every 1\n",
              ulps(none), ulps(k8), ulps(each));
  EXPECT_EQ(none.summary["rolling_refresh_layers"].get<int64_t>(), 0);
  EXPECT_EQ(k8.summary["rolling_refresh_layers"].get<int64_t>(), 5 * layers);
  EXPECT_EQ(ulps(each), 0.0);
  EXPECT_EQ(each.summary["final_worker_master_drift_beyond_rounding"].get<double>(), 0.0);
  EXPECT_GT(ulps(none), 1.0);
  EXPECT_LT(ulps(k8), ulps(none));
}

}  // namespace
}  // namespace lspo
