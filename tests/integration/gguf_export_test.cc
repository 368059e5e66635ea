// lspctl export --format=gguf (client/model_tools.h RunExport, offload/gguf_export.h) read back
// by this product's own GGUF reader: the real SmolLM2 model and a random transformers Llama
// with attention biases; the refusals. (llama.cpp's gguf-py reads the same exports in
// tests/integration/gguf_export_oracle.py.)
#include "third_party/torch/torch_api.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "client/model_tools.h"
#include "gtest/gtest.h"
#include "model/generate.h"
#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "model/llama.h"
#include "nlohmann/json.hpp"
#include "tests/integration/test_jobs.h"
#include "text/tokenizer.h"

namespace lspo {
namespace {

constexpr char kLlamaJob[] = "tests/oracle/data/hf_models/llama-job";

// head_dim of an HF config.json (explicit, or hidden / heads).
int64_t HeadDimOf(const nlohmann::json& c) {
  if (c.contains("head_dim") && c["head_dim"].is_number_integer()) return c["head_dim"];
  return c["hidden_size"].get<int64_t>() / c["num_attention_heads"].get<int64_t>();
}

absl::StatusOr<offload::GgufExportResult> Export(const std::string& model,
                                                 const std::string& outtype,
                                                 const std::string& outfile) {
  client::ExportCommand cmd;
  cmd.model = model;
  cmd.format = "gguf";
  cmd.outtype = outtype;
  cmd.outfile = outfile;
  return client::RunExport(cmd);
}

model::LlamaModel LoadGguf(const std::string& path) {
  auto f = model::GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  auto m = model::LlamaModel::FromGguf(*f);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

model::LlamaModel LoadFolder(const std::string& dir) {
  auto ckpt = model::HfCheckpoint::Open(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  auto m = model::LlamaModel::FromHfCheckpoint(*ckpt);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

std::vector<int32_t> Greedy(model::LlamaModel& m, const std::vector<int32_t>& prompt, int n) {
  at::NoGradGuard no_grad;
  model::GenerationOptions o;
  o.max_new_tokens = n;
  auto r = model::Generate(m, prompt, o);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->tokens : std::vector<int32_t>{};
}

// The main job's model as an HF folder (lspctl convert), exported f32, bf16 and q8_0 and read back
// by FromGguf: f32 tensors bit-identical to the folder's, bf16 tensors equal to the folder's
// rounded to bf16, q8_0 within the format's step; the tokenizer read from the GGUF encodes as the
// folder's tokenizer.json does; greedy text from every export is the folder's, token for token.
TEST(ExportTest, SmolLm2FolderRoundTripsThroughGguf) {
  if (!testing_jobs::HaveModel()) GTEST_SKIP() << testing_jobs::kNoModel;
  const std::string dir = testing_jobs::TempDir("export");
  client::ConvertCommand convert;
  convert.model = testing_jobs::kModel;
  convert.output_dir = dir + "/smol";
  ASSERT_TRUE(client::RunConvert(convert).ok());
  model::LlamaModel hf = LoadFolder(dir + "/smol");
  auto tok_hf = model::BpeTokenizer::FromHfFolder(dir + "/smol");
  ASSERT_TRUE(tok_hf.ok()) << tok_hf.status();
  const std::vector<int32_t> prompt = tok_hf->Encode(
      "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
      "<|im_start|>assistant\n");
  const std::vector<int32_t> want = Greedy(hf, prompt, 24);
  ASSERT_EQ(want.size(), 24u);

  for (const std::string type : {"f32", "bf16", "q8_0"}) {
    SCOPED_TRACE(type);
    const std::string path = dir + "/smol-" + type + ".gguf";
    auto r = Export(dir + "/smol", type, path);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->path, path);
    EXPECT_EQ(r->tokenizer_pre, "smollm");
    EXPECT_EQ(r->num_tensors, 2 + 9 * 30);  // embed, 30 x (7 linears + 2 norms), norm
    EXPECT_TRUE(r->notes.empty());
    model::LlamaModel back = LoadGguf(path);
    EXPECT_EQ(back.config().NumParameters(), 134515008);
    const auto a = hf.NamedTensors(), b = back.NamedTensors();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first);
      const at::Tensor& x = a[i].second;
      const at::Tensor& y = b[i].second;
      if (type == "f32" || x.dim() == 1) {
        EXPECT_TRUE(at::equal(x, y)) << a[i].first;
      } else if (type == "bf16") {
        EXPECT_TRUE(at::equal(x.to(at::kBFloat16).to(at::kFloat), y)) << a[i].first;
      } else {
        // Q8_0: |x - y| <= step / 2 per 32-element block (step = max|x| / 127, + f16 scale).
        const at::Tensor xb = x.reshape({-1, 32}), yb = y.reshape({-1, 32});
        const at::Tensor step = std::get<0>(xb.abs().max(1, true)) / 127.0;
        EXPECT_TRUE((xb - yb).abs().le(step * 0.5 + step * 0.07 + 1e-12).all().item<bool>())
            << a[i].first;
      }
    }
    auto f = model::GgufFile::Open(path);
    ASSERT_TRUE(f.ok());
    auto tok = model::BpeTokenizer::FromGguf(*f);
    ASSERT_TRUE(tok.ok()) << tok.status();
    for (const std::string sample :
         {"Call me Ishmael. Some years ago 1851, naïve café 日本語 🙂\tand\r\n",
          "<|im_start|>user\nWIN £1000 now!!! txt 87121<|im_end|>\n"}) {
      EXPECT_EQ(tok->Encode(sample), tok_hf->Encode(sample)) << sample;
    }
    EXPECT_EQ(tok->chat_template(), tok_hf->chat_template());
    EXPECT_EQ(tok->eos_id(), tok_hf->eos_id());
    if (type != "q8_0") {
      EXPECT_EQ(Greedy(back, prompt, 24), want);
    }
  }
  // Q8_0 changes the weights by up to half a step: its text is checked for the first tokens.
  model::LlamaModel q8 = LoadGguf(dir + "/smol-q8_0.gguf");
  const std::vector<int32_t> got = Greedy(q8, prompt, 8);
  EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + 8));
}

// A bf16 transformers Llama with q/k/v/o biases and the Llama 3 tokenizer: auto picks bf16 (the
// folder's dtype), the biases are written and read back (q and k permuted and un-permuted), the
// logits of the read-back model equal the folder's (bf16 -> bf16 is exact), and the tokenizer is
// named llama-bpe (which this reader does not tokenize yet: a clear kUnimplemented).
TEST(ExportTest, AutoKeepsBf16AndBiasesRoundTrip) {
  const std::string dir = testing_jobs::TempDir("export-llama");
  const std::string path = dir + "/llama.gguf";
  auto r = Export(kLlamaJob, "auto", path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->matrix_type, model::GgmlType::kBF16);
  {
    // No --outfile: llama.cpp's default name, by the type auto chose, in the current folder.
    const std::string folder = std::filesystem::absolute(kLlamaJob).string();
    const std::filesystem::path cwd = std::filesystem::current_path();
    std::filesystem::current_path(dir);
    auto named = Export(folder, "auto", "");
    std::filesystem::current_path(cwd);
    ASSERT_TRUE(named.ok()) << named.status();
    EXPECT_EQ(named->path, "llama-job-BF16.gguf");
    EXPECT_TRUE(std::filesystem::exists(dir + "/llama-job-BF16.gguf"));
  }
  EXPECT_EQ(r->tokenizer_pre, "llama-bpe");
  model::LlamaModel hf = LoadFolder(kLlamaJob);
  model::LlamaModel back = LoadGguf(path);
  EXPECT_TRUE(back.config().qkv_bias);
  EXPECT_TRUE(back.config().o_bias);
  at::NoGradGuard no_grad;
  const at::Tensor ids = at::arange(3, 40, at::kLong).view({1, 37}) % hf.config().vocab_size;
  EXPECT_TRUE(at::equal(hf.Logits(ids), back.Logits(ids)));
  auto f = model::GgufFile::Open(path);
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f->GetString("tokenizer.ggml.pre"), "llama-bpe");
  // The Llama 3 tokenizer read back from the GGUF encodes as the folder's tokenizer.json.
  auto tok = model::BpeTokenizer::FromGguf(*f);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto tok_hf = model::BpeTokenizer::FromHfFolder(kLlamaJob);
  ASSERT_TRUE(tok_hf.ok()) << tok_hf.status();
  for (const std::string sample : {"Call me Ishmael, 1851 or 12345678 times.\n\n  It's   fine",
                                   "<|begin_of_text|>naïve café 日本語 🙂\tand\r\n"}) {
    EXPECT_EQ(tok->Encode(sample), tok_hf->Encode(sample)) << sample;
  }
  EXPECT_EQ(tok->adds_bos(), tok_hf->adds_bos());
  EXPECT_EQ(tok->bos_id(), tok_hf->bos_id());
  EXPECT_EQ(tok->eos_id(), tok_hf->eos_id());
  EXPECT_EQ(tok->chat_template(), tok_hf->chat_template());
}

// The refusals, each naming the input and the way out: an existing --outfile (kept), a GGUF or a
// missing path as --model, a folder that is not a model, --format other than gguf, an unknown
// --outtype, a Qwen2 model, a SentencePiece-style tokenizer (Mistral's), a missing folder for
// --outfile; and a llama3-scaled RoPE model's rope_freqs read back as its scaling (or refused when
// no llama3 setting gives them).
TEST(ExportTest, RefusesBadInputs) {
  const std::string dir = testing_jobs::TempDir("export-bad");
  const std::string existing = dir + "/there.gguf";
  std::ofstream(existing) << "mine";
  auto expect = [&](const absl::Status& st, absl::StatusCode code, const std::string& needle) {
    EXPECT_EQ(st.code(), code) << st;
    EXPECT_NE(std::string(st.message()).find(needle), std::string::npos) << st;
  };
  expect(Export(kLlamaJob, "f16", existing).status(), absl::StatusCode::kAlreadyExists,
         "exists; export never overwrites");
  std::ifstream in(existing);
  std::string kept;
  in >> kept;
  EXPECT_EQ(kept, "mine");
  expect(Export(existing, "f16", dir + "/a.gguf").status(), absl::StatusCode::kInvalidArgument,
         "is a file");
  expect(Export(dir + "/nothing", "f16", dir + "/a.gguf").status(), absl::StatusCode::kNotFound,
         "does not exist");
  expect(Export(dir, "f16", dir + "/a.gguf").status(), absl::StatusCode::kNotFound,
         "without config.json");
  client::ExportCommand bad_format;
  bad_format.model = kLlamaJob;
  bad_format.format = "onnx";
  expect(client::RunExport(bad_format).status(), absl::StatusCode::kInvalidArgument,
         "--format=onnx");
  expect(Export(kLlamaJob, "q4_k", dir + "/a.gguf").status(), absl::StatusCode::kInvalidArgument,
         "auto, f32, f16, bf16 or q8_0");
  expect(Export("tests/oracle/data/hf_models/qwen2-job", "f16", dir + "/q.gguf").status(),
         absl::StatusCode::kUnimplemented, "Qwen2ForCausalLM");
  expect(Export("tests/oracle/data/hf_models/qwen3-job", "f16", dir + "/q3.gguf").status(),
         absl::StatusCode::kUnimplemented, "\"qwen3\" one");
  expect(Export("tests/oracle/data/hf_models/mistral-job", "f16", dir + "/m.gguf").status(),
         absl::StatusCode::kUnimplemented, "SentencePiece-style");
  expect(Export(kLlamaJob, "f16", dir + "/no/such/dir/a.gguf").status(),
         absl::StatusCode::kInvalidArgument, "does not exist");

  // llama3 RoPE scaling (the Llama job's folder with rope_scaling added to its config.json):
  // written with rope_freqs.weight as llama.cpp's converter writes it, each entry the unscaled
  // over the scaled inverse frequency (1 for the high band, `factor` for the low band), and read
  // back as the same llama3 setting: logits equal to the folder's. Divisors that no llama3
  // setting gives are refused, not ignored.
  const std::string scaled = dir + "/scaled";
  std::filesystem::copy(kLlamaJob, scaled);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(scaled + "/config.json"));
  // transformers 5 writes rope_parameters (which wins over rope_scaling): replace it.
  ASSERT_TRUE(config.contains("rope_parameters")) << config.dump();
  config["rope_parameters"] = {
      {"rope_type", "llama3"},   {"rope_theta", config["rope_parameters"]["rope_theta"]},
      {"factor", 8.0},           {"low_freq_factor", 1.0},
      {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 32}};
  std::ofstream(scaled + "/config.json") << config.dump();
  auto r = Export(scaled, "f32", dir + "/scaled.gguf");
  ASSERT_TRUE(r.ok()) << r.status();
  auto f = model::GgufFile::Open(dir + "/scaled.gguf");
  ASSERT_TRUE(f.ok());
  auto freqs = f->ReadTensorF32("rope_freqs.weight");
  ASSERT_TRUE(freqs.ok()) << freqs.status();
  const int64_t hd = HeadDimOf(config);
  ASSERT_EQ(static_cast<int64_t>(freqs->size()), hd / 2);
  EXPECT_FLOAT_EQ(freqs->front(), 1.0f);  // highest frequency: wavelength 2 pi < 32 / 4
  EXPECT_FLOAT_EQ(freqs->back(), 8.0f);   // lowest: wavelength > 32
  model::LlamaModel scaled_back = LoadGguf(dir + "/scaled.gguf");
  const model::RopeScaling& rs = scaled_back.config().rope_scaling;
  EXPECT_EQ(rs.type, model::RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(rs.factor, 8.0);
  EXPECT_DOUBLE_EQ(rs.high_freq_factor, 4.0);
  EXPECT_EQ(rs.original_max_position_embeddings, 32);
  {
    model::LlamaModel scaled_hf = LoadFolder(scaled);
    at::NoGradGuard no_grad;
    const at::Tensor ids = at::arange(3, 60, at::kLong).view({1, 57});
    EXPECT_TRUE(at::allclose(scaled_hf.Logits(ids), scaled_back.Logits(ids), 0, 1e-5));
  }
  // Divisors no llama3 setting gives: the bytes of rope_freqs.weight edited in a copy.
  {
    std::ifstream src(dir + "/scaled.gguf", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(src)), std::istreambuf_iterator<char>());
    const model::GgufTensorInfo* info = f->FindTensor("rope_freqs.weight");
    ASSERT_NE(info, nullptr);
    const float odd = 3.3f;
    std::memcpy(bytes.data() + f->data_start() + info->offset + 4, &odd, 4);
    std::ofstream(dir + "/odd.gguf", std::ios::binary) << bytes;
    auto g = model::GgufFile::Open(dir + "/odd.gguf");
    ASSERT_TRUE(g.ok()) << g.status();
    expect(model::LlamaModel::FromGguf(*g).status(), absl::StatusCode::kUnimplemented,
           "matches no llama3 scaling");
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lspo
