// Data parallelism (issue 17, docs/distributed.md): ranks are embedded runtimes (a worker, an
// optimizer and a scheduler each) in threads of this process, meeting over loopback through
// c10d. Two ranks at micro-batch b must train as one rank at micro-batch 2b; a rank of another
// job or one that never joins must fail the job with the rank named, within the timeout.
#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "client/embedded.h"
#include "gtest/gtest.h"
#include "offload/collective.h"
#include "scheduler/checkpoint.h"
#include "spec/job_spec.h"
#include "tests/integration/data_parallel_jobs.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

namespace fs = std::filesystem;

using testing_jobs::Bytes;
using testing_jobs::DpSpec;
using testing_jobs::ExpectBothSchedulesMatchOne;
using testing_jobs::ExpectTwoRanksMatchOne;
using testing_jobs::RankSpecs;
using testing_jobs::RunOne;
using testing_jobs::RunRanks;
using testing_jobs::WatchResult;

TEST(DataParallelTest, NativeTwoRanksAtMicroBatch2MatchOneRankAt4) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  ExpectTwoRanksMatchOne(v1::MODE_NATIVE);
}

TEST(DataParallelTest, LoraTwoRanksAtMicroBatch2MatchOneRankAt4) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  ExpectTwoRanksMatchOne(v1::MODE_LORA);
}

TEST(DataParallelTest, LspTwoRanksAtMicroBatch2MatchOneRankAt4UnderBothSchedules) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  ExpectBothSchedulesMatchOne(v1::MODE_LSP, 1e-5);
}

TEST(DataParallelTest, GaloreTwoRanksAtMicroBatch2MatchOneRankAt4) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  // GaLore's projector is the SVD of the gradient, which amplifies the fp32 summation-order
  // differences (measured: 6.5e-5 / 3.4e-5 after 1 / 4 steps against the same micro-batches,
  // 3.3e-4 / 1.7e-4 for one rank's re-batching): held to the re-batching noise.
  ExpectTwoRanksMatchOne(v1::MODE_GALORE, /*same_batches_bound=*/0);
}

TEST(DataParallelTest, ZeroTwoRanksAtMicroBatch2MatchOneRankAt4UnderBothSchedules) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  ExpectBothSchedulesMatchOne(v1::MODE_ZERO, /*same_batches_bound=*/0);
}

// A two-rank job checkpointed at step 3 and resumed by two ranks (other output folders, another
// rendezvous port) is bitwise the uninterrupted one: the same losses at steps 4..6 and the same
// model.safetensors on each rank. Ranks resuming from different steps fail at the first step,
// naming both steps.
TEST(DataParallelTest, ATwoRankJobResumesBitwiseAndTheRanksMustResumeOneStep) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  for (v1::TrainingMode mode : {v1::MODE_NATIVE, v1::MODE_LSP}) {
    SCOPED_TRACE(v1::TrainingMode_Name(mode));
    v1::JobSpec base = DpSpec("dp-resume", mode, 2, 6);
    base.mutable_lsp()->set_check_freq(4);  // a refit after the resume point
    base.set_checkpoint_every(3);
    const std::vector<v1::JobSpec> full = RankSpecs(base, 2, 120);
    const std::vector<WatchResult> a = RunRanks(full);
    std::vector<v1::JobSpec> again = RankSpecs(base, 2, 120);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(a[r].last.state(), v1::SUCCEEDED) << "rank " << r << ": " << a[r].last.error();
      again[r].set_resume_from(full[r].output_dir() + "/checkpoints/step-00000003");
    }
    const std::vector<WatchResult> b = RunRanks(again);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(b[r].last.state(), v1::SUCCEEDED) << "rank " << r << ": " << b[r].last.error();
      EXPECT_EQ(b[r].last.resumed_from_step(), 3);
      const auto la = testing_jobs::StepLosses(a[r]), lb = testing_jobs::StepLosses(b[r]);
      for (int step = 4; step <= 6; ++step) {
        ASSERT_TRUE(lb.count(step) && la.count(step)) << step;
        EXPECT_EQ(lb.at(step), la.at(step)) << "rank " << r << " step " << step;  // bitwise
      }
      const std::vector<uint8_t> wa = Bytes(full[r].output_dir() + "/model.safetensors");
      EXPECT_GT(wa.size(), 1000u);
      EXPECT_TRUE(wa == Bytes(again[r].output_dir() + "/model.safetensors")) << "rank " << r;
    }
  }
  // Rank 0 resumes at step 3, rank 1 starts afresh ("latest" in an empty folder): refused at
  // LoadJob, before any step, by the ranks' resume agreement (issue 43).
  v1::JobSpec base = DpSpec("dp-resume-mixed", v1::MODE_NATIVE, 2, 6);
  base.set_checkpoint_every(3);
  const std::vector<v1::JobSpec> first = RankSpecs(base, 2, 120);
  for (const WatchResult& w : RunRanks(first)) ASSERT_EQ(w.last.state(), v1::SUCCEEDED);
  std::vector<v1::JobSpec> mixed = RankSpecs(base, 2, 120);
  mixed[0].set_resume_from(first[0].output_dir() + "/checkpoints/step-00000003");
  mixed[1].set_resume_from("latest");
  const std::vector<WatchResult> m = RunRanks(mixed);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(m[r].last.state(), v1::FAILED) << r;
    EXPECT_NE(m[r].last.error().find("no checkpoint of one step in common"), std::string::npos)
        << m[r].last.error();
    EXPECT_NE(m[r].last.error().find("rank 0 ("), std::string::npos) << m[r].last.error();
    EXPECT_NE(m[r].last.error().find("): step 3; rank 1 ("), std::string::npos)
        << m[r].last.error();
    EXPECT_NE(m[r].last.error().find("): none"), std::string::npos) << m[r].last.error();
  }
}

// resume_from: latest on every rank (issue 43): rank 1 died after rank 0 committed step 6 and
// before it did (its step-6 is gone, its `latest` pointer says step 4). The ranks agree at
// LoadJob on step 4, the newest both hold (before: rank 0 took 6, rank 1 took 4, and every
// restart failed the same way), and train steps 5-6 again, bitwise as the first time. With
// keep_checkpoints 1 a data-parallel rank still keeps the checkpoint before its newest: the
// other ranks may not have committed the newest yet.
TEST(DataParallelTest, RanksResumingFromLatestAgreeOnTheNewestCheckpointAllOfThemHold) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  v1::JobSpec base = DpSpec("dp-agree", v1::MODE_NATIVE, 2, 6);
  base.set_checkpoint_every(2);
  base.set_keep_checkpoints(1);
  const std::vector<v1::JobSpec> first = RankSpecs(base, 2, 120);
  const std::vector<WatchResult> a = RunRanks(first);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(a[r].last.state(), v1::SUCCEEDED) << "rank " << r << ": " << a[r].last.error();
    std::vector<int> steps;
    for (const auto& c : scheduler::ListCheckpoints(first[r].output_dir())) steps.push_back(c.step);
    EXPECT_EQ(steps, (std::vector<int>{4, 6})) << "rank " << r;
  }
  const std::string ckpts1 = first[1].output_dir() + "/checkpoints";
  fs::remove_all(ckpts1 + "/step-00000006");
  std::ofstream(ckpts1 + "/latest", std::ios::trunc) << "step-00000004\n";
  std::vector<v1::JobSpec> again = RankSpecs(base, 2, 120);  // a new port
  for (int r = 0; r < 2; ++r) {
    again[r].set_output_dir(first[r].output_dir());
    again[r].set_resume_from("latest");
  }
  const std::vector<WatchResult> b = RunRanks(again);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(b[r].last.state(), v1::SUCCEEDED) << "rank " << r << ": " << b[r].last.error();
    EXPECT_EQ(b[r].last.resumed_from_step(), 4) << "rank " << r;
    const auto la = testing_jobs::StepLosses(a[r]), lb = testing_jobs::StepLosses(b[r]);
    for (int step = 5; step <= 6; ++step) {
      ASSERT_TRUE(lb.count(step) && la.count(step)) << step;
      EXPECT_EQ(lb.at(step), la.at(step)) << "rank " << r << " step " << step;  // bitwise
    }
    EXPECT_EQ(lb.count(4), 0u) << "rank " << r;
  }
  EXPECT_TRUE(Bytes(first[0].output_dir() + "/model.safetensors") ==
              Bytes(first[1].output_dir() + "/model.safetensors"));
  // No step in common (rank 0 holds only step 6, rank 1 only step 4): refused on every rank,
  // naming each rank's newest.
  fs::remove_all(first[0].output_dir() + "/checkpoints/step-00000004");
  fs::remove_all(first[1].output_dir() + "/checkpoints/step-00000006");
  std::ofstream(ckpts1 + "/latest", std::ios::trunc) << "step-00000004\n";
  std::ofstream(first[0].output_dir() + "/checkpoints/latest", std::ios::trunc)
      << "step-00000006\n";
  std::vector<v1::JobSpec> third = again;
  const std::vector<v1::JobSpec> fresh_port = RankSpecs(base, 2, 120);
  for (int r = 0; r < 2; ++r) *third[r].mutable_distributed() = fresh_port[r].distributed();
  const std::vector<WatchResult> c = RunRanks(third);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(c[r].last.state(), v1::FAILED) << "rank " << r;
    EXPECT_NE(c[r].last.error().find("no checkpoint of one step in common"), std::string::npos)
        << c[r].last.error();
    EXPECT_NE(c[r].last.error().find("step 6; rank 1"), std::string::npos) << c[r].last.error();
  }
}

// Rank 0 evaluates for the job (every rank holds the same weights); the other ranks skip it.
// A non-finite gradient on one rank only (rank 1 at step 3, by the worker's fault hook) in the
// overlapped backward: its NaN reaches every rank's sum, so both ranks skip step 3 together
// (weights and optimizer state untouched), count it, go on, and end bitwise equal.
TEST(DataParallelTest, ANonFiniteGradientOnOneRankSkipsTheStepOnEveryRank) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  for (const v1::TrainingMode mode : {v1::MODE_LSP, v1::MODE_ZERO}) {
    std::vector<v1::JobSpec> specs = RankSpecs(DpSpec("dp-nan", mode, 2, 5), 2, 60);
    std::vector<WatchResult> ranks = RunRanks(specs, /*grad_faults=*/"3@1");
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(ranks[r].last.state(), v1::SUCCEEDED)
          << v1::TrainingMode_Name(mode) << " rank " << r << ": " << ranks[r].last.error();
      EXPECT_EQ(ranks[r].last.skipped_steps(), 1) << v1::TrainingMode_Name(mode) << " rank " << r;
      const auto losses = testing_jobs::StepLosses(ranks[r]);
      EXPECT_EQ(losses.count(3), 0u) << v1::TrainingMode_Name(mode) << " rank " << r;
      EXPECT_EQ(losses.size(), 4u) << v1::TrainingMode_Name(mode) << " rank " << r;
    }
    const std::vector<uint8_t> a = Bytes(specs[0].output_dir() + "/model.safetensors");
    EXPECT_FALSE(a.empty());
    EXPECT_TRUE(a == Bytes(specs[1].output_dir() + "/model.safetensors"))
        << v1::TrainingMode_Name(mode) << ": the ranks' weights differ";
  }
}

TEST(DataParallelTest, OnlyRankZeroEvaluates) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  v1::JobSpec base = DpSpec("dp-eval", v1::MODE_NATIVE, 2, 2);
  base.mutable_data()->set_eval_path(testing_jobs::MobyDickPath());
  base.mutable_data()->set_max_eval_examples(2);
  base.set_eval_every(1);
  const std::vector<WatchResult> r = RunRanks(RankSpecs(base, 2, 120));
  for (int k = 0; k < 2; ++k) ASSERT_EQ(r[k].last.state(), v1::SUCCEEDED) << r[k].last.error();
  EXPECT_EQ(r[0].last.evals_size(), 2);  // after step 1, and the final one
  EXPECT_EQ(r[1].last.evals_size(), 0);
}

// A rank started with another spec (another learning rate) is refused at the rendezvous on
// both ranks, naming the rank; a rank that never comes fails rank 0 within the timeout.
TEST(DataParallelTest, ARankOfAnotherJobOrAMissingRankFailsTheJobNamingTheRank) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  std::vector<v1::JobSpec> specs = RankSpecs(DpSpec("dp-fp", v1::MODE_NATIVE, 2), 2, 60);
  specs[1].mutable_optim()->set_lr(specs[0].optim().lr() * 2);
  std::vector<WatchResult> ranks = RunRanks(specs);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].last.state(), v1::FAILED) << r;
    EXPECT_NE(ranks[r].last.error().find("rank 1 ("), std::string::npos) << ranks[r].last.error();
    EXPECT_NE(ranks[r].last.error().find("runs a different job than rank 0"), std::string::npos)
        << ranks[r].last.error();
    // The field that differs is named, and the service hint of a dead peer is not appended.
    EXPECT_NE(ranks[r].last.error().find("the job spec differs (rank 0 -> this rank): "
                                         "modified: optim.lr: "),
              std::string::npos)
        << ranks[r].last.error();
    EXPECT_EQ(ranks[r].last.error().find("is the service running"), std::string::npos)
        << ranks[r].last.error();
  }
  std::vector<v1::JobSpec> alone = RankSpecs(DpSpec("dp-alone", v1::MODE_NATIVE, 2), 2, 3);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<WatchResult> r0 = RunRanks({alone[0]});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r0[0].last.state(), v1::FAILED);
  EXPECT_NE(r0[0].last.error().find("rank 1 of 2 did not join the rendezvous"), std::string::npos)
      << r0[0].last.error();
  EXPECT_LT(took, 60.0) << "the 3 s rendezvous timeout did not bound the wait";
}

// A job with a rendezvous token (distributed.rendezvous_token_file, issue 43) trains when every
// rank holds it; a rank with another token is refused naming its file, and rank 0 is not
// joined; allow_remote without a token is refused at submission, and the token file's path is
// checked against --allowed_roots.
TEST(DataParallelTest, ARendezvousTokenAdmitsTheRanksThatHoldItOnly) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  auto token_file = [](const std::string& name, const std::string& token) {
    const std::string path = testing_jobs::TempDir(name) + "/token";
    std::ofstream(path) << token << "\n";
    chmod(path.c_str(), 0600);
    return path;
  };
  const std::string right = token_file("dp-token-right", "0123456789abcdef0123456789abcdef");
  const std::string wrong = token_file("dp-token-wrong", "fedcba9876543210fedcba9876543210");
  std::vector<v1::JobSpec> specs = RankSpecs(DpSpec("dp-token", v1::MODE_NATIVE, 2, 2), 2, 60);
  for (auto& s : specs) s.mutable_distributed()->set_rendezvous_token_file(right);
  std::vector<WatchResult> ranks = RunRanks(specs);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks[r].last.state(), v1::SUCCEEDED) << r << ": " << ranks[r].last.error();
  }
  specs = RankSpecs(DpSpec("dp-token-bad", v1::MODE_NATIVE, 2, 2), 2, 3);
  specs[0].mutable_distributed()->set_rendezvous_token_file(right);
  specs[1].mutable_distributed()->set_rendezvous_token_file(wrong);
  ranks = RunRanks(specs);
  EXPECT_EQ(ranks[1].last.state(), v1::FAILED);
  EXPECT_NE(ranks[1].last.error().find("refused this rank's token "
                                       "(distributed.rendezvous_token_file=" + wrong + ")"),
            std::string::npos)
      << ranks[1].last.error();
  EXPECT_EQ(ranks[0].last.state(), v1::FAILED);
  EXPECT_NE(ranks[0].last.error().find("rank 1 of 2 did not join the rendezvous"),
            std::string::npos)
      << ranks[0].last.error();

  // The token is sent to the rendezvous address: a scheduler with --allowed_roots checks its path.
  v1::JobSpec only_token;
  only_token.mutable_distributed()->set_rendezvous_token_file("/etc/hostname");
  const absl::Status outside =
      spec::CheckPathsUnderRoots(only_token, {testing_jobs::TempDir("dp-roots")});
  EXPECT_EQ(outside.code(), absl::StatusCode::kPermissionDenied) << outside;
  EXPECT_NE(outside.message().find("distributed.rendezvous_token_file"), std::string::npos)
      << outside;

  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  v1::JobSpec remote = RankSpecs(DpSpec("dp-remote", v1::MODE_NATIVE, 2), 2, 10)[0];
  remote.mutable_distributed()->set_allow_remote(true);
  testing_jobs::ExpectRefusedAtSubmit(stub.get(), remote, grpc::StatusCode::INVALID_ARGUMENT,
                                      "distributed.allow_remote = true is invalid",
                                      "distributed.rendezvous_token_file");
}

// Modes whose update is not yet data parallel are refused at submission, naming the field.
TEST(DataParallelTest, ModesNotYetDataParallelAreRefusedAtSubmission) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  v1::JobSpec galore = RankSpecs(DpSpec("dp-mode", v1::MODE_GALORE, 2), 2, 10)[0];
  galore.mutable_galore()->set_offload(true);
  testing_jobs::ExpectRefusedAtSubmit(stub.get(), galore, grpc::StatusCode::INVALID_ARGUMENT,
                                      "distributed.world_size = 2 is invalid",
                                      "GaLore-Offload (galore.offload) follows");
  v1::JobSpec bad_rank = RankSpecs(DpSpec("dp-rank", v1::MODE_NATIVE, 2), 2, 10)[0];
  bad_rank.mutable_distributed()->set_rank(2);
  testing_jobs::ExpectRefusedAtSubmit(stub.get(), bad_rank, grpc::StatusCode::INVALID_ARGUMENT,
                                      "distributed.rank = 2 is invalid", "rank 2 of 2");
  v1::JobSpec bad_at = RankSpecs(DpSpec("dp-at", v1::MODE_NATIVE, 2), 2, 10)[0];
  bad_at.mutable_distributed()->set_rendezvous("node-1");
  testing_jobs::ExpectRefusedAtSubmit(stub.get(), bad_at, grpc::StatusCode::INVALID_ARGUMENT,
                                      "distributed.rendezvous = 'node-1' is invalid", "no port");
}

}  // namespace
}  // namespace lspo
