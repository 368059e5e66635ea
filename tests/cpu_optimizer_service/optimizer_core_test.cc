// Unit tests of the optimizer service's core (cpu_optimizer_service/optimizer_core.h) and its
// update rules (update_rule.h) over a tiny random Llama and a fake worker (fake_worker.h):
// the test writes the gradients, projectors and |G|^2 into the arena and publishes the flags
// and verdicts itself, then checks the optimizer's updates, master weights and state against
// float64 references of the formulas in lsp/adam.h, optimizer_core.h and baselines/galore.h.
#include "cpu_optimizer_service/optimizer_core.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "cpu_optimizer_service/update_rule.h"
#include "gtest/gtest.h"
#include "lsp/projector.h"
#include "model/safetensors.h"
#include "absl/strings/str_format.h"
#include "offload/memory_plan.h"
#include "offload/state_file.h"
#include "tests/cpu_optimizer_service/fake_worker.h"
#include "tests/test_files.h"

namespace lspo::optimizer {
namespace {

namespace v1 = lspo::v1;
using optimizer_testing::FakeWorker;
using optimizer_testing::TinySpec;

// The Adam settings of TinySpec as the kernels see them (fp32 hyper-parameters).
const double kBeta1 = static_cast<float>(0.9);
const double kBeta2 = static_cast<float>(0.999);
const double kEps = static_cast<float>(1e-8);
constexpr double kWeightDecay = 0.1;

// Adam in float64 (lsp/adam.h, Kingma & Ba 2015 Alg. 1, eps after the square root).
struct AdamRef {
  explicit AdamRef(int64_t n) : m(n, 0.0), v(n, 0.0) {}
  // One step on g with learning rate lr and eps; returns delta = -lr m_hat / (sqrt(v_hat) + eps).
  std::vector<double> Step(const std::vector<double>& g, double lr, double eps) {
    ++t;
    const double bc1 = 1 - std::pow(kBeta1, t), bc2 = 1 - std::pow(kBeta2, t);
    std::vector<double> delta(g.size());
    for (size_t k = 0; k < g.size(); ++k) {
      m[k] = kBeta1 * m[k] + (1 - kBeta1) * g[k];
      v[k] = kBeta2 * v[k] + (1 - kBeta2) * g[k] * g[k];
      delta[k] = -lr * (m[k] / bc1) / (std::sqrt(v[k] / bc2) + eps);
    }
    return delta;
  }
  std::vector<double> m, v;
  int64_t t = 0;
};

std::vector<double> ToDouble(const at::Tensor& t) {
  at::Tensor c = t.to(at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

at::Tensor FromDouble(const std::vector<double>& x, at::IntArrayRef shape) {
  return at::tensor(x, at::kDouble).reshape(shape);
}

double Norm(const std::vector<double>& x) {
  double s = 0;
  for (double e : x) s += e * e;
  return std::sqrt(s);
}

// Expects |actual - ref| <= atol + rtol |ref| element-wise, reporting the worst element.
void ExpectClose(const at::Tensor& actual, const at::Tensor& ref, double atol, double rtol,
                 const std::string& what) {
  ASSERT_EQ(actual.numel(), ref.numel()) << what;
  const std::vector<double> a = ToDouble(actual), r = ToDouble(ref);
  double worst = 0;
  int64_t at_k = -1;
  for (size_t k = 0; k < a.size(); ++k) {
    const double excess = std::abs(a[k] - r[k]) - (atol + rtol * std::abs(r[k]));
    if (excess > worst) {
      worst = excess;
      at_k = static_cast<int64_t>(k);
    }
  }
  EXPECT_EQ(at_k, -1) << what << ": element " << at_k << " is " << a[at_k] << ", expected "
                      << r[at_k];
}

at::Tensor Random(at::IntArrayRef shape, uint64_t seed, double scale) {
  at::manual_seed(seed);
  return at::randn(shape, at::kFloat) * scale;
}

v1::UpdateRequest Request(const std::string& job, int step, double lr,
                          const std::vector<int>& tasks, bool overlap) {
  v1::UpdateRequest req;
  req.set_job_id(job);
  req.set_step(step);
  req.set_lr(lr);
  req.set_wait_for_grads(overlap);
  req.set_wait_timeout_seconds(30);
  for (int i : tasks) req.add_tasks()->set_index(i);
  return req;
}

std::string TempDir(const std::string& tag) {
  const std::string dir = ::testing::TempDir() + "/optimizer_core_test_" + tag;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// The optimizer's checkpoint of `job` (SaveState), as bytes.
std::string StateBytes(OptimizerCore& core, const std::string& job, const std::string& tag) {
  const std::string dir = TempDir(tag);
  auto saved = core.SaveState(job, dir, 0);
  EXPECT_TRUE(saved.ok()) << saved.status();
  return tests::ReadAll(dir + "/optimizer_state.safetensors");
}

// Tensor `name` of the checkpoint in `dir` (dtype and shape checked).
at::Tensor StateTensor(const std::string& dir, const std::string& name, at::ScalarType dtype,
                       at::IntArrayRef shape) {
  auto file = model::SafetensorsFile::Open(dir + "/optimizer_state.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return at::Tensor();
  auto t = offload::ReadStateTensor(*file, "state", name, dtype, shape);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : at::zeros(shape, dtype);
}

// Matrix i's master weight as ExportLayerWeights writes it into the arena's staging region
// (layer 0: the matrices of the layer back to back).
at::Tensor ExportedMaster(OptimizerCore& core, const std::string& job, FakeWorker& w, int i) {
  auto exported = core.ExportLayerWeights(job, 0);
  EXPECT_TRUE(exported.ok()) << exported.status();
  int64_t offset = 0;
  for (int k = 0; k < i; ++k) offset += w.slot(k).m() * w.slot(k).n();
  const auto& slot = w.slot(i);
  return w.F32(w.layout().staging())
      .narrow(0, offset, slot.m() * slot.n())
      .view({slot.m(), slot.n()});
}

// lsp mode, two serial steps of one matrix with weight decay: D in the step slot is Adam's
// step on S in the subspace, the master weight (ExportLayerWeights) is the decayed W0 plus
// P (decayed sum of D) Q^T, and the checkpoint holds the moments, the step, the scale and sum.
TEST(OptimizerCoreTest, AnLspUpdateIsAdamInTheSubspace) {
  v1::JobSpec spec = TinySpec(v1::MODE_LSP);
  auto worker = FakeWorker::Create(&spec, "opt-lsp");
  ASSERT_TRUE(worker.ok()) << worker.status();
  FakeWorker& w = **worker;
  OptimizerCore core;
  auto load = core.LoadJob("job-lsp", spec, w.layout());
  ASSERT_TRUE(load.ok()) << load.status();
  const int i = 4;  // (24, 16)
  const auto& slot = w.slot(i);
  ASSERT_EQ(slot.d_p(), 4);
  ASSERT_EQ(slot.d_q(), 4);
  auto p = lsp::SparseProjector::Random(slot.m(), slot.d_p(), 2, 1);
  auto q = lsp::SparseProjector::Random(slot.n(), slot.d_q(), 2, 2);
  ASSERT_TRUE(p.ok() && q.ok());
  ASSERT_TRUE(w.WriteProjectors(i, *p, *q).ok());
  auto before_projectors = core.Update(Request("job-lsp", 1, 0.01, {i}, false));
  EXPECT_EQ(before_projectors.status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(core.SetProjectors("job-lsp", {i}).ok());
  const std::vector<int64_t> dd = {slot.d_p(), slot.d_q()};
  AdamRef ref(slot.d_p() * slot.d_q());
  std::vector<double> sum(ref.m.size(), 0.0);
  double scale = 1;
  for (int step = 1; step <= 2; ++step) {
    const double lr = 0.01 * step;
    const at::Tensor s = Random(dd, 100 + step, 0.5);
    w.PublishGradient(i, s, step);
    auto reply = core.Update(Request("job-lsp", step, lr, {i}, false));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_FALSE(reply->aborted());
    EXPECT_EQ(w.flags().step_seq(i), static_cast<uint32_t>(step));
    EXPECT_NEAR(reply->grad_norm(), Norm(ToDouble(s)), 1e-9);
    EXPECT_EQ(reply->clip_coefficient(), 1.0f);
    const std::vector<double> d = ref.Step(ToDouble(s), static_cast<float>(lr), kEps);
    ExpectClose(w.F32(slot.step()), FromDouble(d, dd), 1e-10, 1e-5,
                "D at step " + std::to_string(step));
    const double decay = 1 - lr * kWeightDecay;
    scale *= decay;
    for (size_t k = 0; k < sum.size(); ++k) sum[k] = sum[k] * decay + d[k];
  }
  const at::Tensor pd = p->Dense().to(at::kDouble), qd = q->Dense().to(at::kDouble);
  const at::Tensor master =
      w.W0(i).to(at::kDouble) * scale + pd.matmul(FromDouble(sum, dd)).matmul(qd.t());
  ExpectClose(ExportedMaster(core, "job-lsp", w, i), master, 1e-6, 1e-5, "master weight");
  const std::string dir = TempDir("lsp-state");
  ASSERT_TRUE(core.SaveState("job-lsp", dir, 2).ok());
  const std::string name = slot.name();
  ExpectClose(StateTensor(dir, name + ".adam_m", at::kFloat, dd), FromDouble(ref.m, dd), 1e-10,
              1e-5, "adam_m");
  ExpectClose(StateTensor(dir, name + ".adam_v", at::kFloat, dd), FromDouble(ref.v, dd), 1e-12,
              1e-5, "adam_v");
  ExpectClose(StateTensor(dir, name + ".sum_d", at::kFloat, dd), FromDouble(sum, dd), 1e-9, 1e-5,
              "sum_d");
  EXPECT_EQ(StateTensor(dir, name + ".adam_step", at::kLong, {}).item<int64_t>(), 2);
  EXPECT_NEAR(StateTensor(dir, name + ".master_scale", at::kDouble, {}).item<double>(), scale,
              1e-15);
  // Every other matrix is untouched: its Adam step is 0.
  EXPECT_EQ(StateTensor(dir, w.slot(0).name() + ".adam_step", at::kLong, {}).item<int64_t>(), 0);
}

// zero mode, two serial steps of one matrix: the fp32 master is AdamW on the full matrix from
// the bf16 gradient (decoupled decay lr wd), the param slot is that master rounded to bf16.
TEST(OptimizerCoreTest, AZeroUpdateIsAdamWOnTheFullMatrix) {
  v1::JobSpec spec = TinySpec(v1::MODE_ZERO);
  auto worker = FakeWorker::Create(&spec, "opt-zero");
  ASSERT_TRUE(worker.ok()) << worker.status();
  FakeWorker& w = **worker;
  OptimizerCore core;
  ASSERT_TRUE(core.LoadJob("job-zero", spec, w.layout()).ok());
  const int i = 6;  // (16, 24)
  const auto& slot = w.slot(i);
  const std::vector<int64_t> mn = {slot.m(), slot.n()};
  AdamRef ref(slot.m() * slot.n());
  std::vector<double> master = ToDouble(w.W0(i));
  for (int step = 1; step <= 2; ++step) {
    const double lr = 0.01 * step;
    const at::Tensor g = Random(mn, 200 + step, 0.3);
    w.PublishGradient(i, g, step);
    // What the optimizer reads: the bf16 gradient.
    const std::vector<double> gq = ToDouble(g.to(at::kBFloat16));
    auto reply = core.Update(Request("job-zero", step, lr, {i}, false));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_FALSE(reply->aborted());
    EXPECT_EQ(w.flags().step_seq(i), static_cast<uint32_t>(step));
    EXPECT_NEAR(reply->grad_norm(), Norm(gq), 1e-9);
    const float lr32 = static_cast<float>(lr);
    const std::vector<double> delta = ref.Step(gq, lr32, kEps);
    const double decay = 1 - static_cast<double>(lr32) * static_cast<float>(kWeightDecay);
    for (size_t k = 0; k < master.size(); ++k) master[k] = master[k] * decay + delta[k];
  }
  const std::string dir = TempDir("zero-state");
  ASSERT_TRUE(core.SaveState("job-zero", dir, 2).ok());
  const std::string name = slot.name();
  const at::Tensor saved_master = StateTensor(dir, name + ".master", at::kFloat, mn);
  ExpectClose(saved_master, FromDouble(master, mn), 1e-6, 1e-5, "master");
  ExpectClose(StateTensor(dir, name + ".adam_m", at::kFloat, mn), FromDouble(ref.m, mn), 1e-10,
              1e-5, "adam_m");
  ExpectClose(StateTensor(dir, name + ".adam_v", at::kFloat, mn), FromDouble(ref.v, mn), 1e-12,
              1e-5, "adam_v");
  EXPECT_EQ(StateTensor(dir, name + ".adam_step", at::kLong, {}).item<int64_t>(), 2);
  // The parameters the worker copies: the master rounded to bf16 (nearest even).
  EXPECT_TRUE(at::equal(w.Bf16(slot.param()), saved_master.to(at::kBFloat16)));
  // No master-weight export in zero mode.
  EXPECT_EQ(core.ExportLayerWeights("job-zero", 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Issue 43 under the overlap schedule, per mode: the optimizer updates two matrices as their
// gradients arrive, then the worker refuses the step (Abort): the reply is aborted and the
// state (master, moments, Adam steps; lsp: scale, sum, projectors) is bitwise that of before.
// The next step, with the verdict, is kept.
class RefusedVerdictTest : public ::testing::TestWithParam<v1::TrainingMode> {};

TEST_P(RefusedVerdictTest, LeavesTheStateBitwiseUnchanged) {
  v1::JobSpec spec = TinySpec(GetParam());
  auto worker = FakeWorker::Create(&spec, "opt-verdict");
  ASSERT_TRUE(worker.ok()) << worker.status();
  FakeWorker& w = **worker;
  OptimizerCore core;
  ASSERT_TRUE(core.LoadJob("job-v", spec, w.layout()).ok());
  const std::vector<int> tasks = {6, 5};  // The backward's order: the deepest matrix first.
  if (GetParam() == v1::MODE_LSP) {
    for (int i : tasks) {
      const auto& slot = w.slot(i);
      auto p = lsp::SparseProjector::Random(slot.m(), slot.d_p(), 2, 10 + i);
      auto q = lsp::SparseProjector::Random(slot.n(), slot.d_q(), 2, 20 + i);
      ASSERT_TRUE(p.ok() && q.ok());
      ASSERT_TRUE(w.WriteProjectors(i, *p, *q).ok());
    }
    ASSERT_TRUE(core.SetProjectors("job-v", tasks).ok());
  }
  auto publish = [&](int step) {
    for (int i : tasks) {
      const at::Tensor g = GetParam() == v1::MODE_ZERO
                               ? Random({w.slot(i).m(), w.slot(i).n()}, 300 + step + i, 0.3)
                               : Random({w.slot(i).d_p(), w.slot(i).d_q()}, 300 + step + i, 0.5);
      w.PublishGradient(i, g, step);
    }
  };
  // Step 1, serial and kept: moments, steps and a decayed master to restore.
  publish(1);
  auto first = core.Update(Request("job-v", 1, 0.01, tasks, false));
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string before = StateBytes(core, "job-v", "verdict-before");
  ASSERT_FALSE(before.empty());
  // Step 2, overlapped: both matrices are updated (their step flags published), then refused.
  publish(2);
  absl::StatusOr<v1::UpdateReply> reply;
  std::thread update([&] { reply = core.Update(Request("job-v", 2, 0.02, tasks, true)); });
  const absl::Status updated = w.flags().WaitStep(tasks.back(), 2, absl::Seconds(30));
  w.flags().Abort(2);
  update.join();
  ASSERT_TRUE(updated.ok()) << updated;
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_TRUE(reply->aborted());
  EXPECT_TRUE(StateBytes(core, "job-v", "verdict-after") == before)
      << "a refused step changed the optimizer's state";
  // Step 3 with the worker's verdict: kept.
  publish(3);
  w.flags().PublishVerdict(3);
  auto kept = core.Update(Request("job-v", 3, 0.03, tasks, true));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_FALSE(kept->aborted());
  const std::string dir = TempDir("verdict-kept");
  ASSERT_TRUE(core.SaveState("job-v", dir, 0).ok());
  for (int i : tasks) {
    EXPECT_EQ(StateTensor(dir, w.slot(i).name() + ".adam_step", at::kLong, {}).item<int64_t>(), 2)
        << w.slot(i).name();
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, RefusedVerdictTest, ::testing::Values(v1::MODE_LSP, v1::MODE_ZERO),
                         [](const ::testing::TestParamInfo<v1::TrainingMode>& info) {
                           return v1::TrainingMode_Name(info.param);
                         });

// GaLore-Offload's projectors: the identity on the long side, a dense (rows, rank) matrix on
// the short one (offload/arena_layout.h BuildGaloreArenaLayout).
std::pair<lsp::SparseProjector, lsp::SparseProjector> GaloreProjectors(const v1::LinearSlot& slot,
                                                                       uint64_t seed) {
  const bool right = slot.d_p() == slot.m();  // m >= n: S = G B^T, P the identity.
  auto dense = lsp::SparseProjector::FromDense(
      Random({right ? slot.n() : slot.m(), right ? slot.d_q() : slot.d_p()}, seed, 0.3));
  auto identity = lsp::SparseProjector::Identity(right ? slot.m() : slot.n());
  EXPECT_TRUE(dense.ok() && identity.ok());
  return right ? std::make_pair(*identity, *dense) : std::make_pair(*dense, *identity);
}

// GaLore-Offload, two serial steps of a right- and a left-projected matrix, the first's
// projector refreshed at step 2: D is galore-torch's Adam step (lr' = lr scale (1 - lr wd),
// eps' = eps / sqrt(1 - beta2^t); optimizer_core.cc GaloreHyper) with the moments kept across
// the refresh; the norm is that of the published |G|^2; the master folds the old subspace's
// steps into its base at the refresh.
TEST(OptimizerCoreTest, AGaloreOffloadUpdateIsGaloresAdamAndFoldsOnARefresh) {
  v1::JobSpec spec = TinySpec(v1::MODE_GALORE);
  auto worker = FakeWorker::Create(&spec, "opt-galore");
  ASSERT_TRUE(worker.ok()) << worker.status();
  FakeWorker& w = **worker;
  OptimizerCore core;
  auto load = core.LoadJob("job-g", spec, w.layout());
  ASSERT_TRUE(load.ok()) << load.status();
  EXPECT_EQ(core.SetProjectors("job-g", {0}).code(), absl::StatusCode::kFailedPrecondition);
  const std::vector<int> tasks = {0, 6};  // (16, 16): right; (16, 24): left.
  ASSERT_EQ(w.slot(0).d_p(), w.slot(0).m());
  ASSERT_EQ(w.slot(6).d_q(), w.slot(6).n());
  std::vector<AdamRef> refs;
  std::vector<at::Tensor> master;  // float64 reference of each task's master
  std::vector<std::pair<lsp::SparseProjector, lsp::SparseProjector>> held;
  for (int i : tasks) {
    refs.emplace_back(w.slot(i).d_p() * w.slot(i).d_q());
    master.push_back(w.W0(i).to(at::kDouble));
    held.push_back(GaloreProjectors(w.slot(i), 40 + i));
  }
  std::vector<at::Tensor> sum(tasks.size());  // Σ decayed D of the current subspace
  for (int step = 1; step <= 2; ++step) {
    const double lr = 0.01 * step;
    const double decay = 1 - lr * kWeightDecay;
    double norm2 = 0;
    for (size_t k = 0; k < tasks.size(); ++k) {
      const int i = tasks[k];
      const auto& slot = w.slot(i);
      if (step == 2 && k == 0) {  // A refresh: fold the old subspace, a new projector.
        master[k] += held[k]
                         .first.Dense()
                         .to(at::kDouble)
                         .matmul(sum[k])
                         .matmul(held[k].second.Dense().to(at::kDouble).t());
        sum[k] = at::zeros_like(sum[k]);
        held[k] = GaloreProjectors(slot, 50 + i);
      }
      if (step == 1 || k == 0)
        ASSERT_TRUE(w.WriteProjectors(i, held[k].first, held[k].second).ok());
      const float g_sq = 2.0f + static_cast<float>(i);  // |G|_F^2 the worker computed
      w.F32(slot.grad_sq()).fill_(g_sq);
      norm2 += g_sq;
      w.PublishGradient(i, Random({slot.d_p(), slot.d_q()}, 500 + 10 * step + i, 0.5), step);
    }
    auto reply = core.Update(Request("job-g", step, lr, tasks, false));
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_NEAR(reply->grad_norm(), std::sqrt(norm2), 1e-9);
    for (size_t k = 0; k < tasks.size(); ++k) {
      const auto& slot = w.slot(tasks[k]);
      const std::vector<int64_t> dd = {slot.d_p(), slot.d_q()};
      const double bc2 = 1 - std::pow(kBeta2, refs[k].t + 1);
      const double lr_g = static_cast<float>(lr * 0.5 * (1 - lr * kWeightDecay));
      const double eps_g = static_cast<float>(kEps / std::sqrt(bc2));
      const at::Tensor s = w.F32(slot.grad()).view(dd);
      const at::Tensor d = FromDouble(refs[k].Step(ToDouble(s), lr_g, eps_g), dd);
      ExpectClose(w.F32(slot.step()).view(dd), d, 1e-10, 1e-5,
                  slot.name() + " D at step " + std::to_string(step));
      master[k] *= decay;
      sum[k] = sum[k].defined() ? sum[k] * decay + d : d;
    }
  }
  for (size_t k = 0; k < tasks.size(); ++k) {
    const at::Tensor expected = master[k] + held[k]
                                                .first.Dense()
                                                .to(at::kDouble)
                                                .matmul(sum[k])
                                                .matmul(held[k].second.Dense().to(at::kDouble).t());
    ExpectClose(ExportedMaster(core, "job-g", w, tasks[k]), expected, 1e-6, 1e-5,
                w.slot(tasks[k]).name() + " master weight");
  }
}

// The registry: every offloaded mode has its rule, named as its checkpoints name it; a mode
// without one is refused at LoadJob, naming it.
TEST(UpdateRuleTest, TheRegistryMapsEachOffloadedModeToItsRule) {
  const std::pair<v1::TrainingMode, std::string> modes[] = {
      {v1::MODE_LSP, "lsp"},
      {v1::MODE_ZERO, "zero"},
      {v1::MODE_GALORE_OFFLOAD, "galore"},
  };
  for (const auto& [mode, name] : modes) {
    auto rule = MakeUpdateRule(mode);
    ASSERT_TRUE(rule.ok()) << rule.status();
    EXPECT_EQ((*rule)->name(), name) << v1::TrainingMode_Name(mode);
  }
  // GaLore without offload runs on the worker; its layouts carry MODE_GALORE_OFFLOAD when they
  // offload (offload/training_mode.h ModeOf), so MODE_GALORE has no rule either.
  for (v1::TrainingMode mode :
       {v1::MODE_NATIVE, v1::MODE_LORA, v1::MODE_GALORE, v1::MODE_UNSPECIFIED}) {
    auto rule = MakeUpdateRule(mode);
    EXPECT_EQ(rule.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(rule.status().message().find(v1::TrainingMode_Name(mode)), std::string::npos)
        << rule.status();
  }
  // An arena laid out for a mode without a rule (the spec saying the same) is refused.
  v1::JobSpec spec = TinySpec(v1::MODE_ZERO);
  auto worker = FakeWorker::Create(&spec, "opt-native");
  ASSERT_TRUE(worker.ok()) << worker.status();
  v1::ArenaLayout layout = (*worker)->layout();
  layout.set_mode(v1::MODE_NATIVE);
  spec.set_mode(v1::MODE_NATIVE);
  OptimizerCore core;
  auto load = core.LoadJob("job-n", spec, layout);
  EXPECT_EQ(load.status().code(), absl::StatusCode::kInvalidArgument) << load.status();
  EXPECT_NE(load.status().message().find("MODE_NATIVE"), std::string::npos) << load.status();
}

// Issue 42: a host without the memory for the fp32 master weights and the optimizer state is
// refused before a weight is read (the folder has no weights at all), naming the numbers.
TEST(OptimizerCoreTest, AHostWithoutMemoryForTheMasterWeightsIsRefusedBeforeLoading) {
  const int64_t host = offload::PhysicalHostMemoryBytes();
  if (host <= 0) GTEST_SKIP() << "no /proc/meminfo";
  v1::JobSpec spec = TinySpec(v1::MODE_LSP);
  auto worker = FakeWorker::Create(&spec, "opt-host");
  ASSERT_TRUE(worker.ok()) << worker.status();
  // Llama-3.1-405B's shape: 1.6 TB of fp32 master weights alone.
  const std::string dir = testing::TempDir() + "/lspo-opt-host-405b";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json")
      << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": 16384, "intermediate_size": 53248, "num_hidden_layers": 126,
             "num_attention_heads": 128, "num_key_value_heads": 8, "vocab_size": 128256,
             "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-05,
             "rope_theta": 500000.0, "tie_word_embeddings": false})";
  v1::JobSpec big = spec;
  big.set_seq_len(512);  // what the scheduler's defaults give a job (the planner needs it)
  big.mutable_model()->set_format(v1::MODEL_FORMAT_HF);
  big.mutable_model()->set_path(dir);
  OptimizerCore core;
  auto load = core.LoadJob("job-405b", big, (*worker)->layout());
  ASSERT_EQ(load.status().code(), absl::StatusCode::kResourceExhausted) << load.status();
  const std::string m(load.status().message());
  EXPECT_NE(m.find("GiB of host memory for this lsp job"), std::string::npos) << m;
  EXPECT_NE(m.find("fp32"), std::string::npos) << m;  // the master weights' row, named
  EXPECT_NE(m.find(absl::StrFormat("this host has %.2f GiB", host / double(1LL << 30))),
            std::string::npos)
      << m;
  // The same spec on its own small model loads.
  EXPECT_TRUE(core.LoadJob("job-small", spec, (*worker)->layout()).ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lspo::optimizer
