// mode: lora end to end (gpu_worker/lora_path.cc, baselines/lora.h): a job on the tiny Llama
// trains only its adapters, writes the merged model and a PEFT adapter folder that reproduce
// each other, resumes bitwise from a checkpoint, and refuses bad settings by name.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "baselines/lora.h"
#include "client/model_tools.h"
#include "gtest/gtest.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "offload/job_assets.h"
#include "spec/job_spec.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

namespace fs = std::filesystem;

v1::JobSpec LoraSpec(const std::string& out, int steps) {
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(out, v1::MODE_LORA, steps);
  spec.mutable_lora()->set_r(4);
  spec.mutable_lora()->set_alpha(8);
  spec.set_grad_accum(2);
  spec.set_skip_initial_eval(true);
  spec.mutable_data()->set_max_eval_examples(2);
  return spec;
}

nlohmann::json ReadJson(const std::string& path) {
  return nlohmann::json::parse(testing_jobs::FileBytes(path));
}

// The job trains: the loss falls, only r (m + n) numbers per matrix are trainable, and the
// output's merged model.safetensors equals base + scaling B A from its PEFT adapter folder,
// with every other tensor the base model's own.
TEST(LoraJobTest, TrainsTheAdaptersAndWritesTheMergedModelAndAPeftFolder) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string dir = testing_jobs::TempDir("lora-job");
  v1::JobSpec spec = LoraSpec(dir, 8);
  spec.mutable_lora()->add_target_modules("q_proj");
  spec.mutable_lora()->add_target_modules("v_proj");
  spec.mutable_lora()->add_target_modules("down_proj");
  spec.mutable_optim()->set_lr(2e-2);
  testing_jobs::WatchResult w = testing_jobs::SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  std::map<int, double> loss = testing_jobs::StepLosses(w);
  ASSERT_EQ(loss.size(), 8u);
  EXPECT_LT(loss[8], loss[1] - 0.05) << "the adapters did not train";

  const nlohmann::json summary = ReadJson(dir + "/summary.json");
  EXPECT_EQ(summary["mode"], "lora");
  EXPECT_EQ(summary["lora_r"], 4);
  EXPECT_EQ(summary["lora_target_modules"], nlohmann::json({"q_proj", "v_proj", "down_proj"}));
  // Tiny Llama: hidden 64, intermediate 128, 4 heads of 16, 2 kv heads: q 64x64, v 32x64,
  // down 64x128; two layers.
  EXPECT_EQ(summary["trainable_parameters"], 2 * 4 * ((64 + 64) + (32 + 64) + (64 + 128)));

  // The adapter folder loads onto the base model (the spec's, rebuilt) ...
  v1::JobSpec resolved = spec;
  spec::ResolveDefaults(&resolved);
  auto base = offload::LoadJobModel(resolved);
  ASSERT_TRUE(base.ok()) << base.status();
  auto adapter = baselines::ReadPeftAdapter(dir + "/adapter", *base);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  EXPECT_DOUBLE_EQ((*adapter)->scaling(), 2.0);
  const nlohmann::json config = ReadJson(dir + "/adapter/adapter_config.json");
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  // ... and the merged model is base + scaling B A, the rest the base model's.
  auto merged = model::SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(merged.ok()) << merged.status();
  int changed = 0;
  for (const auto& [name, t] : base->NamedTensors()) {
    auto values = merged->ReadF32(name);
    ASSERT_TRUE(values.ok()) << name;
    at::Tensor got = torch::from_blob(values->data(), t.sizes(), at::kFloat).clone();
    int64_t i = -1;
    for (int64_t k = 0; k < base->num_linears(); ++k) {
      if (base->LinearName(k) == name) i = k;
    }
    if (i >= 0 && (*adapter)->targets(i)) {
      const at::Tensor want = (*adapter)->MergedWeight(i, t);
      EXPECT_TRUE(at::allclose(got, want, 0, 1e-6)) << name;
      EXPECT_GT((got - t).abs().max().item<double>(), 1e-4) << name << " did not change";
      ++changed;
    } else {
      EXPECT_TRUE(at::equal(got, t.to(at::kFloat))) << name << " is not the base model's";
    }
  }
  EXPECT_EQ(changed, 6);
  // A tiny-random base has no model folder: base_model_name_or_path is empty (an HF folder's
  // is written as an absolute path, docs/baselines.md).
  EXPECT_EQ(config["base_model_name_or_path"], "");

  // The output folder reused by a job of another mode keeps no stale adapter.
  v1::JobSpec native = testing_jobs::TinyMobyDickSpec(dir, v1::MODE_NATIVE, 1);
  native.set_skip_initial_eval(true);
  testing_jobs::WatchResult nw = testing_jobs::SubmitAndWatch(stub.get(), native);
  ASSERT_EQ(nw.last.state(), v1::SUCCEEDED) << nw.last.error();
  EXPECT_FALSE(fs::exists(dir + "/adapter/adapter_model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/adapter"));
}

// On an HF model folder: `lspctl eval` of the base with the job's adapter (--adapter, i.e.
// model.adapter_path) gives the merged output's numbers, and the adapter folder given as
// --model is refused with the fix.
TEST(LoraJobTest, EvalOfBasePlusAdapterEqualsTheMergedOutput) {
  const std::string base = "tests/oracle/data/hf_models/llama-job";
  const std::string dir = testing_jobs::TempDir("lora-hf");
  v1::JobSpec spec = LoraSpec(dir, 6);
  spec.mutable_model()->clear_format();
  spec.mutable_model()->set_path(base);
  spec.mutable_model()->clear_tokenizer_path();
  // The base is bf16, so is its merged output by default; fp32 keeps the comparison exact.
  spec.set_save_dtype(v1::WEIGHT_DTYPE_FP32);
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  testing_jobs::WatchResult w = testing_jobs::SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  // base_model_name_or_path is absolute, so PEFT finds the base from anywhere.
  const nlohmann::json config = ReadJson(dir + "/adapter/adapter_config.json");
  EXPECT_EQ(config["base_model_name_or_path"], fs::absolute(base).lexically_normal().string());
  client::EvalCommand merged;
  merged.model = dir;
  merged.data = testing_jobs::MobyDickPath();
  merged.format = "text";
  merged.seq_len = 32;
  merged.max_examples = 8;
  merged.num_threads = 2;
  client::EvalCommand with_adapter = merged;
  with_adapter.model = base;
  with_adapter.adapter = dir + "/adapter";
  client::EvalCommand plain = with_adapter;
  plain.adapter.clear();
  auto a = client::RunEval(merged), b = client::RunEval(with_adapter), c = client::RunEval(plain);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok()) << a.status() << b.status() << c.status();
  EXPECT_NEAR(b->loss(), a->loss(), 1e-6 * a->loss());
  EXPECT_GT(std::abs(c->loss() - a->loss()), 1e-3) << "the adapter changed nothing";
  client::EvalCommand wrong = merged;
  wrong.model = dir + "/adapter";
  auto d = client::RunEval(wrong);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << d.status();
  EXPECT_NE(std::string(d.status().message()).find("is a PEFT adapter folder"), std::string::npos)
      << d.status();
}

// Stopped at step 3 and resumed from its checkpoint, the job gives bitwise the losses, the
// merged model and the adapter of the uninterrupted run (the AdamW state and the adapters
// are in the checkpoint).
TEST(LoraJobTest, ResumedAtStep3MatchesTheUninterruptedRunBitwise) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  const std::string a_dir = testing_jobs::TempDir("lora-a");
  v1::JobSpec a = LoraSpec(a_dir, 6);
  a.set_checkpoint_every(3);
  testing_jobs::WatchResult full = testing_jobs::SubmitAndWatch(stub.get(), a);
  ASSERT_EQ(full.last.state(), v1::SUCCEEDED) << full.last.error();
  const std::string ckpt = a_dir + "/checkpoints/step-00000003";
  ASSERT_TRUE(fs::exists(ckpt + "/worker_adamw.pt"));
  auto state = model::SafetensorsFile::Open(ckpt + "/worker_state.safetensors");
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_NE(state->Find("model.layers.1.mlp.down_proj.weight.lora_B"), nullptr);

  // The checkpoint's adapter folder is checksummed like its other files.
  EXPECT_NE(testing_jobs::FileBytes(ckpt + "/checksums.sha256")
                .find("  adapter/adapter_model.safetensors\n"),
            std::string::npos);

  const std::string b_dir = testing_jobs::TempDir("lora-b");
  v1::JobSpec b = LoraSpec(b_dir, 6);
  b.set_resume_from(ckpt);
  // The same targets listed in another order are the same training.
  for (const char* m :
       {"down_proj", "up_proj", "gate_proj", "o_proj", "v_proj", "k_proj", "q_proj"}) {
    b.mutable_lora()->add_target_modules(m);
  }
  testing_jobs::WatchResult resumed = testing_jobs::SubmitAndWatch(stub.get(), b);
  testing_jobs::ExpectResumedBitwise(full, a_dir, resumed, b_dir, 3, 6);  // merged models
  EXPECT_TRUE(testing_jobs::FileBytes(a_dir + "/adapter/adapter_model.safetensors") ==
              testing_jobs::FileBytes(b_dir + "/adapter/adapter_model.safetensors"))
      << "adapters differ";
  // A lora checkpoint does not resume a job of another rank.
  v1::JobSpec c = LoraSpec(testing_jobs::TempDir("lora-c"), 6);
  c.mutable_lora()->set_r(2);
  c.set_resume_from(ckpt);
  testing_jobs::ExpectRefusedAsOtherTraining(stub.get(), c);
  // A modified adapter file in the checkpoint is found by its checksum.
  const std::string bad_ckpt = testing_jobs::TempDir("lora-bad-ckpt") + "/step-00000003";
  fs::copy(ckpt, bad_ckpt, fs::copy_options::recursive);
  std::ofstream(bad_ckpt + "/adapter/adapter_config.json", std::ios::app) << " ";
  v1::JobSpec d = LoraSpec(testing_jobs::TempDir("lora-d"), 6);
  d.set_resume_from(bad_ckpt);
  testing_jobs::WatchResult corrupt = testing_jobs::SubmitAndWatch(stub.get(), d);
  EXPECT_EQ(corrupt.last.state(), v1::FAILED);
  EXPECT_NE(corrupt.last.error().find("adapter/adapter_config.json' does not match its SHA-256"),
            std::string::npos)
      << corrupt.last.error();
}

// Bad settings are refused naming the field: at submission (r < 0, an unknown module, an
// overflowing scaling, lora settings in another mode) or at load (a rank above a matrix's smaller
// side); the runtime then runs the next job.
TEST(LoraJobTest, BadSettingsAreRefusedByName) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  struct Case {
    std::string what;
    std::function<void(v1::JobSpec*)> edit;
    std::string needle;
  };
  const std::vector<Case> at_submit = {
      {"zero rank", [](v1::JobSpec* s) { s->mutable_lora()->set_r(-1); }, "lora.r"},
      {"unknown module", [](v1::JobSpec* s) { s->mutable_lora()->add_target_modules("lm_head"); },
       "lora.target_modules"},
      {"lora in lsp mode", [](v1::JobSpec* s) { s->set_mode(v1::MODE_LSP); }, "mode lora"},
      {"overflowing scaling", [](v1::JobSpec* s) { s->mutable_lora()->set_alpha(1e300); },
       "not a normal fp32 number"},
  };
  for (const Case& c : at_submit) {
    v1::JobSpec spec = LoraSpec(testing_jobs::TempDir("lora-bad"), 2);
    c.edit(&spec);
    testing_jobs::ExpectRefusedAtSubmit(stub.get(), spec, grpc::StatusCode::INVALID_ARGUMENT,
                                        c.needle, c.what);
  }
  {  // model.adapter_path must be an adapter folder.
    v1::JobSpec spec = LoraSpec(testing_jobs::TempDir("lora-bad"), 2);
    spec.mutable_model()->set_adapter_path("/no/such/adapter");
    grpc::ClientContext ctx;
    v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    v1::SubmitJobReply rep;
    grpc::Status st = stub->SubmitJob(&ctx, req, &rep);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
    EXPECT_NE(st.error_message().find("model.adapter_path"), std::string::npos)
        << st.error_message();
  }
  // r = 40 > 32, the smaller side of k_proj (32 x 64): the job fails at load, naming it.
  v1::JobSpec wide = LoraSpec(testing_jobs::TempDir("lora-wide"), 2);
  wide.mutable_lora()->set_r(40);
  testing_jobs::WatchResult w = testing_jobs::SubmitAndWatch(stub.get(), wide);
  EXPECT_EQ(w.last.state(), v1::FAILED);
  EXPECT_NE(w.last.error().find("lora"), std::string::npos) << w.last.error();
  EXPECT_NE(w.last.error().find("model.layers.0.self_attn.k_proj.weight (32 x 64): use r <= 32"),
            std::string::npos)
      << w.last.error();
  testing_jobs::WatchResult ok =
      testing_jobs::SubmitAndWatch(stub.get(), LoraSpec(testing_jobs::TempDir("lora-ok"), 2));
  EXPECT_EQ(ok.last.state(), v1::SUCCEEDED) << ok.last.error();
}

}  // namespace
}  // namespace lspo
