// Checkpoints and exact resume (issue 5): a job stopped at step k and resumed from its
// checkpoint gives bitwise the same loss at every later step and the same final weights as an
// uninterrupted run (lsp with a projector refit after the resume point, zero, native);
// checkpoints are checksummed, pruned to keep_checkpoints, and a corrupted, mismatched or
// unwritable checkpoint fails clearly without losing the previous one; a restarted scheduler
// resumes the job it was running (job store under state_dir) and runs the queued ones.
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "client/embedded.h"
#include "tests/integration/start_embedded.h"
#include "offload/arena_tensors.h"
#include "offload/state_file.h"
#include "offload/job_assets.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "scheduler/checkpoint.h"
#include "spec/job_spec.h"
#include "scheduler/job_store.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  v1::JobStatus last;
  std::map<int, double> loss;  // step -> loss, every step reported
};

RunResult RunToEnd(v1::Scheduler::Stub* stub, const v1::JobSpec& spec) {
  RunResult out;
  testing_jobs::WatchResult w = testing_jobs::SubmitAndWatch(stub, spec);
  for (const auto& s : w.updates) {
    if (s.has_last_step()) out.loss[s.last_step().step()] = s.last_step().loss();
  }
  out.last = w.last;
  return out;
}

v1::JobSpec Spec(const std::string& out, v1::TrainingMode mode, int steps) {
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(out, mode, steps);
  spec.mutable_lsp()->set_check_freq(4);  // A refit at step 4: after the resume point (3).
  spec.set_grad_accum(2);  // Offload + gradient accumulation (docs/known-failures.md #7).
  spec.set_skip_initial_eval(true);
  spec.mutable_data()->set_max_eval_examples(2);
  return spec;
}

std::vector<uint8_t> Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void ExpectExactResume(v1::TrainingMode mode,
                       const std::function<void(v1::JobSpec*)>& adjust = nullptr) {
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string a_dir = testing_jobs::TempDir("resume-a");
  v1::JobSpec a = Spec(a_dir, mode, 6);
  if (adjust) adjust(&a);
  a.set_checkpoint_every(3);
  RunResult full = RunToEnd(stub.get(), a);
  ASSERT_EQ(full.last.state(), v1::SUCCEEDED) << full.last.error();
  ASSERT_EQ(full.loss.size(), 6u);
  EXPECT_EQ(full.last.last_checkpoint_step(), 6);
  const std::string ckpt = a_dir + "/checkpoints/step-00000003";
  ASSERT_TRUE(fs::exists(ckpt + "/checksums.sha256"));

  const std::string b_dir = testing_jobs::TempDir("resume-b");
  v1::JobSpec b = Spec(b_dir, mode, 6);
  if (adjust) adjust(&b);
  b.set_resume_from(ckpt);
  RunResult resumed = RunToEnd(stub.get(), b);
  ASSERT_EQ(resumed.last.state(), v1::SUCCEEDED) << resumed.last.error();
  EXPECT_EQ(resumed.last.resumed_from_step(), 3);
  ASSERT_EQ(resumed.loss.size(), 3u);
  for (int step = 4; step <= 6; ++step) {
    ASSERT_TRUE(resumed.loss.count(step)) << step;
    // Bitwise: the same doubles, not just close.
    EXPECT_EQ(resumed.loss[step], full.loss[step]) << "step " << step;
  }
  // The final weights are bitwise identical too.
  const std::vector<uint8_t> wa = Bytes(a_dir + "/model.safetensors");
  EXPECT_GT(wa.size(), 1000u);
  EXPECT_TRUE(wa == Bytes(b_dir + "/model.safetensors")) << "final model.safetensors differ";
  // The evaluation is the same (both after the same 6 steps).
  ASSERT_GT(full.last.evals_size(), 0);
  ASSERT_GT(resumed.last.evals_size(), 0);
  EXPECT_EQ(full.last.evals(full.last.evals_size() - 1).loss(),
            resumed.last.evals(resumed.last.evals_size() - 1).loss());
}

TEST(ResumeTest, LspResumedAtStep3MatchesTheUninterruptedRunBitwise) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectExactResume(v1::MODE_LSP);
}

// The same exact resume with one-sided subspaces (d = 48 on the tiny model: k/v_proj 32 x 64
// get P = I and S (32, 48)) and a refit after the resume point; the optimizer state in the
// checkpoint has the per-matrix shapes. With weight decay: the masters' decay scales
// (.master_scale) are saved and restored, and folded into the base at the refit (step 4) and
// into the refreshed worker weights as in the uninterrupted run.
TEST(ResumeTest, LspOneSidedResumedAtStep3MatchesTheUninterruptedRunBitwise) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectExactResume(v1::MODE_LSP, [](v1::JobSpec* s) {
    s->mutable_lsp()->set_d(48);
    s->mutable_lsp()->set_narrow(v1::NARROW_RULE_ONE_SIDED);
    s->mutable_optim()->set_weight_decay(0.1);
  });
}

// bf16 worker weights with the compensated apply (lsp.apply_rounding default): the residuals
// are part of the worker state, so the resumed run is bitwise the uninterrupted one.
TEST(ResumeTest, LspBf16CompensatedResumedAtStep3MatchesTheUninterruptedRunBitwise) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectExactResume(v1::MODE_LSP, [](v1::JobSpec* s) {
    s->set_weight_dtype(v1::WEIGHT_DTYPE_BF16);
    s->mutable_lsp()->set_apply_rounding(v1::APPLY_ROUNDING_COMPENSATED);
    s->mutable_optim()->set_lr(1e-4);
  });
}

// bf16 worker weights with stochastic rounding and weight decay: the rounding noise is a hash
// of (seed, step, matrix, element), so the resumed run draws the noise of the uninterrupted one
// and is bitwise the same.
TEST(ResumeTest, LspBf16StochasticResumedAtStep3MatchesTheUninterruptedRunBitwise) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectExactResume(v1::MODE_LSP, [](v1::JobSpec* s) {
    s->set_weight_dtype(v1::WEIGHT_DTYPE_BF16);
    s->mutable_lsp()->set_apply_rounding(v1::APPLY_ROUNDING_STOCHASTIC);
    s->mutable_optim()->set_lr(1e-4);
    s->mutable_optim()->set_weight_decay(0.1);
  });
}

// The rolling refresh (lsp.refresh_every) re-rounds layers from the master after their steps
// (compensated rounding: and resets their residuals); which layers after which step depends on
// the step alone, so the resumed run refreshes as the uninterrupted one and is bitwise the same.
TEST(ResumeTest, LspBf16RollingRefreshResumedAtStep3MatchesTheUninterruptedRunBitwise) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  for (auto rounding : {v1::APPLY_ROUNDING_STOCHASTIC, v1::APPLY_ROUNDING_COMPENSATED}) {
    SCOPED_TRACE(v1::ApplyRounding_Name(rounding));
    ExpectExactResume(v1::MODE_LSP, [rounding](v1::JobSpec* s) {
      s->set_weight_dtype(v1::WEIGHT_DTYPE_BF16);
      s->mutable_lsp()->set_apply_rounding(rounding);
      s->mutable_lsp()->set_refresh_every(2);
      s->mutable_optim()->set_lr(1e-4);
    });
  }
}

// A refit moves the subspace Adam moments into the new subspace (paper Alg. 1):
// M' = (P'^T P) M (Q^T Q'), V' = (P'^T P)^2 V (Q^T Q')^2. Two runs share their first two
// steps; run B refits at step 2 (before its checkpoint), run A does not. B's moments at step 2
// equal the transfer of A's moments from A's projectors to B's new ones (float64 reference),
// for square (d = 16) and one-sided (d = 48) subspaces.
void ExpectRefitTransfersMoments(int d) {
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const auto spec = [&](const std::string& tag, int check_freq) {
    v1::JobSpec s = Spec(testing_jobs::TempDir(tag), v1::MODE_LSP, 3);
    s.mutable_lsp()->set_d(d);
    s.mutable_lsp()->set_check_freq(check_freq);
    s.mutable_lsp()->set_alpha(1e-3);  // the check at step 2 refits every matrix
    s.set_checkpoint_every(2);
    return s;
  };
  const v1::JobSpec a = spec("refit-a", 0), b = spec("refit-b", 2);
  RunResult ra = RunToEnd(stub.get(), a), rb = RunToEnd(stub.get(), b);
  ASSERT_EQ(ra.last.state(), v1::SUCCEEDED) << ra.last.error();
  ASSERT_EQ(rb.last.state(), v1::SUCCEEDED) << rb.last.error();
  ASSERT_EQ(ra.loss.at(2), rb.loss.at(2));  // the same first two steps
  const std::string ck = "/checkpoints/step-00000002/optimizer_state.safetensors";
  auto fa = model::SafetensorsFile::Open(a.output_dir() + ck);
  auto fb = model::SafetensorsFile::Open(b.output_dir() + ck);
  ASSERT_TRUE(fa.ok() && fb.ok()) << fa.status() << fb.status();
  int checked = 0;
  for (const std::string& base : {std::string("model.layers.0.self_attn.q_proj.weight"),
                                  std::string("model.layers.1.self_attn.k_proj.weight"),
                                  std::string("model.layers.1.mlp.down_proj.weight")}) {
    const int64_t m = base.find("k_proj") != std::string::npos ? 32
                      : base.find("down") != std::string::npos ? 64
                                                               : 64;
    const int64_t n = base.find("down") != std::string::npos ? 128 : 64;
    const int64_t dp = m <= d ? m : d, dq = n <= d ? n : d, rp = m <= d ? 1 : 4,
                  rq = n <= d ? 1 : 4;
    auto pa = offload::ReadStateProjector(*fa, "a", base + ".p", m, dp, rp);
    auto qa = offload::ReadStateProjector(*fa, "a", base + ".q", n, dq, rq);
    auto pb = offload::ReadStateProjector(*fb, "b", base + ".p", m, dp, rp);
    auto qb = offload::ReadStateProjector(*fb, "b", base + ".q", n, dq, rq);
    ASSERT_TRUE(pa.ok() && qa.ok() && pb.ok() && qb.ok()) << base << " " << pa.status();
    EXPECT_EQ(pa->identity, m <= d) << base;
    EXPECT_FALSE(at::equal(qa->value, qb->value)) << base << ": no refit happened";
    auto ma = offload::ReadStateTensor(*fa, "a", base + ".adam_m", at::kFloat, {dp, dq});
    auto va = offload::ReadStateTensor(*fa, "a", base + ".adam_v", at::kFloat, {dp, dq});
    auto mb = offload::ReadStateTensor(*fb, "b", base + ".adam_m", at::kFloat, {dp, dq});
    auto vb = offload::ReadStateTensor(*fb, "b", base + ".adam_v", at::kFloat, {dp, dq});
    ASSERT_TRUE(ma.ok() && va.ok() && mb.ok() && vb.ok()) << base << " " << ma.status();
    const at::Tensor cp = pb->Dense().to(at::kDouble).t().mm(pa->Dense().to(at::kDouble));
    const at::Tensor cq = qa->Dense().to(at::kDouble).t().mm(qb->Dense().to(at::kDouble));
    const at::Tensor m_ref = cp.mm(ma->to(at::kDouble)).mm(cq);
    const at::Tensor v_ref = cp.pow(2).mm(va->to(at::kDouble)).mm(cq.pow(2));
    const auto rel = [](const at::Tensor& x, const at::Tensor& ref) {
      return (x.to(at::kDouble) - ref).norm().item<double>() / ref.norm().item<double>();
    };
    EXPECT_LT(rel(*mb, m_ref), 1e-4) << base;
    EXPECT_LT(rel(*vb, v_ref), 1e-4) << base;
    // Control: the moments did move (an untransferred state would fail above).
    EXPECT_GT(rel(*ma, m_ref), 1e-2) << base;
    ++checked;
  }
  EXPECT_EQ(checked, 3);
}

TEST(ResumeTest, RefitCarriesTheAdamMomentsIntoTheNewSubspace) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectRefitTransfersMoments(16);
}

TEST(ResumeTest, OneSidedRefitCarriesTheAdamMomentsIntoTheNewSubspace) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectRefitTransfersMoments(48);
}

// lsp.d_ratio: every matrix gets d_i = round(0.5 * min(m, n)) on both sides (the tiny model:
// q/o 64 x 64 -> 32, k/v 32 x 64 -> 16, gate/up 128 x 64 and down 64 x 128 -> 32). The job
// trains and resumes bitwise, and its optimizer state holds (d_i, d_i) moments per matrix.
TEST(ResumeTest, RatioSubspacesArePerMatrixAndResumeBitwise) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const auto ratio = [](v1::JobSpec* s) {
    s->mutable_lsp()->set_d(0);
    s->mutable_lsp()->set_d_ratio(0.5);
  };
  ExpectExactResume(v1::MODE_LSP, ratio);
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  v1::JobSpec s = Spec(testing_jobs::TempDir("ratio"), v1::MODE_LSP, 2);
  ratio(&s);
  s.set_checkpoint_every(2);
  RunResult r = RunToEnd(stub.get(), s);
  ASSERT_EQ(r.last.state(), v1::SUCCEEDED) << r.last.error();
  auto f = model::SafetensorsFile::Open(s.output_dir() +
                                        "/checkpoints/step-00000002/optimizer_state.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  for (const auto& [name, d] : std::vector<std::pair<std::string, int64_t>>{
           {"model.layers.0.self_attn.q_proj.weight", 32},
           {"model.layers.0.self_attn.k_proj.weight", 16},
           {"model.layers.1.mlp.gate_proj.weight", 32},
           {"model.layers.1.mlp.down_proj.weight", 32}}) {
    EXPECT_TRUE(
        offload::ReadStateTensor(*f, "ratio", name + ".adam_m", at::kFloat, {d, d}).ok())
        << name << " should have (" << d << ", " << d << ") moments";
  }
}

TEST(ResumeTest, ZeroResumedAtStep3MatchesTheUninterruptedRunBitwise) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectExactResume(v1::MODE_ZERO);
}

TEST(ResumeTest, NativeResumedAtStep3MatchesTheUninterruptedRunBitwise) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectExactResume(v1::MODE_NATIVE);
}

// Checkpoint contents, checksums, pruning; corrupted and mismatched checkpoints.
// Issue 43: `lspctl cancel` stops a running step at the next layer boundary (the scheduler
// abandons the step with AbortStep; the worker's layer hooks stop the pass), not after the
// whole step, and the job resumes from its last checkpoint. Steps here take seconds (many
// micro-batches); the cancel lands 30% into step 2 and must end the job well before step 2
// could have finished.
TEST(ResumeTest, ACancelStopsTheRunningStepAtALayerBoundaryAndTheJobResumes) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string dir = testing_jobs::TempDir("cancel-step");
  v1::JobSpec spec = Spec(dir, v1::MODE_LSP, 4);
  spec.set_grad_accum(100);  // 100 micro-batches of 4 x 32 tokens a step
  spec.set_checkpoint_every(1);
  spec.mutable_lsp()->set_check_freq(0);
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobReply rep;
  ASSERT_TRUE(stub->SubmitJob(&ctx, req, &rep).ok());
  double step1_seconds = 0;
  for (;;) {  // until step 1 and its checkpoint are done and step 2 runs
    grpc::ClientContext gctx;
    v1::GetJobRequest g;
    g.set_job_id(rep.job_id());
    v1::JobStatus st;
    ASSERT_TRUE(stub->GetJob(&gctx, g, &st).ok());
    ASSERT_NE(st.state(), v1::FAILED) << st.error();
    ASSERT_NE(st.state(), v1::SUCCEEDED);
    if (st.last_checkpoint_step() == 1 && st.state() == v1::RUNNING) {
      step1_seconds = st.last_step().step_seconds();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_GT(step1_seconds, 1.0) << "steps must be long enough to tell a stop from a finish";
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int>(300 * step1_seconds)));
  const auto t_cancel = std::chrono::steady_clock::now();
  const v1::JobStatus last = testing_jobs::CancelAndWatch(stub.get(), rep.job_id());
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_cancel).count();
  EXPECT_EQ(last.state(), v1::CANCELLED) << last.error();
  EXPECT_EQ(last.step(), 1);  // step 2 never completed
  // Step 2 had ~70% of a step left; stopping at a layer boundary takes a layer's time.
  EXPECT_LT(took, 0.35 * step1_seconds)
      << "the cancel took " << took << " s; a step takes " << step1_seconds << " s";
  std::printf("cancel 30%% into a %.2f s step: the job ended %.3f s later\n", step1_seconds,
              took);
  // The last checkpoint is intact and the job resumes from it.
  v1::JobSpec again = spec;
  again.set_resume_from("latest");
  again.set_steps(2);
  RunResult resumed = RunToEnd(stub.get(), again);
  ASSERT_EQ(resumed.last.state(), v1::SUCCEEDED) << resumed.last.error();
  EXPECT_EQ(resumed.last.resumed_from_step(), 1);
  EXPECT_EQ(resumed.loss.size(), 1u);
}

TEST(ResumeTest, CheckpointsAreCompleteChecksummedPrunedAndVerified) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string dir = testing_jobs::TempDir("ckpt");
  v1::JobSpec spec = Spec(dir, v1::MODE_LSP, 6);
  spec.set_checkpoint_every(2);
  spec.set_keep_checkpoints(2);
  RunResult r = RunToEnd(stub.get(), spec);
  ASSERT_EQ(r.last.state(), v1::SUCCEEDED) << r.last.error();
  std::vector<scheduler::CheckpointInfo> all = scheduler::ListCheckpoints(dir);
  ASSERT_EQ(all.size(), 2u);  // step 2 pruned
  EXPECT_EQ(all[0].step, 4);
  EXPECT_EQ(all[1].step, 6);
  for (const auto& e : fs::directory_iterator(dir + "/checkpoints")) {
    EXPECT_NE(e.path().filename().string().rfind(".tmp", 0), 0u) << e.path();
  }
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json",
                        "worker_state.safetensors", "optimizer_state.safetensors",
                        "trainer_state.json"}) {
    EXPECT_TRUE(fs::exists(all[0].dir + "/" + f)) << f;
  }
  absl::StatusOr<nlohmann::json> state = scheduler::VerifyCheckpoint(all[0].dir);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ((*state)["step"], 4);
  EXPECT_EQ((*state)["data_cursor"]["examples_consumed"], 4 * 4 * 2);  // steps x batch x accum
  // The checkpoint's model holds the merged fp32 master weights of every HF tensor.
  auto model = model::SafetensorsFile::Open(all[0].dir + "/model.safetensors");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(*model->dtype("model.layers.0.self_attn.q_proj.weight"), "F32");
  // Optimizer state: the subspace moments are (d, d) and the Adam step counter is exact.
  auto opt = model::SafetensorsFile::Open(all[0].dir + "/optimizer_state.safetensors");
  ASSERT_TRUE(opt.ok()) << opt.status();
  EXPECT_EQ(*opt->shape("model.layers.1.mlp.down_proj.weight.adam_m"),
            (std::vector<int64_t>{16, 16}));
  auto step_raw = opt->RawData("model.layers.1.mlp.down_proj.weight.adam_step");
  ASSERT_TRUE(step_raw.ok());
  int64_t adam_step = 0;
  std::memcpy(&adam_step, step_raw->data(), 8);
  EXPECT_GT(adam_step, 0);
  EXPECT_LE(adam_step, 4);

  // Flip one byte of the optimizer state: verification names the file; an explicit resume
  // fails with it; "latest" (in a copy of the output dir) falls back to the older checkpoint.
  const std::string copy = testing_jobs::TempDir("ckpt-copy");
  fs::copy(dir + "/checkpoints", copy + "/checkpoints", fs::copy_options::recursive);
  const std::string victim = copy + "/checkpoints/step-00000006/optimizer_state.safetensors";
  {
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  absl::StatusOr<nlohmann::json> bad =
      scheduler::VerifyCheckpoint(copy + "/checkpoints/step-00000006");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("optimizer_state.safetensors"), std::string::npos);
  v1::JobSpec explicit_resume = Spec(copy, v1::MODE_LSP, 8);
  explicit_resume.set_resume_from(copy + "/checkpoints/step-00000006");
  RunResult failed = RunToEnd(stub.get(), explicit_resume);
  EXPECT_EQ(failed.last.state(), v1::FAILED);
  EXPECT_NE(failed.last.error().find("SHA-256"), std::string::npos) << failed.last.error();
  v1::JobSpec latest = Spec(copy, v1::MODE_LSP, 6);
  latest.set_resume_from("latest");
  RunResult fallback = RunToEnd(stub.get(), latest);
  ASSERT_EQ(fallback.last.state(), v1::SUCCEEDED) << fallback.last.error();
  EXPECT_EQ(fallback.last.resumed_from_step(), 4);
  EXPECT_EQ(fallback.loss[5], r.loss[5]);
  EXPECT_EQ(fallback.loss[6], r.loss[6]);

  // A different training spec (learning rate) must not resume from this checkpoint.
  v1::JobSpec other = Spec(testing_jobs::TempDir("ckpt-other"), v1::MODE_LSP, 8);
  other.mutable_optim()->set_lr(5e-3);
  other.set_resume_from(all[1].dir);
  RunResult mismatch = RunToEnd(stub.get(), other);
  EXPECT_EQ(mismatch.last.state(), v1::FAILED);
  EXPECT_NE(mismatch.last.error().find("different training spec (modified: optim.lr: "),
            std::string::npos)
      << mismatch.last.error();
}

// Disk full while checkpointing (RLIMIT_FSIZE makes every write past 1 MiB fail with EFBIG,
// as ENOSPC would): the job reports it, keeps training, and the previous checkpoint survives
// intact with no temporary left behind.
TEST(ResumeTest, AFailedCheckpointIsReportedAndThePreviousOneKept) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string dir = testing_jobs::TempDir("ckpt-full");
  v1::JobSpec first = Spec(dir, v1::MODE_LSP, 2);
  first.set_checkpoint_every(2);
  first.set_skip_checkpoint(true);
  ASSERT_EQ(RunToEnd(stub.get(), first).last.state(), v1::SUCCEEDED);
  ASSERT_EQ(scheduler::ListCheckpoints(dir).size(), 1u);

  v1::JobSpec second = Spec(dir, v1::MODE_LSP, 4);
  second.set_checkpoint_every(2);
  second.set_skip_checkpoint(true);
  second.set_resume_from("latest");
  struct rlimit old;
  getrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  RunResult r = RunToEnd(stub.get(), second);
  setrlimit(RLIMIT_FSIZE, &old);
  ASSERT_EQ(r.last.state(), v1::SUCCEEDED) << r.last.error();
  EXPECT_EQ(r.last.step(), 4);
  EXPECT_EQ(r.last.last_checkpoint_step(), 2);
  EXPECT_NE(r.last.last_error().find("checkpoint of step 4 failed"), std::string::npos)
      << r.last.last_error();
  EXPECT_NE(r.last.last_error().find("step 2 is kept"), std::string::npos) << r.last.last_error();
  std::vector<scheduler::CheckpointInfo> all = scheduler::ListCheckpoints(dir);
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].step, 2);
  EXPECT_TRUE(scheduler::VerifyCheckpoint(all[0].dir).ok());
  EXPECT_FALSE(fs::exists(dir + "/checkpoints/.tmp-step-00000004"));
}

// A scheduler that died (kill -9) leaves its job store behind: the job it was running (state
// RUNNING in the store) resumes from its newest checkpoint on restart, a queued one runs after.
TEST(ResumeTest, RestartedSchedulerResumesTheRunningJobAndRunsQueuedOnes) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string state_dir = testing_jobs::TempDir("state");
  const std::string dir = testing_jobs::TempDir("restart");
  v1::JobSpec spec = Spec(dir, v1::MODE_LSP, 6);
  spec.set_checkpoint_every(3);
  std::map<int, double> reference;
  {
    // The "crashed" run: 6 steps with a checkpoint at 3 (its later output is what the
    // resumed run must reproduce).
    auto runtime = testing_jobs::StartEmbedded();
    auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
    RunResult r = RunToEnd(stub.get(), spec);
    ASSERT_EQ(r.last.state(), v1::SUCCEEDED) << r.last.error();
    reference = r.loss;
  }
  fs::remove_all(dir + "/checkpoints/step-00000006");
  // What a scheduler killed during step 5 leaves in its store.
  spec::ResolveDefaults(&spec);
  v1::JobStatus running;
  running.set_job_id("job-100-7");
  running.set_state(v1::RUNNING);
  running.set_step(4);
  running.set_total_steps(6);
  running.set_output_dir(dir);
  running.set_last_checkpoint_step(3);
  *running.mutable_spec() = spec;
  v1::JobStatus queued;
  queued.set_job_id("job-100-8");
  queued.set_state(v1::QUEUED);
  *queued.mutable_spec() = Spec(testing_jobs::TempDir("restart-q"), v1::MODE_LSP, 2);
  spec::ResolveDefaults(queued.mutable_spec());
  queued.set_output_dir(queued.spec().output_dir());
  {
    auto store = scheduler::JobStore::Open(state_dir);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE(store->Save(running).ok());
    ASSERT_TRUE(store->Save(queued).ok());
    std::ofstream(state_dir + "/jobs/garbage.json") << "{not json";
  }
  scheduler::SchedulerOptions opts;
  opts.state_dir = state_dir;
  auto runtime = testing_jobs::StartEmbedded(opts);
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  std::map<int, double> resumed;
  v1::JobStatus last;
  {
    grpc::ClientContext ctx;
    v1::WatchJobRequest req;
    req.set_job_id("job-100-7");
    auto reader = stub->WatchJob(&ctx, req);
    v1::JobStatus s;
    while (reader->Read(&s)) {
      if (s.has_last_step()) resumed[s.last_step().step()] = s.last_step().loss();
      last = s;
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  ASSERT_EQ(last.state(), v1::SUCCEEDED) << last.error();
  EXPECT_EQ(last.restarts(), 1);
  EXPECT_EQ(last.resumed_from_step(), 3);
  for (int step = 4; step <= 6; ++step) EXPECT_EQ(resumed[step], reference[step]) << step;
  // The queued job ran too, and new ids continue after the recovered ones.
  {
    grpc::ClientContext ctx;
    v1::WatchJobRequest req;
    req.set_job_id("job-100-8");
    auto reader = stub->WatchJob(&ctx, req);
    v1::JobStatus s;
    while (reader->Read(&s)) last = s;
    ASSERT_TRUE(reader->Finish().ok());
    EXPECT_EQ(last.state(), v1::SUCCEEDED) << last.error();
  }
  EXPECT_TRUE(fs::exists(state_dir + "/jobs/garbage.json.corrupt"));
  // The store now holds the final states.
  auto store = scheduler::JobStore::Open(state_dir);
  ASSERT_TRUE(store.ok());
  std::vector<v1::JobStatus> jobs = store->LoadAll(nullptr);
  ASSERT_EQ(jobs.size(), 2u);
  for (const auto& j : jobs) EXPECT_EQ(j.state(), v1::SUCCEEDED) << j.job_id();
}

// The exported checkpoint is a Hugging Face checkpoint: transformers' LlamaForCausalLM loads
// model.safetensors + config.json (tests/oracle/make_export_oracle.py, run on the directory
// this test leaves when LSPO_KEEP_EXPORT=<dir> is set) and its logits, stored in
// tests/oracle/data/export_oracle.json, equal the project's own model's logits on the same
// weights. The job is deterministic (seeded tiny Llama, lsp mode, 3 steps), so the stored
// oracle applies to the checkpoint this test writes.
TEST(ResumeTest, ExportedSafetensorsGiveTheSameLogitsInTransformers) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const char* keep = getenv("LSPO_KEEP_EXPORT");
  const std::string dir = keep != nullptr ? std::string(keep) : testing_jobs::TempDir("export");
  v1::JobSpec spec = Spec(dir, v1::MODE_LSP, 3);
  spec.set_num_threads(1);
  {
    auto runtime = testing_jobs::StartEmbedded();
    auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
    RunResult r = RunToEnd(stub.get(), spec);
    ASSERT_EQ(r.last.state(), v1::SUCCEEDED) << r.last.error();
  }
  if (keep != nullptr) {
    // For the oracle script: the seeded initial weights, to measure how far training moved.
    v1::JobSpec init = spec;
    spec::ResolveDefaults(&init);
    auto m0 = offload::LoadJobModel(init);
    ASSERT_TRUE(m0.ok()) << m0.status();
    std::vector<model::SafetensorsEntry> entries;
    std::vector<at::Tensor> keep_alive;
    for (auto& [name, t] : m0->NamedTensors()) {
      keep_alive.push_back(t.detach().to(at::kFloat).contiguous());
      entries.push_back({name, "F32", keep_alive.back().sizes().vec(),
                         keep_alive.back().data_ptr(),
                         static_cast<size_t>(keep_alive.back().numel() * 4)});
    }
    ASSERT_TRUE(model::WriteSafetensors(dir + "/init.safetensors", entries, {}).ok());
  }
  std::ifstream oracle_file("tests/oracle/data/export_oracle.json");
  ASSERT_TRUE(oracle_file.good()) << "run tests/oracle/make_export_oracle.py";
  const nlohmann::json oracle = nlohmann::json::parse(oracle_file);
  // Our model on the exported weights: the seeded initial model, every tensor replaced by
  // the file's (so a missing or misnamed tensor fails here).
  spec::ResolveDefaults(&spec);
  auto model = offload::LoadJobModel(spec);
  ASSERT_TRUE(model.ok()) << model.status();
  auto file = model::SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  int replaced = 0;
  for (auto& [name, t] : model->NamedTensors()) {
    auto values = file->ReadF32(name);
    ASSERT_TRUE(values.ok()) << name << ": " << values.status();
    ASSERT_EQ(static_cast<int64_t>(values->size()), t.numel()) << name;
    at::NoGradGuard no_grad;
    t.copy_(at::from_blob(values->data(), t.sizes(), at::kFloat));
    ++replaced;
  }
  EXPECT_EQ(replaced, static_cast<int>(file->names().size()));
  std::vector<int64_t> ids = oracle["input_ids"].get<std::vector<int64_t>>();
  at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0);
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = model->Logits(input)[0].contiguous();  // (T, V)
  }
  const int64_t T = logits.size(0);
  ASSERT_EQ(T, static_cast<int64_t>(ids.size()));
  double max_diff = 0;
  for (const auto& pos : oracle["positions"]) {
    const int64_t p = pos["position"].get<int64_t>();
    const auto first = pos["first"].get<std::vector<double>>();
    for (size_t k = 0; k < first.size(); ++k) {
      max_diff = std::max(max_diff, std::abs(logits[p][k].item<double>() - first[k]));
    }
    EXPECT_EQ(logits[p].argmax().item<int64_t>(), pos["argmax"].get<int64_t>()) << p;
  }
  // fp32 on both sides; the weights moved by ~1e-2 from the seeded init, so a wrong or stale
  // tensor shows up far above this.
  std::printf("max |logit| difference, ours vs transformers on the export: %.3g\n", max_diff);
  EXPECT_LT(max_diff, 2e-3) << "our logits vs transformers' on the exported checkpoint";
  // The oracle was made on the initial + trained weights, not the initial ones alone.
  EXPECT_GT(oracle["max_abs_change_vs_init"].get<double>(), 1e-4);
}

// Non-finite gradients (injected at steps 3..6 by the worker's fault hook, so the real
// detection path runs: each matrix's gradient is checked as it is published and the overlapped
// optimizer is released): each such step is skipped with weights and optimizer state
// untouched and counted; the job fails clearly after max_nonfinite_steps in a row, keeping the
// checkpoint of step 2. With fewer bad steps in a row than the limit the job completes.
TEST(ResumeTest, NonFiniteStepsAreSkippedCountedAndFailTheJobAfterTheLimit) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbeddedWithFaults("3,4,5,6");
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string dir = testing_jobs::TempDir("nan");
  v1::JobSpec spec = Spec(dir, v1::MODE_LSP, 10);
  spec.set_max_nonfinite_steps(3);
  spec.set_checkpoint_every(1);
  RunResult r = RunToEnd(stub.get(), spec);
  ASSERT_EQ(r.last.state(), v1::FAILED);
  EXPECT_EQ(r.last.skipped_steps(), 3);
  EXPECT_EQ(r.loss.size(), 2u);  // steps 1 and 2 completed
  EXPECT_NE(r.last.error().find("3 non-finite steps in a row at step 5"), std::string::npos)
      << r.last.error();
  EXPECT_NE(r.last.error().find("lower optim.lr"), std::string::npos) << r.last.error();
  ASSERT_FALSE(scheduler::ListCheckpoints(dir).empty());
  EXPECT_EQ(scheduler::ListCheckpoints(dir).back().step, 2);
  EXPECT_TRUE(scheduler::VerifyCheckpoint(dir + "/checkpoints/step-00000002").ok());

  // Two bad steps with a limit of 3 (zero mode): skipped, counted, and the job completes.
  v1::JobSpec ok = Spec(testing_jobs::TempDir("nan-ok"), v1::MODE_ZERO, 7);
  ok.set_max_nonfinite_steps(3);
  auto runtime2 = testing_jobs::StartEmbeddedWithFaults("3,4");
  auto stub2 = v1::Scheduler::NewStub(runtime2->scheduler_channel());
  RunResult done = RunToEnd(stub2.get(), ok);
  ASSERT_EQ(done.last.state(), v1::SUCCEEDED) << done.last.error();
  EXPECT_EQ(done.last.skipped_steps(), 2);
  EXPECT_EQ(done.loss.size(), 5u);
  for (const auto& [step, loss] : done.loss) EXPECT_TRUE(std::isfinite(loss)) << step;
}

// A skipped step is all or nothing (issue 43), under the overlap schedule without clipping,
// where the optimizer takes each matrix's step while the backward still forms the others:
//   reference: every gradient of step 3 is NaN (the first one published aborts the step,
//              before the optimizer touched anything);
//   one:       only linear 0's gradient (layer 0: the last formed) is NaN, after the optimizer
//              took every other matrix's step (zero mode kept no undo record before the fix:
//              the master and the moments of those matrices moved);
//   loss:      every gradient finite, the loss found non-finite after the backward (a CUDA
//              worker reads it there), when the optimizer has taken the whole step.
// All three skip step 3 and must then be bitwise the same run: the losses of steps 4 and 5
// (the worker's weights) and the final weights (the optimizer's master and moments).
void ExpectSkippedStepLeavesNoTrace(v1::TrainingMode mode) {
  struct Case {
    const char* name;
    const char* grad_fault;  // WorkerFaults::nonfinite_grad_steps
    const char* loss_fault;  // WorkerFaults::nonfinite_loss_steps
  };
  const Case cases[] = {{"reference", "3", ""}, {"one", "3:0", ""}, {"loss", "", "3"}};
  std::vector<RunResult> runs;
  std::vector<std::vector<uint8_t>> weights;
  for (const Case& c : cases) {
    const std::string dir = testing_jobs::TempDir(std::string("skip-") + c.name);
    v1::JobSpec spec = Spec(dir, mode, 5);
    spec.set_grad_accum(1);
    spec.mutable_optim()->set_max_grad_norm(0);  // no clipping: updates start at once
    spec.set_schedule(v1::STEP_SCHEDULE_OVERLAP);
    spec.set_max_nonfinite_steps(3);
    auto runtime = testing_jobs::StartEmbeddedWithFaults(c.grad_fault, c.loss_fault);
    auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
    RunResult r = RunToEnd(stub.get(), spec);
    ASSERT_EQ(r.last.state(), v1::SUCCEEDED) << c.name << ": " << r.last.error();
    EXPECT_EQ(r.last.skipped_steps(), 1) << c.name;
    EXPECT_EQ(r.loss.count(3), 0u) << c.name;
    ASSERT_EQ(r.loss.size(), 4u) << c.name;
    runs.push_back(std::move(r));
    weights.push_back(Bytes(dir + "/model.safetensors"));
    ASSERT_GT(weights.back().size(), 1000u) << c.name;
  }
  for (size_t k = 1; k < runs.size(); ++k) {
    for (int step : {1, 2, 4, 5}) {
      EXPECT_EQ(runs[k].loss[step], runs[0].loss[step])
          << cases[k].name << " vs reference, step " << step;
    }
    EXPECT_TRUE(weights[k] == weights[0])
        << cases[k].name << ": the final weights differ from the reference run's: the skipped "
        << "step left a trace";
  }
}

TEST(ResumeTest, ASkippedZeroStepIsAllOrNothingUnderTheOverlapSchedule) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectSkippedStepLeavesNoTrace(v1::MODE_ZERO);
}

TEST(ResumeTest, ASkippedLspStepIsAllOrNothingUnderTheOverlapSchedule) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  ExpectSkippedStepLeavesNoTrace(v1::MODE_LSP);
}

// Poisoned state (docs/known-failures.md #5): a NaN moment or a wrong shape in a state file is
// refused naming the file and the tensor, before anything is restored.
TEST(ResumeTest, PoisonedOrMismatchedStateTensorsAreRefused) {
  const std::string dir = testing_jobs::TempDir("poison");
  at::Tensor m = at::ones({4, 4});
  m[2][3] = std::numeric_limits<float>::quiet_NaN();
  offload::NamedTensors tensors = {{"w.adam_m", m}, {"w.adam_v", at::ones({4, 4})},
                                  {"w.adam_step", at::scalar_tensor(int64_t{3}, at::kLong)}};
  const std::string path = dir + "/optimizer_state.safetensors";
  ASSERT_TRUE(offload::WriteTensorFile(path, tensors, {{"step", "3"}}).ok());
  auto file = model::SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto nan = offload::ReadStateTensor(*file, "state", "w.adam_m", at::kFloat, {4, 4});
  ASSERT_FALSE(nan.ok());
  EXPECT_EQ(nan.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(nan.status().message().find("w.adam_m"), std::string::npos) << nan.status();
  EXPECT_NE(nan.status().message().find("NaN"), std::string::npos) << nan.status();
  auto shape = offload::ReadStateTensor(*file, "state", "w.adam_v", at::kFloat, {4, 5});
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kDataLoss);
  auto ok = offload::ReadStateTensor(*file, "state", "w.adam_v", at::kFloat, {4, 4});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->sum().item<float>(), 16.0f);
  auto step = offload::ReadStateTensor(*file, "state", "w.adam_step", at::kLong, {});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->item<int64_t>(), 3);
  EXPECT_EQ(offload::ReadStateTensor(*file, "state", "w.missing", at::kFloat, {1}).status().code(),
            absl::StatusCode::kNotFound);
}

// Path checks of a multi-user scheduler (--allowed_roots).
TEST(ResumeTest, SpecsCannotReachOutsideTheAllowedRoots) {
  const std::string root = testing_jobs::TempDir("roots");
  fs::create_directories(root + "/data");
  std::ofstream(root + "/data/train.txt") << "hello";
  fs::create_symlink("/etc", root + "/data/escape");
  v1::JobSpec spec;
  spec.mutable_model()->set_path(root + "/data/train.txt");
  spec.mutable_data()->set_train_path(root + "/data/train.txt");
  spec.set_output_dir(root + "/runs/new/sub");
  EXPECT_TRUE(spec::CheckPathsUnderRoots(spec, {root}).ok());
  EXPECT_TRUE(spec::CheckPathsUnderRoots(spec, {}).ok());
  v1::JobSpec dotdot = spec;
  dotdot.set_output_dir(root + "/runs/../../elsewhere");
  absl::Status st = spec::CheckPathsUnderRoots(dotdot, {root});
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("output_dir"), std::string::npos) << st;
  v1::JobSpec link = spec;
  link.mutable_data()->set_eval_path(root + "/data/escape/passwd");
  st = spec::CheckPathsUnderRoots(link, {root});
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("data.eval_path"), std::string::npos) << st;
  EXPECT_NE(st.message().find("--allowed_roots"), std::string::npos) << st;
  v1::JobSpec adapter = spec;  // mode lora's adapter folder, merged at load
  adapter.mutable_model()->set_adapter_path(root + "/data/escape");
  st = spec::CheckPathsUnderRoots(adapter, {root});
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("model.adapter_path"), std::string::npos) << st;
  // A chat template given as a path is a path like the others; given as Jinja text, it is not.
  v1::JobSpec tmpl = spec;
  tmpl.mutable_data()->set_chat_template(root + "/data/escape/hostname");
  st = spec::CheckPathsUnderRoots(tmpl, {root});
  EXPECT_EQ(st.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(st.message().find("data.chat_template"), std::string::npos) << st;
  tmpl.mutable_data()->set_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}");
  EXPECT_TRUE(spec::CheckPathsUnderRoots(tmpl, {root}).ok());
}

}  // namespace
}  // namespace lspo
