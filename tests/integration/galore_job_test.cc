// mode: galore end to end (gpu_worker/galore_path.cc, baselines/galore.h): a job on the tiny
// Llama trains every linear through GaLore's projected AdamW on the worker, reports its
// optimizer state, resumes bitwise from a checkpoint across a projector refresh, and refuses
// bad settings by name.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "offload/job_assets.h"
#include "scheduler/checkpoint.h"
#include "spec/job_spec.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

namespace fs = std::filesystem;

v1::JobSpec GaloreSpec(const std::string& out, int steps) {
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(out, v1::MODE_GALORE, steps);
  spec.mutable_galore()->set_rank(8);
  spec.mutable_galore()->set_update_proj_gap(2);
  spec.mutable_galore()->set_scale(1.0);
  spec.mutable_optim()->set_lr(1e-2);
  spec.set_grad_accum(2);
  spec.set_skip_initial_eval(true);
  spec.mutable_data()->set_max_eval_examples(2);
  return spec;
}

// The job trains (the loss falls), every linear changes, and the summary reports GaLore's
// state: per matrix two moments of rank x max(m, n) and a projector of rank x min(m, n), fp32.
TEST(GaloreJobTest, TrainsEveryLinearAndReportsItsState) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string dir = testing_jobs::TempDir("galore-job");
  v1::JobSpec spec = GaloreSpec(dir, 8);
  testing_jobs::WatchResult w = testing_jobs::SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  std::map<int, double> loss = testing_jobs::StepLosses(w);
  ASSERT_EQ(loss.size(), 8u);
  EXPECT_LT(loss[8], loss[1] - 0.05) << "galore did not train";

  const nlohmann::json summary =
      nlohmann::json::parse(testing_jobs::FileBytes(dir + "/summary.json"));
  EXPECT_EQ(summary["mode"], "galore");
  EXPECT_EQ(summary["galore_rank"], 8);
  EXPECT_EQ(summary["galore_update_proj_gap"], 2);
  EXPECT_EQ(summary["offload_bytes_per_step"], 0);
  // Tiny Llama, two layers: q, o 64x64; k, v 32x64; gate, up 128x64; down 64x128.
  auto bytes = [](int64_t m, int64_t n) { return 4 * 8 * (2 * std::max(m, n) + std::min(m, n)); };
  const int64_t per_layer =
      2 * bytes(64, 64) + 2 * bytes(32, 64) + 2 * bytes(128, 64) + bytes(64, 128);
  EXPECT_EQ(summary["optimizer_state_bytes"], 2 * per_layer);
  EXPECT_EQ(summary["trainable_parameters"], 2 * (2 * 64 * 64 + 2 * 32 * 64 + 3 * 128 * 64));

  v1::JobSpec resolved = spec;
  spec::ResolveDefaults(&resolved);
  auto base = offload::LoadJobModel(resolved);
  ASSERT_TRUE(base.ok()) << base.status();
  auto out = model::SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(out.ok()) << out.status();
  for (int64_t i = 0; i < base->num_linears(); ++i) {
    const std::string name = base->LinearName(i);
    auto values = out->ReadF32(name);
    ASSERT_TRUE(values.ok()) << name;
    const at::Tensor w0 = base->LinearWeight(i).to(at::kFloat);
    at::Tensor got = torch::from_blob(values->data(), w0.sizes(), at::kFloat).clone();
    EXPECT_GT((got - w0).abs().max().item<double>(), 1e-4) << name << " did not change";
  }
}

// Stopped at step 3 (projectors of step 3, moments of steps 1-3) and resumed, the job gives
// bitwise the losses and weights of the uninterrupted run, through the refresh at step 5.
TEST(GaloreJobTest, ResumedAtStep3MatchesTheUninterruptedRunBitwise) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string a_dir = testing_jobs::TempDir("galore-a");
  v1::JobSpec a = GaloreSpec(a_dir, 6);
  a.set_checkpoint_every(3);
  testing_jobs::WatchResult full = testing_jobs::SubmitAndWatch(stub.get(), a);
  ASSERT_EQ(full.last.state(), v1::SUCCEEDED) << full.last.error();
  const std::string ckpt = a_dir + "/checkpoints/step-00000003";
  auto state = model::SafetensorsFile::Open(ckpt + "/worker_state.safetensors");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_NE(state->Find("model.layers.1.mlp.down_proj.weight.galore_projector"), nullptr);
  EXPECT_EQ(state->metadata().at("galore_step"), "3");

  const std::string b_dir = testing_jobs::TempDir("galore-b");
  v1::JobSpec b = GaloreSpec(b_dir, 6);
  b.set_resume_from(ckpt);
  testing_jobs::WatchResult resumed = testing_jobs::SubmitAndWatch(stub.get(), b);
  testing_jobs::ExpectResumedBitwise(full, a_dir, resumed, b_dir, 3, 6);

  // A hand-edited galore_step past the checkpoint's step is refused as damaged state (the
  // header's JSON is edited in place: same length, so the tensor offsets stay valid).
  {
    const std::string edited = testing_jobs::TempDir("galore-edited") + "/step-00000003";
    fs::copy(ckpt, edited, fs::copy_options::recursive);
    std::string bytes = testing_jobs::FileBytes(edited + "/worker_state.safetensors");
    const size_t at = bytes.find("\"galore_step\":\"3\"");
    ASSERT_NE(at, std::string::npos);
    bytes[at + std::string("\"galore_step\":\"").size()] = '9';
    std::ofstream(edited + "/worker_state.safetensors", std::ios::binary | std::ios::trunc)
        << bytes;
    // As a user would after editing: the file's SHA-256 renewed in checksums.sha256.
    auto sum = scheduler::Sha256File(edited + "/worker_state.safetensors");
    ASSERT_TRUE(sum.ok()) << sum.status();
    std::istringstream lines(testing_jobs::FileBytes(edited + "/checksums.sha256"));
    std::string line, renewed;
    while (std::getline(lines, line)) {
      if (absl::EndsWith(line, "  worker_state.safetensors"))
        line = *sum + "  worker_state.safetensors";
      renewed += line + "\n";
    }
    std::ofstream(edited + "/checksums.sha256", std::ios::trunc) << renewed;
    v1::JobSpec e = GaloreSpec(testing_jobs::TempDir("galore-e"), 6);
    e.set_resume_from(edited);
    testing_jobs::WatchResult damaged = testing_jobs::SubmitAndWatch(stub.get(), e);
    EXPECT_EQ(damaged.last.state(), v1::FAILED);
    EXPECT_NE(damaged.last.error().find("galore_step 9, past the checkpoint's step 3"),
              std::string::npos)
        << damaged.last.error();
  }

  // Another rank is another training: refused.
  v1::JobSpec c = GaloreSpec(testing_jobs::TempDir("galore-c"), 6);
  c.mutable_galore()->set_rank(4);
  c.set_resume_from(ckpt);
  testing_jobs::ExpectRefusedAsOtherTraining(stub.get(), c);
}

// Bad settings are refused naming the field: at submission, or at load for a rank above a
// matrix's smaller side; the runtime then runs the next job.
TEST(GaloreJobTest, BadSettingsAreRefusedByName) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  struct Case {
    std::string what;
    std::function<void(v1::JobSpec*)> edit;
    std::string needle;
  };
  const std::vector<Case> at_submit = {
      {"negative rank", [](v1::JobSpec* s) { s->mutable_galore()->set_rank(-1); }, "galore.rank"},
      {"negative gap", [](v1::JobSpec* s) { s->mutable_galore()->set_update_proj_gap(-2); },
       "galore.update_proj_gap"},
      {"nan scale", [](v1::JobSpec* s) { s->mutable_galore()->set_scale(std::nan("")); },
       "galore.scale"},
      {"galore in lsp mode", [](v1::JobSpec* s) { s->set_mode(v1::MODE_LSP); }, "mode galore"},
      // fp32 inf / 0 updates (found by a break-it pass: the job "succeeded" with NaN weights).
      {"overflowing scale", [](v1::JobSpec* s) { s->mutable_galore()->set_scale(1e39); },
       "galore.scale = 1e+39 is invalid: must be a normal fp32 number"},
      {"vanishing scale", [](v1::JobSpec* s) { s->mutable_galore()->set_scale(1e-300); },
       "normal fp32 number"},
      {"scale x lr above 1", [](v1::JobSpec* s) { s->mutable_galore()->set_scale(200); },
       "galore.scale x optim.lr = 2 is the step size and must be <= 1"},
  };
  for (const Case& c : at_submit) {
    v1::JobSpec spec = GaloreSpec(testing_jobs::TempDir("galore-bad"), 2);
    c.edit(&spec);
    testing_jobs::ExpectRefusedAtSubmit(stub.get(), spec, grpc::StatusCode::INVALID_ARGUMENT,
                                        c.needle, c.what);
  }
  // rank 40 > 32, the smaller side of k_proj (32 x 64): the job fails at load, naming it.
  v1::JobSpec wide = GaloreSpec(testing_jobs::TempDir("galore-wide"), 2);
  wide.mutable_galore()->set_rank(40);
  testing_jobs::WatchResult w = testing_jobs::SubmitAndWatch(stub.get(), wide);
  EXPECT_EQ(w.last.state(), v1::FAILED);
  EXPECT_NE(w.last.error().find("galore.rank = 40 is above the smaller side of "
                                "model.layers.0.self_attn.k_proj.weight (32 x 64)"),
            std::string::npos)
      << w.last.error();
  testing_jobs::WatchResult ok =
      testing_jobs::SubmitAndWatch(stub.get(), GaloreSpec(testing_jobs::TempDir("galore-ok"), 2));
  EXPECT_EQ(ok.last.state(), v1::SUCCEEDED) << ok.last.error();
}

}  // namespace
}  // namespace lspo
