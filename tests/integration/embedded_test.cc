// Embedded mode end to end: the three services in one process (in-process gRPC), a tiny
// randomly initialised Llama (seeded) trained on Moby-Dick blocks in lsp mode; plus the
// bad-input cases that must fail clearly without crashing.
#include <fstream>
#include <set>

#include "client/embedded.h"
#include "offload/job_assets.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/rpc_status.h"
#include "scheduler/job_spec.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

using testing_jobs::SubmitAndWatch;
using testing_jobs::WatchResult;

TEST(EmbeddedTest, TinyLlamaLspTrainsOnMobyDickAndReportsEveryStep) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string out_dir = testing_jobs::TempDir("embedded-lsp");
  client::EmbeddedRuntime runtime;
  auto stub = v1::Scheduler::NewStub(runtime.scheduler_channel());
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(out_dir, v1::MODE_LSP, 20);
  WatchResult w = SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  // Every step 1..20 was reported by the status stream, each with its loss.
  std::map<int, double> loss;
  for (const auto& u : w.updates) {
    if (u.has_last_step()) loss[u.last_step().step()] = u.last_step().loss();
  }
  ASSERT_EQ(loss.size(), 20u);
  EXPECT_EQ(loss.begin()->first, 1);
  EXPECT_EQ(loss.rbegin()->first, 20);
  double first = 0, last = 0;
  for (int s = 1; s <= 5; ++s) first += loss[s] / 5;
  for (int s = 16; s <= 20; ++s) last += loss[s] / 5;
  EXPECT_LT(last, first - 0.05) << "loss did not decrease: first-5 mean " << first
                                << ", last-5 mean " << last;
  // A random 49152-vocabulary model starts near ln(49152) = 10.80.
  EXPECT_NEAR(loss[1], std::log(49152.0), 0.3);
  // Outputs: metrics.jsonl with one line per step, summary.json, checkpoint files.
  std::ifstream metrics(out_dir + "/metrics.jsonl");
  int step_lines = 0;
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    step_lines += j["kind"] == "step";
  }
  EXPECT_EQ(step_lines, 20);
  std::ifstream sfile(out_dir + "/summary.json");
  ASSERT_TRUE(sfile.good());
  auto summary = nlohmann::json::parse(sfile);
  EXPECT_EQ(summary["mode"], "lsp");
  EXPECT_EQ(summary["d"], 16);
  EXPECT_EQ(summary["steps"], 20);
  EXPECT_LT(summary["final_eval_loss"].get<double>(), summary["zero_shot_eval_loss"].get<double>());
  for (const char* f : {"model.safetensors", "config.json", "tokenizer.json"}) {
    EXPECT_TRUE(std::ifstream(out_dir + "/" + f).good()) << f;
  }
}

TEST(EmbeddedTest, NativeModeTrainsTheSameJob) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string out_dir = testing_jobs::TempDir("embedded-native");
  client::EmbeddedRuntime runtime;
  auto stub = v1::Scheduler::NewStub(runtime.scheduler_channel());
  WatchResult w =
      SubmitAndWatch(stub.get(), testing_jobs::TinyMobyDickSpec(out_dir, v1::MODE_NATIVE, 10));
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  ASSERT_EQ(w.last.step(), 10);
  ASSERT_GE(w.last.evals_size(), 2);
  EXPECT_LT(w.last.evals(w.last.evals_size() - 1).loss(), w.last.evals(0).loss());
}

TEST(EmbeddedTest, SubspaceTooLargeForALayerFailsTheJobWithAClearError) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  client::EmbeddedRuntime runtime;
  auto stub = v1::Scheduler::NewStub(runtime.scheduler_channel());
  v1::JobSpec spec =
      testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("bad-d"), v1::MODE_LSP, 2);
  spec.mutable_lsp()->set_d(40);  // The tiny model's k_proj is 32 x 64: d must be < 32.
  WatchResult w = SubmitAndWatch(stub.get(), spec);
  EXPECT_EQ(w.last.state(), v1::FAILED);
  EXPECT_NE(w.last.error().find("lsp.d = 40"), std::string::npos) << w.last.error();
  EXPECT_NE(w.last.error().find("k_proj"), std::string::npos) << w.last.error();
  EXPECT_NE(w.last.error().find("d < min(m, n) = 32"), std::string::npos) << w.last.error();
  // The runtime is still usable: a good job runs after the bad one.
  WatchResult ok = SubmitAndWatch(
      stub.get(), testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("after-bad"),
                                                 v1::MODE_LSP, 2));
  EXPECT_EQ(ok.last.state(), v1::SUCCEEDED) << ok.last.error();
}

TEST(EmbeddedTest, MissingDataFileIsRejectedAtSubmit) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  client::EmbeddedRuntime runtime;
  auto stub = v1::Scheduler::NewStub(runtime.scheduler_channel());
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(testing_jobs::TempDir("missing"),
                                                    v1::MODE_LSP, 2);
  spec.mutable_data()->set_train_path("/nonexistent/train.txt");
  grpc::ClientContext ctx;
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  v1::SubmitJobReply rep;
  grpc::Status st = stub->SubmitJob(&ctx, req, &rep);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find("data.train_path"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("/nonexistent/train.txt"), std::string::npos);
}

// model.random_shape (scaling studies): the HF sizes give the published parameter counts
// (SmolLM2-135M: 134,515,008, docs/formats.md; SmolLM2-360M: 361,821,120, the HF model card's
// 362M), and a bad shape is rejected naming the field.
TEST(JobSpecTest, RandomShapeGivesTheRequestedLlamaConfig) {
  v1::LlamaShape s135;
  s135.set_hidden_size(576);
  s135.set_intermediate_size(1536);
  s135.set_num_hidden_layers(30);
  s135.set_num_attention_heads(9);
  s135.set_num_key_value_heads(3);
  auto c135 = offload::RandomLlamaConfig(s135, 49152);
  ASSERT_TRUE(c135.ok()) << c135.status();
  EXPECT_EQ(c135->head_dim, 64);
  EXPECT_EQ(c135->NumParameters(), 134515008);
  v1::LlamaShape s360;
  s360.set_hidden_size(960);
  s360.set_intermediate_size(2560);
  s360.set_num_hidden_layers(32);
  s360.set_num_attention_heads(15);
  s360.set_num_key_value_heads(5);
  auto c360 = offload::RandomLlamaConfig(s360, 49152);
  ASSERT_TRUE(c360.ok()) << c360.status();
  EXPECT_EQ(c360->NumParameters(), 361821120);
  // Unset = the tiny test config.
  auto tiny = offload::RandomLlamaConfig(v1::LlamaShape(), 300);
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->hidden_size, 64);
  s360.set_num_key_value_heads(4);  // does not divide 15 heads
  auto bad = offload::RandomLlamaConfig(s360, 49152);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("model.random_shape"), std::string::npos)
      << bad.status();
}

TEST(JobSpecTest, YamlAndJsonGiveTheSameSpecAndBadFieldsAreNamed) {
  auto y = scheduler::ParseJobSpecYaml(
      "name: t\nmode: MODE_LSP\nsteps: 7\nlsp:\n  d: 64\n  r: 8\noptim:\n  lr: 2.5e-4\n"
      "data:\n  train_path: a.tsv\n");
  ASSERT_TRUE(y.ok()) << y.status();
  auto j = scheduler::ParseJobSpecJson(
      R"({"name":"t","mode":"MODE_LSP","steps":7,"lsp":{"d":64,"r":8},"optim":{"lr":0.00025},)"
      R"("data":{"trainPath":"a.tsv"}})");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(y->SerializeAsString(), j->SerializeAsString());
  EXPECT_EQ(y->lsp().d(), 64);
  EXPECT_DOUBLE_EQ(y->optim().lr(), 2.5e-4);
  auto short_mode = scheduler::ParseJobSpecYaml("mode: native\nsteps: 1\n");
  ASSERT_TRUE(short_mode.ok()) << short_mode.status();
  EXPECT_EQ(short_mode->mode(), v1::MODE_NATIVE);
  auto bad_mode = scheduler::ParseJobSpecYaml("mode: adam\n");
  EXPECT_EQ(bad_mode.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad = scheduler::ParseJobSpecYaml("stepz: 3\n");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("stepz"), std::string::npos) << bad.status();
  v1::JobSpec spec = *y;
  scheduler::ResolveDefaults(&spec);
  spec.mutable_lsp()->set_r(100);
  auto st = scheduler::ValidateJobSpec(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  // The GPU fields: a kernel set or device that does not exist is named with the fix.
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  v1::JobSpec gpu = testing_jobs::TinyMobyDickSpec("/tmp/lspo-spec-check", v1::MODE_LSP, 2);
  scheduler::ResolveDefaults(&gpu);
  gpu.mutable_lsp()->set_kernels("custom");
  gpu.set_device("cuda");
  ASSERT_TRUE(scheduler::ValidateJobSpec(gpu).ok()) << scheduler::ValidateJobSpec(gpu);
  gpu.mutable_lsp()->set_kernels("cusparse");
  st = scheduler::ValidateJobSpec(gpu);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("lsp.kernels"), std::string::npos) << st;
  EXPECT_NE(st.message().find("custom"), std::string::npos) << st;
  gpu.mutable_lsp()->set_kernels("custom");
  gpu.set_device("tpu");
  st = scheduler::ValidateJobSpec(gpu);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("device"), std::string::npos) << st;
}

}  // namespace
}  // namespace lspo
