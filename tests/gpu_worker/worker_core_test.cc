// Unit tests of the worker core (gpu_worker/worker_core.h) without the other services: a tiny
// random Llama on the CPU, and the optimizer's part of the data plane played by the test (it
// attaches to the worker's arena, writes each matrix's step D and publishes it, as
// tests/cpu_optimizer_service/fake_worker.h plays the worker's part for the optimizer core).
// Checked: the single-job slot (runtime/job_slot.h) as the worker uses it, and the apply
// W <- (1 - lr wd) W + P D Q^T against a float64 reference over the projectors the worker
// fitted, with its refusals (step not written, non-finite D: weights untouched, bit for bit),
// TrainStep's S = P^T G Q against the dense gradient zero mode publishes for the same step, and
// the overlap schedule (deep layers applied in TrainStep, shallow ones before their next
// forward) against the serial schedule, bit for bit.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gpu_worker/worker_core.h"
#include "gtest/gtest.h"
#include "lsp/projector.h"
#include "model/safetensors.h"
#include "offload/arena_tensors.h"
#include "offload/state_file.h"
#include "proto/job_spec.pb.h"
#include "runtime/completion_flags.h"
#include "runtime/shm_arena.h"
#include "spec/job_spec.h"
#include "tests/tiny_llama.h"

namespace lspo::worker {
namespace {

namespace v1 = lspo::v1;
namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A job of `mode` over the tiny random Llama of tests/tiny_llama.h (fp32 weights) trained on
// Moby-Dick in blocks of 16 tokens; lsp d = 4, r = 2, a 2-iteration projector fit on 4 calibration
// examples; weight decay 0.1; the CPU, 1 thread.
v1::JobSpec TinySpec(v1::TrainingMode mode, const std::string& tag) {
  v1::JobSpec spec;
  spec.set_name(tag);
  spec.set_mode(mode);
  spec.set_device(v1::DEVICE_CPU);
  spec.set_weight_dtype(v1::WEIGHT_DTYPE_FP32);
  spec.set_num_threads(1);
  spec.set_seed(5);
  spec.set_steps(2);
  spec.set_micro_batch_size(2);
  spec.set_seq_len(16);
  spec.set_schedule(v1::STEP_SCHEDULE_SERIAL);
  testing_models::SetTinyLlama(&spec);
  spec.mutable_data()->set_format(v1::DATA_FORMAT_TEXT);
  spec.mutable_data()->set_train_path("datasets/moby-dick/moby-dick.txt");
  spec.mutable_data()->set_max_blocks(16);
  spec.mutable_lsp()->set_d(4);
  spec.mutable_lsp()->set_r(2);
  spec.mutable_lsp()->set_fit_iters(2);
  spec.mutable_lsp()->set_calibration_examples(4);
  spec.mutable_optim()->set_lr(1e-2);
  spec.mutable_optim()->set_weight_decay(0.1);
  const fs::path out = fs::path(::testing::TempDir()) / absl::StrCat("worker_core_", tag);
  fs::remove_all(out);
  spec.set_output_dir(out.string());
  spec::ResolveDefaults(&spec);
  return spec;
}

// The dense (rows, d) float64 matrix of a sparse projector: M[i, index[i, k]] += value[i, k].
at::Tensor Dense(const lsp::SparseProjector& p) {
  at::Tensor m = at::zeros({p.rows, p.d}, at::kDouble);
  return m.scatter_add_(1, p.index.to(at::kLong).contiguous(),
                        p.value.to(at::kDouble).contiguous());
}

// Every trained matrix of the worker's checkpoint state in `dir` (SaveState), fp32 (m, n), in
// linear order.
std::vector<at::Tensor> SavedWeights(WorkerCore* worker, const std::string& job_id,
                                     const v1::ArenaLayout& layout, const std::string& dir,
                                     int step) {
  std::vector<at::Tensor> out;
  fs::create_directories(dir);  // The scheduler makes the checkpoint's folder.
  auto saved = worker->SaveState(job_id, dir, step);
  EXPECT_TRUE(saved.ok()) << saved.status();
  auto file = model::SafetensorsFile::Open(dir + "/worker_state.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return out;
  for (const v1::LinearSlot& s : layout.linears()) {
    auto w = offload::ReadStateTensor(*file, "test", s.name(), at::kFloat, {s.m(), s.n()});
    EXPECT_TRUE(w.ok()) << w.status();
    out.push_back(w.ok() ? *w : at::Tensor());
  }
  return out;
}

TEST(WorkerCoreTest, TheSlotHoldsOneJobAndNamesTheOneThatIsNotLoaded) {
  WorkerCore worker;
  const v1::JobSpec spec = TinySpec(v1::MODE_NATIVE, "slot");
  ASSERT_TRUE(worker.LoadJob("a", spec).ok());
  // The same id again: refused, the loaded job kept.
  auto again = worker.LoadJob("a", spec);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("job 'a' already loaded"));
  // A projector fit needs a mode with projectors.
  auto fit = worker.FitProjectors("a", 0);
  EXPECT_EQ(fit.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(fit.status().message(), HasSubstr("FitProjectors needs mode lsp"));
  // Another id: the error names it and the fix.
  auto other = worker.Evaluate("b", 0);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(),
              HasSubstr("job 'b' is not loaded on this worker (LoadJob first)"));
  EXPECT_EQ(worker.AbortStep("b", 1).code(), absl::StatusCode::kFailedPrecondition);
  // A new job replaces a stale one (a restarted scheduler's LoadJob).
  ASSERT_TRUE(worker.LoadJob("b", spec).ok());
  EXPECT_EQ(worker.Evaluate("a", 0).status().code(), absl::StatusCode::kFailedPrecondition);
  // A mode that trains on the worker has no updates to apply.
  v1::ApplyRequest apply;
  apply.add_tasks()->set_index(0);
  auto applied = worker.ApplyUpdates("b", 1, apply);
  EXPECT_EQ(applied.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(applied.status().message(), HasSubstr("trains on the worker"));
  // Unloading another id leaves the job; its own id frees it.
  EXPECT_TRUE(worker.UnloadJob("a").ok());
  EXPECT_TRUE(worker.SaveArtifacts("b", spec.output_dir() + "/artifacts").ok());
  EXPECT_TRUE(worker.UnloadJob("b").ok());
  EXPECT_EQ(worker.SaveArtifacts("b", spec.output_dir() + "/artifacts").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// ApplyUpdates in lsp mode: W1 = (1 - lr wd) W0 + P D Q^T for every matrix, with the P and Q
// the worker fitted and wrote into the arena (docs/method.md, "Math"), against float64.
TEST(WorkerCoreTest, ApplyUpdatesAddsPDQtAsFloat64DoesAndRefusesBadSteps) {
  WorkerCore worker;
  const v1::JobSpec spec = TinySpec(v1::MODE_LSP, "apply");
  auto load = worker.LoadJob("j", spec);
  ASSERT_TRUE(load.ok()) << load.status();
  const v1::ArenaLayout& layout = load->arena();
  ASSERT_EQ(layout.linears_size(), 7);
  // Attached before the fit, which unlinks the arena's name (as the optimizer attaches first).
  auto arena = runtime::ShmArena::Attach(layout.name(), layout.bytes());
  ASSERT_TRUE(arena.ok()) << arena.status();
  ASSERT_TRUE(worker.FitProjectors("j", 0).ok());
  auto flags = offload::ArenaFlags(*arena, layout);
  ASSERT_TRUE(flags.ok()) << flags.status();
  const std::string dir = spec.output_dir();
  const std::vector<at::Tensor> w0 = SavedWeights(&worker, "j", layout, dir + "/s0", 0);
  ASSERT_EQ(w0.size(), 7u);

  // The optimizer's part: a step D of each matrix in its slot, from a fixed seed.
  at::manual_seed(17);
  std::vector<at::Tensor> d(7);
  for (int i = 0; i < 7; ++i) {
    const v1::LinearSlot& s = layout.linears(i);
    d[i] = at::randn({s.d_p(), s.d_q()}, at::kFloat) * 0.1;
    offload::ArenaF32(*arena, s.step()).value().copy_(d[i]);
  }
  v1::ApplyRequest req;
  req.set_lr(0.5);
  for (int i = 0; i < 7; ++i) req.add_tasks()->set_index(i);

  // Not yet published: refused, naming the matrix.
  auto early = worker.ApplyUpdates("j", 1, req);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("has not written step 1"));
  for (int i = 0; i < 7; ++i) flags->PublishStep(i, 1);

  // A non-finite D in the last matrix: kDataLoss and every weight as before, bit for bit.
  offload::ArenaF32(*arena, layout.linears(6).step()).value()[0][0] = std::nanf("");
  auto bad = worker.ApplyUpdates("j", 1, req);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(bad.status().message(), HasSubstr("not finite"));
  const std::vector<at::Tensor> kept = SavedWeights(&worker, "j", layout, dir + "/kept", 0);
  for (int i = 0; i < 7; ++i) EXPECT_TRUE(at::equal(kept[i], w0[i])) << layout.linears(i).name();
  offload::ArenaF32(*arena, layout.linears(6).step()).value().copy_(d[6]);

  auto applied = worker.ApplyUpdates("j", 1, req);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->events_size(), 7);
  const std::vector<at::Tensor> w1 = SavedWeights(&worker, "j", layout, dir + "/s1", 1);
  const double decay = 1.0 - 0.5 * 0.1;
  for (int i = 0; i < 7; ++i) {
    const v1::LinearSlot& s = layout.linears(i);
    auto p = offload::ReadProjector(*arena, s.p_index(), s.p_value(), s.d_p());
    auto q = offload::ReadProjector(*arena, s.q_index(), s.q_value(), s.d_q());
    ASSERT_TRUE(p.ok() && q.ok()) << s.name();
    const at::Tensor want = decay * w0[i].to(at::kDouble) +
                            Dense(*p).matmul(d[i].to(at::kDouble)).matmul(Dense(*q).t());
    const at::Tensor step = want - w0[i].to(at::kDouble);
    ASSERT_GT(step.abs().max().item<double>(), 1e-4) << s.name() << ": the step is not trivial";
    const double err = (w1[i].to(at::kDouble) - want).abs().max().item<double>();
    const double scale = want.abs().max().item<double>();
    // fp32 storage: a few roundings (2^-24 each) of the largest entry.
    EXPECT_LT(err, 1e-6 * scale) << s.name() << ": max |W1 - reference| " << err << " of " << scale;
  }
  EXPECT_TRUE(worker.UnloadJob("j").ok());
}

// TrainStep in lsp mode publishes S = P^T G Q of every matrix without forming G: against
// float64 from the dense gradient G that zero mode publishes for the same step (same weights,
// same batch: the data order derives from the seed), rounded to bf16 there (2^-9 relative per
// entry; 0.3 % measured), so within 1 % of S's largest entry. Both runs' losses agree.
TEST(WorkerCoreTest, TrainStepPublishesPtGQOfTheDenseGradient) {
  v1::StepPlan serial;
  serial.set_overlap(false);
  WorkerCore worker;

  // The dense G of every matrix at step 1 (zero mode's full_grad slots, bf16).
  const v1::JobSpec zero = TinySpec(v1::MODE_ZERO, "zero-g");
  auto zload = worker.LoadJob("z", zero);
  ASSERT_TRUE(zload.ok()) << zload.status();
  auto zarena = runtime::ShmArena::Attach(zload->arena().name(), zload->arena().bytes());
  ASSERT_TRUE(zarena.ok()) << zarena.status();
  auto zstep = worker.TrainStep("z", 1, 1e-2, serial);
  ASSERT_TRUE(zstep.ok()) << zstep.status();
  ASSERT_FALSE(zstep->nonfinite());
  std::vector<at::Tensor> g;
  for (const v1::LinearSlot& s : zload->arena().linears()) {
    g.push_back(offload::ArenaBf16(*zarena, s.full_grad()).value().to(at::kDouble));
  }
  ASSERT_TRUE(worker.UnloadJob("z").ok());

  const v1::JobSpec lsp = TinySpec(v1::MODE_LSP, "lsp-s");
  auto load = worker.LoadJob("l", lsp);
  ASSERT_TRUE(load.ok()) << load.status();
  const v1::ArenaLayout& layout = load->arena();
  auto arena = runtime::ShmArena::Attach(layout.name(), layout.bytes());
  ASSERT_TRUE(arena.ok()) << arena.status();
  auto flags = offload::ArenaFlags(*arena, layout);
  ASSERT_TRUE(flags.ok()) << flags.status();
  ASSERT_TRUE(worker.FitProjectors("l", 0).ok());
  auto step = worker.TrainStep("l", 1, 1e-2, serial);
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_FALSE(step->nonfinite());
  EXPECT_NEAR(step->metrics().loss(), zstep->metrics().loss(), 1e-5 * zstep->metrics().loss());
  ASSERT_EQ(layout.linears_size(), static_cast<int>(g.size()));
  for (int i = 0; i < layout.linears_size(); ++i) {
    const v1::LinearSlot& s = layout.linears(i);
    EXPECT_EQ(flags->grad_seq(i), 1u) << s.name() << ": S of step 1 not published";
    auto p = offload::ReadProjector(*arena, s.p_index(), s.p_value(), s.d_p());
    auto q = offload::ReadProjector(*arena, s.q_index(), s.q_value(), s.d_q());
    ASSERT_TRUE(p.ok() && q.ok()) << s.name();
    const at::Tensor want = Dense(*p).t().matmul(g[i]).matmul(Dense(*q));
    const at::Tensor got = offload::ArenaF32(*arena, s.grad()).value().to(at::kDouble);
    ASSERT_EQ(got.sizes(), want.sizes()) << s.name();
    const double scale = want.abs().max().item<double>();
    ASSERT_GT(scale, 0.0) << s.name() << ": a zero gradient checks nothing";
    EXPECT_LT((got - want).abs().max().item<double>(), 0.01 * scale) << s.name();
  }
  EXPECT_TRUE(worker.UnloadJob("l").ok());
}

// The lsp kernel choice is the job's own (lsp.kernels, carried by its linears and update path):
// loading a job with one choice leaves the process's default (what a call without a choice
// runs: LSPO_CUDA_KERNELS or the built-in default) as it was.
TEST(WorkerCoreTest, AJobsKernelChoiceIsItsOwnNotTheProcesss) {
  const lsp::CudaKernels before = lsp::internal::ResolveCudaKernels(lsp::CudaKernels::kDefault);
  WorkerCore worker;
  for (const v1::CudaKernels k : {v1::CUDA_KERNELS_CUSTOM, v1::CUDA_KERNELS_ATEN}) {
    v1::JobSpec spec = TinySpec(v1::MODE_LSP, "kernels");
    spec.mutable_lsp()->set_kernels(k);
    ASSERT_TRUE(worker.LoadJob(absl::StrCat("k", k), spec).ok());
    EXPECT_EQ(lsp::internal::ResolveCudaKernels(lsp::CudaKernels::kDefault), before);
  }
  EXPECT_TRUE(worker.UnloadJob(absl::StrCat("k", v1::CUDA_KERNELS_ATEN)).ok());
}

// The overlap schedule (docs/architecture.md "Step schedules") against the serial one, over
// two steps of a 2-layer lsp job with the optimizer's steps D fixed in advance: TrainStep with
// split_layer 1 applies layer 1's update before it returns and leaves layer 0's pending until
// layer 0's next forward; the serial schedule applies every update in ApplyUpdates. Both apply
// the same D's with the same kernels in the same order per matrix, so step 2's loss and the
// final weights agree bit for bit; an update applied late (after layer 0's forward) or early
// would change step 2's loss.
TEST(WorkerCoreTest, OverlapScheduleAppliesDeepLayersNowShallowOnesBeforeTheirForward) {
  constexpr int kSteps = 2;
  auto spec_of = [](const std::string& tag) {
    v1::JobSpec spec = TinySpec(v1::MODE_LSP, tag);
    spec.mutable_model()->mutable_random_shape()->set_num_hidden_layers(2);
    return spec;
  };
  constexpr double kLr = 0.5;
  // D of step s, matrix i: drawn once, used by both runs.
  std::vector<std::vector<at::Tensor>> d(kSteps + 1);
  auto write_steps = [&](const runtime::ShmArena& arena, const v1::ArenaLayout& layout,
                         runtime::CompletionFlags flags, uint32_t step, bool wait_grads) {
    for (int i = layout.linears_size() - 1; i >= 0; --i) {
      if (wait_grads) {
        absl::Status got = flags.WaitGrad(i, step, absl::Seconds(60));
        if (!got.ok()) return got;
      }
      offload::ArenaF32(arena, layout.linears(i).step()).value().copy_(d[step][i]);
      flags.PublishStep(i, step);
    }
    return absl::OkStatus();
  };
  struct Run {
    std::vector<double> loss;
    std::vector<v1::TrainStepReply> replies;
    std::vector<at::Tensor> weights;
  };
  auto run = [&](bool overlap) -> Run {
    Run out;
    WorkerCore worker;
    const v1::JobSpec spec = spec_of(overlap ? "overlap" : "serial");
    auto load = worker.LoadJob("j", spec);
    EXPECT_TRUE(load.ok()) << load.status();
    if (!load.ok()) return out;
    const v1::ArenaLayout& layout = load->arena();
    EXPECT_EQ(layout.linears_size(), 14);
    auto arena = runtime::ShmArena::Attach(layout.name(), layout.bytes());
    EXPECT_TRUE(arena.ok()) << arena.status();
    auto flags = offload::ArenaFlags(*arena, layout);
    EXPECT_TRUE(flags.ok()) << flags.status();
    EXPECT_TRUE(worker.FitProjectors("j", 0).ok());
    if (d[1].empty()) {
      at::manual_seed(23);
      for (int s = 1; s <= kSteps; ++s) {
        for (const v1::LinearSlot& slot : layout.linears()) {
          d[s].push_back(at::randn({slot.d_p(), slot.d_q()}, at::kFloat) * 0.05);
        }
      }
    }
    v1::StepPlan plan;
    plan.set_overlap(overlap);
    plan.set_split_layer(1);
    v1::ApplyRequest apply;
    apply.set_lr(kLr);
    for (int i = 0; i < layout.linears_size(); ++i) apply.add_tasks()->set_index(i);
    for (int s = 1; s <= kSteps; ++s) {
      absl::Status optimizer = absl::OkStatus();
      std::thread fake;
      // Overlap: the optimizer's part runs while TrainStep does (its updates of layer 1 are
      // waited for inside TrainStep).
      if (overlap) fake = std::thread([&] { optimizer = write_steps(*arena, layout, *flags, s, true); });
      auto step = worker.TrainStep("j", s, kLr, plan);
      if (fake.joinable()) fake.join();
      EXPECT_TRUE(optimizer.ok()) << optimizer;
      EXPECT_TRUE(step.ok()) << step.status();
      if (!step.ok()) return out;
      EXPECT_FALSE(step->nonfinite());
      out.loss.push_back(step->metrics().loss());
      out.replies.push_back(*step);
      if (!overlap) {
        EXPECT_TRUE(write_steps(*arena, layout, *flags, s, false).ok());
        auto applied = worker.ApplyUpdates("j", s, apply);
        EXPECT_TRUE(applied.ok()) << applied.status();
      }
    }
    // SaveState lands the pending updates first.
    out.weights = SavedWeights(&worker, "j", layout, spec.output_dir() + "/final", kSteps);
    EXPECT_TRUE(worker.UnloadJob("j").ok());
    return out;
  };
  const Run serial = run(false);
  const Run overlapped = run(true);
  ASSERT_EQ(serial.loss.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(overlapped.loss.size(), static_cast<size_t>(kSteps));
  for (int s = 0; s < kSteps; ++s) EXPECT_EQ(overlapped.loss[s], serial.loss[s]) << "step " << s + 1;
  EXPECT_NE(serial.loss[1], serial.loss[0]) << "the updates changed nothing";
  ASSERT_EQ(overlapped.weights.size(), serial.weights.size());
  for (size_t i = 0; i < serial.weights.size(); ++i) {
    EXPECT_TRUE(at::equal(overlapped.weights[i], serial.weights[i])) << "linear " << i;
  }
  // Where the overlapped updates landed: step 1 applied layer 1 only; step 2 applied layer 0's
  // step-1 update before layer 0's forward, and layer 1's step-2 update at its end.
  auto applies = [](const v1::TrainStepReply& r, int64_t layer) {
    std::vector<double> at_times;
    for (const v1::LayerEvent& e : r.events()) {
      if (e.layer() == layer && e.what() == "apply") at_times.push_back(e.start());
    }
    return at_times;
  };
  auto first = [](const v1::TrainStepReply& r, int64_t layer, const std::string& what) {
    for (const v1::LayerEvent& e : r.events()) {
      if (e.layer() == layer && e.what() == what) return e.start();
    }
    return -1.0;
  };
  EXPECT_TRUE(applies(overlapped.replies[0], 0).empty());
  EXPECT_EQ(applies(overlapped.replies[0], 1).size(), 1u);
  ASSERT_EQ(applies(overlapped.replies[1], 0).size(), 1u);
  EXPECT_LE(applies(overlapped.replies[1], 0)[0], first(overlapped.replies[1], 0, "forward"));
  ASSERT_EQ(applies(overlapped.replies[1], 1).size(), 1u);
  EXPECT_GE(applies(overlapped.replies[1], 1)[0], first(overlapped.replies[1], 0, "backward"));
  for (const v1::TrainStepReply& r : serial.replies) {
    EXPECT_TRUE(applies(r, 0).empty() && applies(r, 1).empty()) << "serial: applied in TrainStep";
  }
}

}  // namespace
}  // namespace lspo::worker
