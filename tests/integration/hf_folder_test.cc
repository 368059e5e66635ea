// A job's output folder is an HF model folder the product reads back: evaluate it (lspctl
// eval's RunEval), generate from it (RunGenerate), and fine-tune again from it (model.path =
// the folder, format detected). Also a job on a Hugging Face random Qwen2 folder made by
// transformers (tests/oracle/data/hf_models) trains end to end.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "client/model_tools.h"
#include "gtest/gtest.h"
#include "model/generate.h"
#include "model/hf_checkpoint.h"
#include "model/llama.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"
#include "offload/job_assets.h"
#include "scheduler/job_spec.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

using testing_jobs::SubmitAndWatch;
using testing_jobs::WatchResult;

nlohmann::json Summary(const std::string& dir) {
  std::ifstream in(dir + "/summary.json");
  EXPECT_TRUE(in.good()) << dir;
  return nlohmann::json::parse(in);
}

TEST(HfFolderTest, AJobsOutputIsEvaluatedGeneratedFromAndFineTunedAgain) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string out1 = testing_jobs::TempDir("hf-out1");
  const std::string out2 = testing_jobs::TempDir("hf-out2");
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  v1::JobSpec spec1 = testing_jobs::TinyMobyDickSpec(out1, v1::MODE_LSP, 3);
  WatchResult w1 = SubmitAndWatch(stub.get(), spec1);
  ASSERT_EQ(w1.last.state(), v1::SUCCEEDED) << w1.last.error();
  const double final1 = Summary(out1)["final_eval_loss"].get<double>();

  // The folder loads as an HF model of the tiny config, tokenizer included.
  EXPECT_TRUE(model::IsHfModelFolder(out1));
  auto tok_hf = model::BpeTokenizer::FromHfFolder(out1);
  ASSERT_TRUE(tok_hf.ok()) << tok_hf.status();
  v1::JobSpec resolved1 = spec1;
  scheduler::ResolveDefaults(&resolved1);
  auto tok_gguf = offload::LoadJobTokenizer(resolved1);
  ASSERT_TRUE(tok_gguf.ok()) << tok_gguf.status();
  const std::string sample = "Call me Ishmael. Some years ago—never mind how long precisely 1851.";
  EXPECT_EQ(tok_hf->Encode(sample), tok_gguf->Encode(sample));

  // lspctl eval on the folder: the job's own final evaluation (same data, same code; the
  // folder holds the optimizer's fp32 master weights, which the worker's copy tracks).
  client::EvalCommand eval;
  eval.model = out1;
  eval.data = testing_jobs::MobyDickPath();
  eval.format = "text";
  eval.seq_len = 32;
  eval.max_examples = 8;
  eval.num_threads = 2;
  auto metrics = client::RunEval(eval);
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_EQ(metrics->examples(), 8);
  EXPECT_NEAR(metrics->loss(), final1, 1e-4 * final1)
      << "eval of the output folder vs the job's final evaluation";

  // lspctl generate on the folder: greedy text, the same ids as Generate on the loaded model.
  client::GenerateCommand gen;
  gen.model = out1;
  gen.prompt = "Call me Ishmael.";
  gen.max_new_tokens = 8;
  gen.num_threads = 2;
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  ASSERT_TRUE(client::RunGenerate(gen, out, err).ok());
  std::rewind(err);
  char line[256] = {0};
  ASSERT_NE(std::fgets(line, sizeof(line), err), nullptr);
  EXPECT_NE(std::string(line).find("tokens/s"), std::string::npos) << line;
  std::fclose(out);
  std::fclose(err);
  auto ckpt = model::HfCheckpoint::Open(out1);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto m = model::LlamaModel::FromHfCheckpoint(*ckpt);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->config().hidden_size, 64);

  // Fine-tune again from the folder: format detected, tokenizer from the folder; its
  // zero-shot evaluation is job 1's final one.
  v1::JobSpec spec2 = testing_jobs::TinyMobyDickSpec(out2, v1::MODE_LSP, 2);
  spec2.mutable_model()->clear_format();
  spec2.mutable_model()->set_path(out1);
  spec2.mutable_model()->clear_tokenizer_path();
  WatchResult w2 = SubmitAndWatch(stub.get(), spec2);
  ASSERT_EQ(w2.last.state(), v1::SUCCEEDED) << w2.last.error();
  const nlohmann::json s2 = Summary(out2);
  EXPECT_NEAR(s2["zero_shot_eval_loss"].get<double>(), final1, 1e-4 * final1);
  EXPECT_TRUE(model::IsHfModelFolder(out2));
}

// lspctl generate's inputs: conversations through the folder's ChatML template (Qwen2 folder)
// and the refusals: both or neither of prompt and chat, a malformed line (file:line named), a
// template that is not recognised (the Mistral folder's [INST] template).
TEST(HfFolderTest, GenerateReadsConversationsAndRefusesBadInput) {
  const std::string chat = testing_jobs::TempDir("chat") + "/chat.jsonl";
  std::ofstream(chat) << R"({"messages":[{"role":"user","content":"Call me Ishmael."}]})" "\n"
                      << R"({"messages":[{"role":"system","content":"Be brief."},)"
                      << R"({"role":"user","content":"The sea"}]})" "\n";
  client::GenerateCommand g;
  g.model = "tests/oracle/data/hf_models/qwen2-job";
  g.chat_file = chat;
  g.max_new_tokens = 4;
  g.num_threads = 2;
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  absl::Status st = client::RunGenerate(g, out, err);
  EXPECT_TRUE(st.ok()) << st;
  std::rewind(out);
  std::string text;
  for (int c; (c = std::fgetc(out)) != EOF;) text.push_back(static_cast<char>(c));
  EXPECT_NE(text.find("--- reply 2"), std::string::npos) << text;
  std::fclose(out);
  std::fclose(err);

  g.prompt = "both";
  EXPECT_EQ(client::RunGenerate(g, stdout, stderr).code(), absl::StatusCode::kInvalidArgument);
  g.prompt.clear();
  const std::string bad = testing_jobs::TempDir("chat") + "/bad.jsonl";
  std::ofstream(bad) << R"({"messages":[{"role":"user","content":"ok"}]})" "\n"
                     << R"({"messages":[{"role":"user"}]})" "\n";
  g.chat_file = bad;
  st = client::RunGenerate(g, stdout, stderr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find(bad + ":2"), std::string::npos) << st;
  g.model = "tests/oracle/data/hf_models/mistral-job";
  g.chat_file = chat;
  st = client::RunGenerate(g, stdout, stderr);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  EXPECT_NE(std::string(st.message()).find("ChatML"), std::string::npos) << st;

  // A prompt past max_position_embeddings (256) is refused, naming the limit.
  client::GenerateCommand longer;
  longer.model = "tests/oracle/data/hf_models/qwen2-job";
  longer.max_new_tokens = 250;
  longer.prompt = "Call me Ishmael. Some years ago, never mind how long precisely.";
  st = client::RunGenerate(longer, stdout, stderr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("max_position_embeddings 256"), std::string::npos)
      << st;
  // Paths: missing, a folder that is not a model, a file that is not a GGUF.
  longer.max_new_tokens = 4;
  for (const std::string& bad_model :
       {std::string("no/such/model"), std::string("tests/oracle/data/hf_models"),
        std::string("tests/oracle/data/hf_models/qwen2-job/config.json")}) {
    longer.model = bad_model;
    st = client::RunGenerate(longer, stdout, stderr);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(std::string(st.message()).find("--model '" + bad_model), std::string::npos) << st;
  }
  // A tokenizer with more ids (6072) than the model's embedding rows (320): refused at load
  // by generate and by a job's worker (eval), naming both.
  const std::string mism = testing_jobs::TempDir("mism");
  std::filesystem::copy("tests/oracle/data/hf_models/llama-fp32", mism,
                        std::filesystem::copy_options::recursive |
                            std::filesystem::copy_options::overwrite_existing);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    std::filesystem::copy_file(std::string("tests/oracle/data/hf_models/llama-job/") + f,
                               mism + "/" + f);
  }
  longer.model = mism;
  st = client::RunGenerate(longer, stdout, stderr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find("6072 ids"), std::string::npos) << st;
  client::EvalCommand eval;
  eval.model = mism;
  eval.data = testing_jobs::MobyDickPath();
  eval.format = "text";
  auto m = client::RunEval(eval);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_NE(std::string(m.status().message()).find("vocab_size 320"), std::string::npos)
      << m.status();
  eval.data = "no/such/data.txt";
  m = client::RunEval(eval);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
  EXPECT_NE(std::string(m.status().message()).find("--data"), std::string::npos) << m.status();
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

class HfFamilyJobTest : public ::testing::TestWithParam<std::string> {};

// `lspctl run` on a folder of each family made by transformers (random weights, the family's
// tokenizer trained by `tokenizers`): the job trains in lsp mode, the evaluation loss falls,
// and the output folder is the same family with the same tokenizer files.
TEST_P(HfFamilyJobTest, FineTunesAnHfFolderEndToEnd) {
  const std::string folder = "tests/oracle/data/hf_models/" + GetParam() + "-job";
  const std::string out = testing_jobs::TempDir("hf-" + GetParam());
  v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(out, v1::MODE_LSP, 20);
  spec.mutable_model()->clear_format();
  spec.mutable_model()->set_path(folder);
  spec.mutable_model()->clear_tokenizer_path();
  spec.mutable_lsp()->set_d(8);
  spec.mutable_lsp()->set_r(2);
  spec.mutable_optim()->set_lr(1e-2);
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  WatchResult w = SubmitAndWatch(stub.get(), spec);
  ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  const nlohmann::json s = Summary(out);
  EXPECT_LT(s["final_eval_loss"].get<double>(), s["zero_shot_eval_loss"].get<double>() - 0.05)
      << s.dump();
  std::ifstream in_cfg(folder + "/config.json"), out_cfg(out + "/config.json");
  const nlohmann::json a = nlohmann::json::parse(in_cfg), b = nlohmann::json::parse(out_cfg);
  EXPECT_EQ(a["architectures"], b["architectures"]);
  EXPECT_EQ(a["tie_word_embeddings"], b["tie_word_embeddings"]);
  EXPECT_EQ(ReadAll(folder + "/tokenizer.json"), ReadAll(out + "/tokenizer.json"));
  EXPECT_EQ(ReadAll(folder + "/generation_config.json"), ReadAll(out + "/generation_config.json"));
  auto ckpt = model::HfCheckpoint::Open(out);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto m = model::LlamaModel::FromHfCheckpoint(*ckpt);
  ASSERT_TRUE(m.ok()) << m.status();
  auto in_ckpt = model::HfCheckpoint::Open(folder);
  ASSERT_TRUE(in_ckpt.ok());
  EXPECT_EQ(ckpt->TensorNames(), in_ckpt->TensorNames());  // biases and heads kept
}

INSTANTIATE_TEST_SUITE_P(Families, HfFamilyJobTest,
                         ::testing::Values("llama", "qwen2", "mistral"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lspo
