// A job's output folder is an HF model folder the product reads back: evaluate it (lspctl
// eval's RunEval), generate from it (RunGenerate), and fine-tune again from it (model.path =
// the folder, format detected). Also a job on a Hugging Face random Qwen2 folder made by
// transformers (tests/oracle/data/hf_models) trains end to end, and lspctl convert (RunConvert)
// writes the real SmolLM2 GGUF as such a folder that loads bit-identical to the GGUF.
#include "third_party/torch/torch_api.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "client/model_tools.h"
#include "gtest/gtest.h"
#include "model/generate.h"
#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "offload/job_assets.h"
#include "spec/job_spec.h"
#include "tests/integration/start_embedded.h"
#include "tests/integration/test_jobs.h"
#include "tests/test_files.h"
#include "text/tokenizer.h"

namespace lspo {
namespace {

using ::lspo::tests::ReadAll;

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
  spec::ResolveDefaults(&resolved1);
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
  // Mistral's [INST] template (SentencePiece tokenizer) runs too; a template that raises
  // names the chat file and the conversation.
  g.model = "tests/oracle/data/hf_models/mistral-job";
  g.chat_file = chat;
  st = client::RunGenerate(g, stdout, stderr);
  EXPECT_TRUE(st.ok()) << st;
  g.chat_template = "{{ raise_exception('roles must alternate') }}";
  st = client::RunGenerate(g, stdout, stderr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(std::string(st.message()).find(chat + ": conversation 1"), std::string::npos) << st;
  EXPECT_NE(std::string(st.message()).find("roles must alternate"), std::string::npos) << st;
  g.chat_template.clear();

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

// save_dtype: a job on a bf16 folder writes its model in bf16 (unset: the input's dtype, as
// transformers' save_pretrained keeps it), each tensor the fp32 master rounded to nearest even
// once: bit for bit what torch's fp32 -> bf16 conversion gives of the same job's fp32 output
// (save_dtype: fp32, on request).
TEST(HfFolderTest, ABf16InputIsSavedInBf16AndFp32OnRequest) {
  const std::string base = "tests/oracle/data/hf_models/llama-job";  // config.json: bfloat16
  auto runtime = testing_jobs::StartEmbedded();
  auto stub = v1::Scheduler::NewStub(runtime->scheduler_channel());
  std::string out[2];
  for (int k = 0; k < 2; ++k) {
    out[k] = testing_jobs::TempDir(k == 0 ? "save-bf16" : "save-fp32");
    v1::JobSpec spec = testing_jobs::TinyMobyDickSpec(out[k], v1::MODE_LSP, 2);
    spec.mutable_model()->clear_format();
    spec.mutable_model()->set_path(base);
    spec.mutable_model()->clear_tokenizer_path();
    spec.set_skip_initial_eval(true);
    if (k == 1) spec.set_save_dtype(v1::WEIGHT_DTYPE_FP32);
    WatchResult w = SubmitAndWatch(stub.get(), spec);
    ASSERT_EQ(w.last.state(), v1::SUCCEEDED) << w.last.error();
  }
  std::ifstream config(out[0] + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(config)["torch_dtype"], "bfloat16");
  auto bf16 = model::SafetensorsFile::Open(out[0] + "/model.safetensors");
  auto fp32 = model::SafetensorsFile::Open(out[1] + "/model.safetensors");
  ASSERT_TRUE(bf16.ok() && fp32.ok()) << bf16.status() << fp32.status();
  int tensors = 0;
  for (const std::string& name : fp32->names()) {
    const model::SafetensorsTensorInfo* a = bf16->Find(name);
    const model::SafetensorsTensorInfo* b = fp32->Find(name);
    ASSERT_NE(a, nullptr) << name;
    EXPECT_EQ(a->dtype, "BF16") << name;
    EXPECT_EQ(b->dtype, "F32") << name;
    auto got = bf16->ReadF32(name);
    auto master = fp32->ReadF32(name);
    ASSERT_TRUE(got.ok() && master.ok()) << name;
    const at::Tensor want =
        torch::from_blob(master->data(), {static_cast<int64_t>(master->size())}, at::kFloat)
            .to(at::kBFloat16)
            .to(at::kFloat);
    const at::Tensor have =
        torch::from_blob(got->data(), {static_cast<int64_t>(got->size())}, at::kFloat);
    EXPECT_TRUE(at::equal(have, want)) << name;
    ++tensors;
  }
  EXPECT_GT(tensors, 10);
  EXPECT_LT(std::filesystem::file_size(out[0] + "/model.safetensors"),
            std::filesystem::file_size(out[1] + "/model.safetensors") * 0.51);
}

// The entries of folder `dir`, sorted.
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// lspctl convert on the real SmolLM2 GGUF: the folder holds the files of a job's output (fp32
// weights, the GGUF's chat template), loads through the HF path to the same tensors and logits
// as FromGguf, and its tokenizer.json encodes as the GGUF tokenizer does.
TEST(ConvertTest, SmolLm2GgufBecomesAnHfFolderIdenticalToIt) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string parent = testing_jobs::TempDir("convert");
  const std::string out = parent + "/smollm2";
  client::ConvertCommand cmd;
  cmd.model = testing_jobs::kModel;
  cmd.output_dir = out;
  cmd.num_threads = 2;
  absl::Status st = client::RunConvert(cmd);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_EQ(Entries(parent), std::vector<std::string>{"smollm2"});  // no temporary left
  EXPECT_EQ(Entries(out),
            (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                      "special_tokens_map.json", "tokenizer.json",
                                      "tokenizer_config.json"}));
  EXPECT_TRUE(model::IsHfModelFolder(out));

  auto gguf = model::GgufFile::Open(testing_jobs::kModel);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto from_gguf = model::LlamaModel::FromGguf(*gguf);
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status();
  auto ckpt = model::HfCheckpoint::Open(out);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto from_hf = model::LlamaModel::FromHfCheckpoint(*ckpt);
  ASSERT_TRUE(from_hf.ok()) << from_hf.status();
  EXPECT_EQ(from_hf->config().NumParameters(), 134515008);
  auto weights = model::SafetensorsFile::Open(out + "/model.safetensors");
  ASSERT_TRUE(weights.ok()) << weights.status();
  const auto a = from_gguf->NamedTensors(), b = from_hf->NamedTensors();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
    const model::SafetensorsTensorInfo* info = weights->Find(a[i].first);
    ASSERT_NE(info, nullptr) << a[i].first;
    EXPECT_EQ(info->dtype, "F32") << a[i].first;
  }
  {
    at::NoGradGuard no_grad;
    at::Tensor ids =
        torch::tensor({1, 9690, 198, 2683, 359, 253, 5356}, torch::kLong).view({1, 7});
    EXPECT_TRUE(at::equal(from_gguf->Logits(ids), from_hf->Logits(ids)));
  }

  auto tok_gguf = model::BpeTokenizer::FromGguf(*gguf);
  ASSERT_TRUE(tok_gguf.ok()) << tok_gguf.status();
  auto tok_hf = model::BpeTokenizer::FromHfFolder(out);
  ASSERT_TRUE(tok_hf.ok()) << tok_hf.status();
  for (const std::string sample :
       {"Call me Ishmael. Some years ago—never mind how long precisely 1851.",
        "<|im_start|>user\nIs this message spam or ham?\n\nWIN £1000 now!!! txt 87121<|im_end|>\n",
        "  naïve café, 日本語, emoji 🙂 and tabs\tand\r\nnewlines"}) {
    EXPECT_EQ(tok_hf->Encode(sample), tok_gguf->Encode(sample)) << sample;
  }
  EXPECT_EQ(tok_hf->eos_id(), tok_gguf->eos_id());
  EXPECT_EQ(tok_hf->bos_id(), tok_gguf->bos_id());
  ASSERT_FALSE(tok_gguf->chat_template().empty());
  std::ifstream cfg_in(out + "/tokenizer_config.json");
  const nlohmann::json cfg = nlohmann::json::parse(cfg_in);
  EXPECT_EQ(cfg.value("chat_template", ""), tok_gguf->chat_template());
  std::filesystem::remove_all(parent);
}

// lspctl convert's refusals, each naming the flag: a missing --model (kNotFound), a folder or a
// text file as --model, an --output_dir that is a file or a folder with files in it (left as it
// was: never overwritten), empty flags (kInvalidArgument). A file with the GGUF magic but a
// broken header fails in the reader and leaves no folder behind.
TEST(ConvertTest, RefusesBadInputs) {
  const std::string dir = testing_jobs::TempDir("convert-bad");
  const std::string text = dir + "/notes.gguf";
  std::ofstream(text) << "just some text, not a model\n";
  const std::string broken = dir + "/broken.gguf";
  std::ofstream(broken, std::ios::binary) << "GGUF\x03garbage";
  const std::string full = dir + "/full";
  std::filesystem::create_directories(full);
  std::ofstream(full + "/keep.txt") << "mine";

  auto code_and_message = [](const std::string& model, const std::string& out,
                             absl::StatusCode code, const std::string& needle) {
    client::ConvertCommand cmd;
    cmd.model = model;
    cmd.output_dir = out;
    absl::Status st = client::RunConvert(cmd);
    EXPECT_EQ(st.code(), code) << model << " -> " << out << ": " << st;
    EXPECT_NE(std::string(st.message()).find(needle), std::string::npos) << st;
  };
  code_and_message(dir + "/no-such.gguf", dir + "/a", absl::StatusCode::kNotFound,
                   "--model '" + dir + "/no-such.gguf' does not exist");
  code_and_message(text, dir + "/a", absl::StatusCode::kInvalidArgument, "not a GGUF file");
  code_and_message(dir, dir + "/a", absl::StatusCode::kInvalidArgument, "is a folder");
  code_and_message(broken, full, absl::StatusCode::kInvalidArgument,
                   "--output_dir '" + full + "' exists and is not empty");
  code_and_message(broken, text, absl::StatusCode::kInvalidArgument, "is a file");
  code_and_message("", dir + "/a", absl::StatusCode::kInvalidArgument, "--model=FILE.gguf");
  code_and_message(broken, "", absl::StatusCode::kInvalidArgument, "--output_dir=DIR");
  EXPECT_EQ(ReadAll(full + "/keep.txt"), "mine");
  EXPECT_EQ(Entries(full), std::vector<std::string>{"keep.txt"});

  client::ConvertCommand cmd;
  cmd.model = broken;
  cmd.output_dir = dir + "/out";
  absl::Status st = client::RunConvert(cmd);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(std::string(st.message()).find(broken), std::string::npos) << st;
  EXPECT_EQ(Entries(dir), (std::vector<std::string>{"broken.gguf", "full", "notes.gguf"}));
  std::filesystem::remove_all(dir);
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
                         ::testing::Values("llama", "qwen2", "mistral", "qwen3", "gemma3"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace lspo
