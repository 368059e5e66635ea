// Tests of model/llama_config.h and model/llama.h.
// References: tests/oracle/data/logits_oracle.json (made by tests/oracle/make_logits_oracle.py
// with Hugging Face transformers on the same GGUF), docs/formats.md §5 values, and float64
// recomputations of S = P^T G Q from dense autograd gradients.
#include "model/llama.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include "third_party/torch/torch_api.h"

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "lsp/lsp_linear.h"
#include "model/gguf.h"
#include "model/llama_config.h"
#include "nlohmann/json.hpp"

namespace lspo::model {
namespace {

constexpr char kGgufPath[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kOraclePath[] = "tests/oracle/data/logits_oracle.json";

bool FileExists(const char* path) { return std::ifstream(path).good(); }

#define SKIP_IF_NO_MODEL()                                                                 \
  if (!FileExists(kGgufPath)) {                                                            \
    GTEST_SKIP() << kGgufPath << " is absent (fetch it with scripts/; CI has it)";         \
  }

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path << " (run from the repository root)";
  return nlohmann::json::parse(in);
}

at::Tensor Ids(const std::vector<int64_t>& ids) {
  return torch::tensor(ids, torch::kLong).view({1, static_cast<int64_t>(ids.size())});
}

double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// ---------------------------------------------------------------------------------------------
// Config

TEST(LlamaConfigTest, FromRealGgufMatchesFormatsDoc) {
  SKIP_IF_NO_MODEL();
  auto gguf = GgufFile::Open(kGgufPath);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto c = LlamaConfigFromGguf(*gguf);
  ASSERT_TRUE(c.ok()) << c.status();
  // docs/formats.md §5 (SmolLM2-135M config.json).
  EXPECT_EQ(c->vocab_size, 49152);
  EXPECT_EQ(c->hidden_size, 576);
  EXPECT_EQ(c->num_layers, 30);
  EXPECT_EQ(c->num_heads, 9);
  EXPECT_EQ(c->num_kv_heads, 3);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->intermediate_size, 1536);
  EXPECT_EQ(c->max_position_embeddings, 8192);
  EXPECT_NEAR(c->rms_norm_eps, 1e-5, 1e-12);
  EXPECT_DOUBLE_EQ(c->rope_theta, 100000.0);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_id, 2);
  EXPECT_EQ(c->pad_token_id, 2);
  EXPECT_EQ(c->NumParameters(), 134515008);
  EXPECT_TRUE(c->Validate().ok());
}

// A GGUF v3 with no tensors and one string key, built byte by byte (docs/formats.md §1).
std::vector<uint8_t> MinimalGguf(const std::string& key, const std::string& value) {
  std::vector<uint8_t> b;
  auto put = [&b](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
  };
  auto put_str = [&](const std::string& s) {
    put(s.size(), 8);
    b.insert(b.end(), s.begin(), s.end());
  };
  b.insert(b.end(), {'G', 'G', 'U', 'F'});
  put(3, 4);  // version
  put(0, 8);  // n_tensors
  put(1, 8);  // n_kv
  put_str(key);
  put(8, 4);  // string
  put_str(value);
  while (b.size() % 32 != 0) b.push_back(0);
  return b;
}

TEST(LlamaConfigTest, OtherArchitectureIsUnimplemented) {
  auto gguf = GgufFile::FromBytes(MinimalGguf("general.architecture", "gpt2"), "gpt2.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto c = LlamaConfigFromGguf(*gguf);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << c.status();
  EXPECT_NE(c.status().message().find("gpt2"), std::string::npos);
}

TEST(LlamaConfigTest, MissingKeysAreReported) {
  auto gguf = GgufFile::FromBytes(MinimalGguf("general.architecture", "llama"), "llama.gguf");
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto c = LlamaConfigFromGguf(*gguf);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound) << c.status();
}

TEST(LlamaConfigTest, ValidateRejectsBadFields) {
  LlamaConfig c = TinyLlamaConfig(97);
  EXPECT_TRUE(c.Validate().ok());
  LlamaConfig bad = c;
  bad.num_kv_heads = 3;  // 4 % 3 != 0
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  bad = c;
  bad.head_dim = 15;  // 4 * 15 != 64
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  bad = c;
  bad.eos_token_id = 97;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  bad = c;
  bad.hidden_size = 0;
  EXPECT_EQ(bad.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LlamaModel::RandomInit(bad, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LlamaConfigTest, HfConfigJsonFields) {
  LlamaConfig c = TinyLlamaConfig(97);
  nlohmann::json j = c.ToHfConfigJson("bfloat16");
  EXPECT_EQ(j["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(j["model_type"], "llama");
  EXPECT_EQ(j["num_hidden_layers"], 2);
  EXPECT_EQ(j["num_attention_heads"], 4);
  EXPECT_EQ(j["num_key_value_heads"], 2);
  EXPECT_EQ(j["head_dim"], 16);
  EXPECT_EQ(j["intermediate_size"], 128);
  EXPECT_EQ(j["hidden_act"], "silu");
  EXPECT_TRUE(j["rope_scaling"].is_null());
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_EQ(j["mlp_bias"], false);
  EXPECT_EQ(j["tie_word_embeddings"], true);
  EXPECT_EQ(j["torch_dtype"], "bfloat16");
  EXPECT_EQ(j["pad_token_id"], 2);
}

// ---------------------------------------------------------------------------------------------
// Real model vs the Hugging Face oracle

TEST(LlamaRealModelTest, ShapesAndParameterCount) {
  SKIP_IF_NO_MODEL();
  auto gguf = GgufFile::Open(kGgufPath);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto model = LlamaModel::FromGguf(*gguf);
  ASSERT_TRUE(model.ok()) << model.status();
  auto named = model->NamedTensors();
  EXPECT_EQ(named.size(), 272u);  // 1 embed + 30 * 9 + 1 norm; tied, so no lm_head
  int64_t total = 0;
  for (const auto& [name, t] : named) {
    total += t.numel();
    EXPECT_EQ(t.scalar_type(), at::kFloat) << name;
    EXPECT_NE(name, "lm_head.weight");
  }
  EXPECT_EQ(total, 134515008);
  EXPECT_EQ(model->num_linears(), 210);
  EXPECT_EQ(model->LinearName(3 * 7 + 1), "model.layers.3.self_attn.k_proj.weight");
  EXPECT_EQ(model->LinearWeight(3 * 7 + 1).sizes(), at::IntArrayRef({192, 576}));
  EXPECT_EQ(model->LinearWeight(29 * 7 + 6).sizes(), at::IntArrayRef({576, 1536}));
  EXPECT_EQ(model->LinearName(29 * 7 + 6), "model.layers.29.mlp.down_proj.weight");
}

TEST(LlamaRealModelTest, LogitsAndLossMatchHuggingFace) {
  SKIP_IF_NO_MODEL();
  nlohmann::json oracle = ReadJson(kOraclePath);
  auto gguf = GgufFile::Open(kGgufPath);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto model = LlamaModel::FromGguf(*gguf);
  ASSERT_TRUE(model.ok()) << model.status();
  std::vector<int64_t> ids_vec = oracle["input_ids"].get<std::vector<int64_t>>();
  at::Tensor ids = Ids(ids_vec);  // (1, T)
  ASSERT_TRUE(model->ValidateBatch(ids, ids).ok());
  at::NoGradGuard no_grad;
  at::Tensor logits = model->Logits(ids)[0];  // (T, V)
  ASSERT_EQ(logits.size(1), oracle["vocab_size"].get<int64_t>());
  double worst = 0.0;
  for (const auto& pos : oracle["positions"]) {
    const int64_t p = pos["position"];
    at::Tensor row = logits[p];  // (V)
    auto first = pos["first"].get<std::vector<double>>();
    for (size_t v = 0; v < first.size(); ++v) {
      const double diff = std::abs(row[static_cast<int64_t>(v)].item<double>() - first[v]);
      worst = std::max(worst, diff);
      EXPECT_LE(diff, 1e-3) << "position " << p << " token " << v;
    }
    const int64_t stride = pos["stride"];
    auto strided = pos["strided"].get<std::vector<double>>();
    for (size_t k = 0; k < strided.size(); ++k) {
      const int64_t v = static_cast<int64_t>(k) * stride;
      const double diff = std::abs(row[v].item<double>() - strided[k]);
      worst = std::max(worst, diff);
      EXPECT_LE(diff, 1e-3) << "position " << p << " token " << v;
    }
    auto top_ids = pos["top_ids"].get<std::vector<int64_t>>();
    auto top_values = pos["top_values"].get<std::vector<double>>();
    for (size_t k = 0; k < top_ids.size(); ++k) {
      const double diff = std::abs(row[top_ids[k]].item<double>() - top_values[k]);
      worst = std::max(worst, diff);
      EXPECT_LE(diff, 1e-3) << "position " << p << " top token " << top_ids[k];
    }
    EXPECT_EQ(row.argmax().item<int64_t>(), pos["argmax"].get<int64_t>()) << "position " << p;
  }
  std::printf("max |logit - HF logit| = %.3g\n", worst);

  // LogitsAt at the last position equals the full logits there.
  const int64_t T = ids.size(1);
  at::Tensor at_last = model->LogitsAt(ids, torch::tensor({T - 1}, torch::kLong));  // (1, V)
  EXPECT_LE(MaxAbsDiff(at_last[0], logits[T - 1]), 1e-4);

  // HF loss with labels = input_ids (shift inside).
  const double hf_loss = oracle["loss"];
  const double loss = model->CausalLmLoss(ids, ids).item<double>();
  std::printf("loss %.7f, HF %.7f\n", loss, hf_loss);
  EXPECT_LE(std::abs(loss - hf_loss) / hf_loss, 1e-4);
}

// Installs an LSP LinearImpl with random (d = min(m, n) / 2, r = 8) projectors on every
// linear of `model`.
std::shared_ptr<lsp::LspLinears> InstallRandomProjectors(LlamaModel& model) {
  auto lsp_linears = std::make_shared<lsp::LspLinears>(model);
  model.SetLinearImpl(lsp_linears);
  for (int64_t i = 0; i < model.num_linears(); ++i) {
    const at::Tensor& w = model.LinearWeight(i);
    const int64_t d = std::min(w.size(0), w.size(1)) / 2;
    auto P = lsp::SparseProjector::Random(w.size(0), d, 8, 1000 + 2 * i);
    auto Q = lsp::SparseProjector::Random(w.size(1), d, 8, 1001 + 2 * i);
    EXPECT_TRUE(P.ok() && Q.ok());
    EXPECT_TRUE(lsp_linears->SetProjectors(i, *P, *Q).ok());
  }
  return lsp_linears;
}

// A training step's shape on the real model in LSP mode: every linear delivers one S in
// reverse layer order, no weight gradient is formed.
TEST(LlamaRealModelTest, LspBackwardDeliversOneSPerLinear) {
  SKIP_IF_NO_MODEL();
  auto gguf = GgufFile::Open(kGgufPath);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto model = LlamaModel::FromGguf(*gguf);
  ASSERT_TRUE(model.ok()) << model.status();
  auto lsp_linears = InstallRandomProjectors(*model);
  model->SetLinearMode(LinearMode::kCustom);
  ASSERT_TRUE(lsp_linears->ValidateReady(*model).ok());
  std::vector<int64_t> order;
  lsp_linears->SetSink([&order, &model](int64_t i, const at::Tensor& S) {
    const at::Tensor& w = model->LinearWeight(i);
    const int64_t d = std::min(w.size(0), w.size(1)) / 2;
    EXPECT_EQ(S.sizes(), at::IntArrayRef({d, d}));
    EXPECT_EQ(S.scalar_type(), at::kFloat);
    EXPECT_TRUE(S.isfinite().all().item<bool>());
    order.push_back(i);
  });
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor ids = at::randint(3, 49152, {2, 6}, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor labels = ids.clone();
  labels.narrow(1, 0, 2).fill_(-100);  // a masked prompt
  ASSERT_TRUE(model->ValidateBatch(ids, labels).ok());
  at::Tensor loss = model->CausalLmLoss(ids, labels);
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  loss.backward();
  ASSERT_EQ(order.size(), 210u);
  std::vector<int> seen(210, 0);
  for (size_t k = 0; k < order.size(); ++k) {
    ++seen[static_cast<size_t>(order[k])];
    if (k > 0) EXPECT_LE(order[k] / 7, order[k - 1] / 7) << "not in reverse layer order";
  }
  for (int s : seen) EXPECT_EQ(s, 1);
  for (int64_t i = 0; i < model->num_linears(); ++i) {
    EXPECT_FALSE(model->LinearWeight(i).grad().defined());
    EXPECT_FALSE(model->LinearWeight(i).requires_grad());
  }
}

// ---------------------------------------------------------------------------------------------
// Tiny random model

class TinyLlamaTest : public ::testing::Test {
 protected:
  static constexpr int64_t kVocab = 97;
  static constexpr int64_t kB = 3, kT = 7;

  void SetUp() override {
    auto m = LlamaModel::RandomInit(TinyLlamaConfig(kVocab), 42);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::make_unique<LlamaModel>(std::move(*m));
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
    ids_ = at::randint(0, kVocab, {kB, kT}, gen, at::TensorOptions().dtype(at::kLong));
    labels_ = ids_.clone();
    labels_.index_put_({0, 2}, -100);
    labels_.index_put_({1, 0}, -100);  // position 0 is never a target anyway
    labels_.index_put_({2, 5}, -100);
    labels_.index_put_({2, 6}, -100);
  }

  std::unique_ptr<LlamaModel> model_;
  at::Tensor ids_, labels_;  // (B, T) int64
};

TEST_F(TinyLlamaTest, NamesAndShapes) {
  auto named = model_->NamedTensors();
  EXPECT_EQ(named.size(), 1u + 2 * 9 + 1);
  EXPECT_EQ(named.front().first, "model.embed_tokens.weight");
  EXPECT_EQ(named.back().first, "model.norm.weight");
  EXPECT_EQ(model_->num_linears(), 14);
  const char* kinds[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                         "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                         "mlp.down_proj"};
  const std::vector<int64_t> shapes[] = {{64, 64}, {32, 64},  {32, 64}, {64, 64},
                                         {128, 64}, {128, 64}, {64, 128}};
  for (int64_t k = 0; k < 7; ++k) {
    EXPECT_EQ(model_->LinearName(7 + k), std::string("model.layers.1.") + kinds[k] + ".weight");
    EXPECT_EQ(model_->LinearWeight(7 + k).sizes(), at::IntArrayRef(shapes[k]));
  }
  EXPECT_EQ(model_->config().NumParameters(), [&] {
    int64_t n = 0;
    for (const auto& [name, t] : named) n += t.numel();
    return n;
  }());
  // Init statistics: norms are 1, weights ~ N(0, 0.02^2).
  EXPECT_TRUE(model_->GetTensor("model.norm.weight")->eq(1.0).all().item<bool>());
  const double sd = model_->GetTensor("model.embed_tokens.weight")->std().item<double>();
  EXPECT_NEAR(sd, 0.02, 0.002);
}

TEST_F(TinyLlamaTest, RandomInitIsDeterministic) {
  auto other = LlamaModel::RandomInit(TinyLlamaConfig(kVocab), 42);
  auto third = LlamaModel::RandomInit(TinyLlamaConfig(kVocab), 43);
  ASSERT_TRUE(other.ok() && third.ok());
  auto a = model_->NamedTensors(), b = other->NamedTensors(), c = third->NamedTensors();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].second.equal(b[i].second));
  EXPECT_FALSE(a[0].second.equal(c[0].second));
}

// CausalLmLoss (gathers rows before lm_head) == CE over the full logits computed in float64;
// LogitsAt == rows of Logits.
TEST_F(TinyLlamaTest, LossAndLogitsAtAgreeWithFullLogits) {
  at::NoGradGuard no_grad;
  at::Tensor logits = model_->Logits(ids_).to(at::kDouble);  // (B, T, V)
  at::Tensor logp = at::log_softmax(logits, -1);
  double sum = 0.0;
  int count = 0;
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t t = 0; t + 1 < kT; ++t) {
      const int64_t target = labels_[b][t + 1].item<int64_t>();
      if (target == -100) continue;
      sum -= logp[b][t][target].item<double>();
      ++count;
    }
  }
  const double loss = model_->CausalLmLoss(ids_, labels_).item<double>();
  EXPECT_NEAR(loss, sum / count, 1e-6 * std::abs(sum / count));

  at::Tensor positions = torch::tensor({6, 0, 3}, torch::kLong);
  at::Tensor at_rows = model_->LogitsAt(ids_, positions).to(at::kDouble);  // (B, V)
  for (int64_t b = 0; b < kB; ++b) {
    EXPECT_LE(MaxAbsDiff(at_rows[b], logits[b][positions[b].item<int64_t>()]), 1e-6);
  }
  // All targets ignored: zero loss, backward still runs.
  at::Tensor none = at::full_like(labels_, -100);
  EXPECT_EQ(model_->CausalLmLoss(ids_, none).item<double>(), 0.0);
}

// Right padding does not change the logits of the real tokens (causal attention only).
TEST_F(TinyLlamaTest, RightPaddingIsInvisibleToRealTokens) {
  at::NoGradGuard no_grad;
  at::Tensor short_ids = ids_.narrow(1, 0, 4);  // (B, 4)
  at::Tensor padded = ids_.clone();
  padded.narrow(1, 4, kT - 4).fill_(2);  // pad id
  at::Tensor a = model_->Logits(short_ids);
  at::Tensor b = model_->Logits(padded).narrow(1, 0, 4);
  EXPECT_LE(MaxAbsDiff(a, b), 1e-5);
}

// Attention/RoPE/GQA against a straightforward float64 re-implementation (repeat_kv,
// rotate_half, explicit loops-free reference written independently of the model code).
TEST_F(TinyLlamaTest, ForwardMatchesFloat64Reference) {
  at::NoGradGuard no_grad;
  const LlamaConfig& c = model_->config();
  auto W = [&](const std::string& name) { return model_->GetTensor(name)->to(at::kDouble); };
  auto rms = [&](const at::Tensor& x, const at::Tensor& w) {
    return w * x / at::sqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps);
  };
  const int64_t B = kB, T = kT, nh = c.num_heads, nkv = c.num_kv_heads, hd = c.head_dim;
  at::Tensor h = W("model.embed_tokens.weight").index_select(0, ids_.view(-1)).view({B, T, -1});
  // RoPE tables in float64.
  at::Tensor pos = at::arange(T, at::kDouble).unsqueeze(1);                  // (T, 1)
  at::Tensor i2 = at::arange(0, hd, 2, at::kDouble) / hd;                    // (hd/2)
  at::Tensor ang = pos * at::pow(c.rope_theta, -i2).unsqueeze(0);           // (T, hd/2)
  at::Tensor cos = at::cat({ang.cos(), ang.cos()}, -1), sin = at::cat({ang.sin(), ang.sin()}, -1);
  auto rope = [&](const at::Tensor& x) {  // x (B, heads, T, hd)
    at::Tensor x1 = x.narrow(-1, 0, hd / 2), x2 = x.narrow(-1, hd / 2, hd / 2);
    return x * cos + at::cat({-x2, x1}, -1) * sin;
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    at::Tensor a = rms(h, W(p + "input_layernorm.weight"));
    at::Tensor q = at::matmul(a, W(p + "self_attn.q_proj.weight").t()).view({B, T, nh, hd});
    at::Tensor k = at::matmul(a, W(p + "self_attn.k_proj.weight").t()).view({B, T, nkv, hd});
    at::Tensor v = at::matmul(a, W(p + "self_attn.v_proj.weight").t()).view({B, T, nkv, hd});
    q = rope(q.transpose(1, 2));
    k = rope(k.transpose(1, 2)).repeat_interleave(nh / nkv, 1);
    v = v.transpose(1, 2).repeat_interleave(nh / nkv, 1);
    at::Tensor s = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(hd));
    at::Tensor mask = at::ones({T, T}, at::kBool).triu(1);
    s = s.masked_fill(mask, -INFINITY);
    at::Tensor o = at::matmul(at::softmax(s, -1), v).transpose(1, 2).reshape({B, T, nh * hd});
    h = h + at::matmul(o, W(p + "self_attn.o_proj.weight").t());
    a = rms(h, W(p + "post_attention_layernorm.weight"));
    at::Tensor g = at::matmul(a, W(p + "mlp.gate_proj.weight").t());
    at::Tensor u = at::matmul(a, W(p + "mlp.up_proj.weight").t());
    h = h + at::matmul(g * at::sigmoid(g) * u, W(p + "mlp.down_proj.weight").t());
  }
  h = rms(h, W("model.norm.weight"));
  at::Tensor ref = at::matmul(h, W("model.embed_tokens.weight").t());  // (B, T, V)
  at::Tensor got = model_->Logits(ids_);
  const double scale = ref.abs().max().item<double>();
  EXPECT_LE(MaxAbsDiff(got, ref), 1e-5 * std::max(1.0, scale));
}

struct Projectors {
  lsp::SparseProjector P, Q;
};

// The core LSP property: with the LSP LinearImpl (kCustom) the sink receives S = P^T G Q for every linear, where G
// is the dense autograd gradient of the same loss (checked in float64), and dX (here: the
// gradient reaching the embedding table, which sums every dX path) equals the dense run's.
TEST_F(TinyLlamaTest, LspCompressedGradientEqualsProjectedDenseGradient) {
  at::Tensor embed = *model_->GetTensor("model.embed_tokens.weight");
  embed.requires_grad_(true);

  // Dense run.
  model_->SetLinearMode(LinearMode::kDense);
  at::Tensor dense_loss = model_->CausalLmLoss(ids_, labels_);
  dense_loss.backward();
  std::vector<at::Tensor> G(14);
  for (int64_t i = 0; i < 14; ++i) {
    ASSERT_TRUE(model_->LinearWeight(i).grad().defined()) << model_->LinearName(i);
    G[static_cast<size_t>(i)] = model_->LinearWeight(i).grad().clone();  // (m, n)
  }
  at::Tensor dense_embed_grad = embed.grad().clone();
  model_->ZeroLinearGrads();
  embed.mutable_grad() = at::Tensor();

  // LSP run with random projectors (d = 8 or 12 < min(m, n), r = 4; sizes hit odd d).
  auto lsp_linears = std::make_shared<lsp::LspLinears>(*model_);
  model_->SetLinearImpl(lsp_linears);
  std::vector<Projectors> proj;
  for (int64_t i = 0; i < 14; ++i) {
    const at::Tensor& w = model_->LinearWeight(i);
    const int64_t d = (i % 2 == 0) ? 8 : 12;
    auto P = lsp::SparseProjector::Random(w.size(0), d, 4, 100 + i);
    auto Q = lsp::SparseProjector::Random(w.size(1), d, 4, 200 + i);
    ASSERT_TRUE(P.ok() && Q.ok());
    proj.push_back({*P, *Q});
    ASSERT_TRUE(lsp_linears->SetProjectors(i, *P, *Q).ok());
  }
  model_->SetLinearMode(LinearMode::kCustom);
  std::map<int64_t, at::Tensor> got;
  std::vector<int64_t> order;
  lsp_linears->SetSink([&](int64_t i, const at::Tensor& S) {
    EXPECT_EQ(got.count(i), 0u) << "S delivered twice for linear " << i;
    got[i] = S;
    order.push_back(i);
  });
  at::Tensor lsp_loss = model_->CausalLmLoss(ids_, labels_);
  EXPECT_EQ(lsp_loss.item<double>(), dense_loss.item<double>());
  lsp_loss.backward();
  ASSERT_EQ(got.size(), 14u);
  for (size_t k = 1; k < order.size(); ++k) EXPECT_LE(order[k] / 7, order[k - 1] / 7);
  for (int64_t i = 0; i < 14; ++i) {
    EXPECT_FALSE(model_->LinearWeight(i).grad().defined()) << "LSP formed a weight grad";
    const Projectors& pq = proj[static_cast<size_t>(i)];
    at::Tensor ref = pq.P.Dense().to(at::kDouble).t().matmul(G[static_cast<size_t>(i)].to(
                         at::kDouble)).matmul(pq.Q.Dense().to(at::kDouble));  // (d, d)
    const at::Tensor& S = got[i];
    ASSERT_EQ(S.sizes(), ref.sizes());
    EXPECT_EQ(S.scalar_type(), at::kFloat);
    const double rel = (S.to(at::kDouble) - ref).norm().item<double>() / ref.norm().item<double>();
    EXPECT_LT(rel, 1e-4) << model_->LinearName(i);
  }
  ASSERT_TRUE(embed.grad().defined());
  EXPECT_LE(MaxAbsDiff(embed.grad(), dense_embed_grad), 1e-6);

  // Frozen embedding: the LSP nodes still run (no trainable input reaches layer 0's q/k/v),
  // and deliver the same S.
  embed.requires_grad_(false);
  embed.mutable_grad() = at::Tensor();
  std::map<int64_t, at::Tensor> first = got;
  got.clear();
  order.clear();
  model_->CausalLmLoss(ids_, labels_).backward();
  ASSERT_EQ(got.size(), 14u);
  for (int64_t i = 0; i < 14; ++i) EXPECT_LE(MaxAbsDiff(got[i], first[i]), 1e-6);

  // No grad mode: nothing is recorded, the sink is not called.
  got.clear();
  {
    at::NoGradGuard no_grad;
    model_->CausalLmLoss(ids_, labels_);
  }
  EXPECT_TRUE(got.empty());
}

TEST_F(TinyLlamaTest, SharedInputProjectionIsReusedOnlyForTheSameValues) {
  // q's forward projects X for q, k and v in one pass. k reuses it only when its input is the
  // same tensor, unchanged; another tensor with the same values, or the same tensor changed in
  // place, is projected afresh. Checked through S = P^T dY^T X Q against float64.
  auto lsp_linears = std::make_shared<lsp::LspLinears>(*model_);
  std::vector<Projectors> proj;
  for (int64_t i = 0; i < 3; ++i) {
    const at::Tensor& w = model_->LinearWeight(i);
    auto P = lsp::SparseProjector::Random(w.size(0), 8, 4, 300 + i);
    auto Q = lsp::SparseProjector::Random(w.size(1), 8, 4, 400 + i);
    ASSERT_TRUE(P.ok() && Q.ok());
    proj.push_back({*P, *Q});
    ASSERT_TRUE(lsp_linears->SetProjectors(i, *P, *Q).ok());
  }
  std::map<int64_t, at::Tensor> got;
  lsp_linears->SetSink([&](int64_t i, const at::Tensor& S) { got[i] = S; });
  const int64_t n = model_->LinearWeight(0).size(1);
  const auto s_ref = [&](int64_t i, const at::Tensor& x, const at::Tensor& dy) {
    const Projectors& pq = proj[static_cast<size_t>(i)];
    return pq.P.Dense().to(at::kDouble).t().mm(dy.to(at::kDouble).t()).mm(
        x.to(at::kDouble)).mm(pq.Q.Dense().to(at::kDouble));  // (d, d)
  };
  torch::manual_seed(5);
  at::Tensor x = torch::randn({6, n});
  const at::Tensor w0 = model_->LinearWeight(0), w1 = model_->LinearWeight(1);
  // (1) Same tensor: k takes q's pass. (2) A copy: fresh. (3) Changed in place: fresh.
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    got.clear();
    at::Tensor xk = x;
    const at::Tensor y0 = lsp_linears->Forward(x, w0, 0);
    if (variant == 1) xk = x.clone() * 2;
    if (variant == 2) {
      at::NoGradGuard no_grad;
      x.mul_(3);  // after q's forward, before k's: k must see the new values
    }
    const at::Tensor y1 = lsp_linears->Forward(xk, w1, 1);
    const at::Tensor dy0 = torch::randn(y0.sizes()), dy1 = torch::randn(y1.sizes());
    torch::autograd::backward({y1, y0}, {dy1, dy0});
    ASSERT_EQ(got.size(), 2u);
    EXPECT_LT(MaxAbsDiff(got[1], s_ref(1, xk, dy1)), 1e-4);
  }
}

TEST_F(TinyLlamaTest, DenseCompressionGivesTheSparseKernelsS) {
  // lsp.compression dense: GEMMs with the densified projectors (q|k|v and gate|up from one
  // GEMM each) deliver every linear's S within fp32 rounding of the sparse kernels' S, in the
  // same order; switching back gives the sparse kernels' bits again.
  auto lsp_linears = InstallRandomProjectors(*model_);
  model_->SetLinearMode(LinearMode::kCustom);
  std::map<int64_t, at::Tensor> got[3];
  std::vector<int64_t> order[2];
  for (int run = 0; run < 3; ++run) {
    lsp_linears->SetDenseCompression(run == 1);
    EXPECT_EQ(lsp_linears->dense_compression(), run == 1);
    lsp_linears->SetSink([&, run](int64_t i, const at::Tensor& S) {
      got[run][i] = S.clone();
      if (run < 2) order[run].push_back(i);
    });
    model_->CausalLmLoss(ids_, labels_).backward();
    ASSERT_EQ(got[run].size(), 14u) << run;
  }
  EXPECT_EQ(order[0], order[1]);
  int rounded_differently = 0;  // the GEMMs sum in another order: the dense path did run
  for (int64_t i = 0; i < 14; ++i) {
    const double scale = got[0][i].abs().max().item<double>();
    EXPECT_LE(MaxAbsDiff(got[1][i], got[0][i]), 1e-5 * scale + 1e-12) << "linear " << i;
    rounded_differently += !at::equal(got[1][i], got[0][i]);
    EXPECT_TRUE(at::equal(got[2][i], got[0][i])) << "linear " << i;
  }
  EXPECT_GT(rounded_differently, 0);
}

TEST(UpcastLinearTest, MatchesAutogradOnAnUpcastCopyWithoutKeepingOne) {
  // y = x W^T with W stored in bf16 / fp16: the values and both gradients are those of
  // at::mm(x, W.to(fp32).t()) under autograd, bit for bit; and the node keeps W itself, not
  // an upcast copy: changing W in place after the forward makes the backward throw, as it
  // would not with a copy.
  torch::manual_seed(3);
  for (const at::ScalarType dt : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dt));
    const at::Tensor x0 = torch::randn({7, 24});
    const at::Tensor w0 = (torch::randn({10, 24}) * 0.5).to(dt);
    const at::Tensor dy = torch::randn({7, 10});
    for (const bool train_w : {false, true}) {
      at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(train_w);
      at::Tensor xr = x0.clone().requires_grad_(true), wr = w0.clone().requires_grad_(train_w);
      const at::Tensor y = UpcastLinear(x, w);
      const at::Tensor yr = at::mm(xr, wr.to(at::kFloat).t());
      EXPECT_EQ(y.scalar_type(), at::kFloat);
      EXPECT_TRUE(at::equal(y, yr));
      y.backward(dy);
      yr.backward(dy);
      EXPECT_TRUE(at::equal(x.grad(), xr.grad()));
      if (train_w) {
        EXPECT_EQ(w.grad().scalar_type(), dt);
        EXPECT_TRUE(at::equal(w.grad(), wr.grad()));
      }
    }
    at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor w = w0.clone();
    const at::Tensor y = UpcastLinear(x, w);
    w.add_(1);  // the stored weight changes before the backward
    EXPECT_THROW(y.backward(dy), c10::Error);
  }
  // Same dtypes: plain mm.
  const at::Tensor a = torch::randn({3, 5}), b = torch::randn({4, 5});
  EXPECT_TRUE(at::equal(UpcastLinear(a, b), at::mm(a, b.t())));
}

TEST_F(TinyLlamaTest, MixedModesPerLinear) {
  // Only layer 1's down_proj is trained with LSP; layer 0's q_proj densely; rest frozen.
  auto P = lsp::SparseProjector::Random(64, 8, 2, 5);
  auto Q = lsp::SparseProjector::Random(128, 8, 2, 6);
  ASSERT_TRUE(P.ok() && Q.ok());
  auto lsp_linears = std::make_shared<lsp::LspLinears>(*model_);
  model_->SetLinearImpl(lsp_linears);
  ASSERT_TRUE(lsp_linears->SetProjectors(13, *P, *Q).ok());
  model_->SetLinearMode(13, LinearMode::kCustom);
  model_->SetLinearMode(0, LinearMode::kDense);
  int calls = 0;
  lsp_linears->SetSink([&](int64_t i, const at::Tensor&) {
    EXPECT_EQ(i, 13);
    ++calls;
  });
  model_->CausalLmLoss(ids_, labels_).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(model_->LinearWeight(0).grad().defined());
  EXPECT_FALSE(model_->LinearWeight(1).grad().defined());
  EXPECT_TRUE(model_->LinearWeight(0).requires_grad());
  EXPECT_FALSE(model_->LinearWeight(13).requires_grad());
  EXPECT_EQ(model_->linear_mode(13), LinearMode::kCustom);
}

// data.packing: a batch whose first row packs two examples back to back (positions
// restarting at 0, segment ids 0 and 1) and whose second row holds one example and padding
// (its own segment) gives every example the loss it has alone, with and without a sliding
// window; the packed batch's dense gradient of every linear is the loss-token-weighted mean
// of the examples' gradients alone (the gradient accumulation the worker does), and equals
// itself bitwise under activation checkpointing. Control: the same row without the layout
// (plain causal attention across the boundary, positions running on) gives the second
// example a different loss.
TEST_F(TinyLlamaTest, PackedRowGivesEachExampleItsLossAndGradientAlone) {
  for (const int64_t window : {int64_t{0}, int64_t{3}}) {
    SCOPED_TRACE(window);
    LlamaConfig config = TinyLlamaConfig(kVocab);
    config.sliding_window = window;
    auto m = LlamaModel::RandomInit(config, 42);
    ASSERT_TRUE(m.ok()) << m.status();
    LlamaModel& model = *m;
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(11);
    const auto lopts = at::TensorOptions().dtype(at::kLong);
    const std::vector<int64_t> lens = {5, 4, 6};
    std::vector<at::Tensor> ids, labels;  // each (1, len)
    for (int64_t len : lens) {
      ids.push_back(at::randint(0, kVocab, {1, len}, gen, lopts));
      at::Tensor lab = ids.back().clone();
      lab.index_put_({0, 0}, -100);  // the first token is never a target
      lab.index_put_({0, 1}, -100);  // a prompt token
      labels.push_back(lab);
    }
    const int64_t T = lens[0] + lens[1];  // 9: row 0 = examples 0 and 1; row 1 = example 2
    at::Tensor bids = at::full({2, T}, 2, lopts), blab = at::full({2, T}, -100, lopts);
    at::Tensor pos = at::zeros({2, T}, lopts), seg = at::zeros({2, T}, lopts);
    bids[0].narrow(0, 0, lens[0]).copy_(ids[0][0]);
    bids[0].narrow(0, lens[0], lens[1]).copy_(ids[1][0]);
    bids[1].narrow(0, 0, lens[2]).copy_(ids[2][0]);
    blab[0].narrow(0, 0, lens[0]).copy_(labels[0][0]);
    blab[0].narrow(0, lens[0], lens[1]).copy_(labels[1][0]);
    blab[1].narrow(0, 0, lens[2]).copy_(labels[2][0]);
    pos[0].narrow(0, 0, lens[0]).copy_(at::arange(lens[0], lopts));
    pos[0].narrow(0, lens[0], lens[1]).copy_(at::arange(lens[1], lopts));
    pos[1].copy_(at::arange(T, lopts));  // padding continues the positions
    seg[0].narrow(0, lens[0], lens[1]).fill_(1);
    seg[1].narrow(0, lens[2], T - lens[2]).fill_(1);  // padding: a segment of its own
    const RowLayout layout{pos, seg};
    ASSERT_TRUE(model.ValidateLayout(bids, layout).ok());
    // The span of each example in the batch: (row, start, len).
    const std::vector<std::array<int64_t, 3>> span = {{0, 0, lens[0]}, {0, lens[0], lens[1]},
                                                      {1, 0, lens[2]}};
    auto only = [&](size_t e) {  // the batch labels with every other example's ignored
      at::Tensor l = at::full({2, T}, -100, lopts);
      l[span[e][0]].narrow(0, span[e][1], span[e][2])
          .copy_(blab[span[e][0]].narrow(0, span[e][1], span[e][2]));
      return l;
    };
    std::vector<double> alone(3);
    {
      at::NoGradGuard no_grad;
      for (size_t e = 0; e < 3; ++e) {
        alone[e] = model.CausalLmLoss(ids[e], labels[e]).item<double>();
        const double packed = model.CausalLmLoss(bids, only(e), layout).item<double>();
        EXPECT_NEAR(packed, alone[e], 2e-6 * std::max(1.0, std::abs(alone[e]))) << "example " << e;
      }
      // The random model's attention is nearly uniform and its weights small, so crossing
      // the boundary moves the loss little, but far beyond the tolerance above.
      const double crossed = model.CausalLmLoss(bids, only(1)).item<double>();
      EXPECT_GT(std::abs(crossed - alone[1]), 10 * 2e-6 * std::max(1.0, std::abs(alone[1])))
          << "the control saw no boundary";
    }
    // Gradients: the packed batch's token mean vs the weighted examples alone.
    model.SetLinearMode(LinearMode::kDense);
    auto grads = [&]() {
      std::vector<at::Tensor> g;
      for (int64_t i = 0; i < model.num_linears(); ++i) {
        g.push_back(model.LinearWeight(i).grad().to(at::kDouble).clone());
      }
      model.ZeroLinearGrads();
      return g;
    };
    model.ZeroLinearGrads();
    model.CausalLmLoss(bids, blab, layout).backward();
    const std::vector<at::Tensor> packed = grads();
    double k_total = 0;
    std::vector<double> k(3);
    for (size_t e = 0; e < 3; ++e) {
      k[e] = (labels[e].narrow(1, 1, lens[e] - 1) != -100).sum().item<double>();
      k_total += k[e];
    }
    for (size_t e = 0; e < 3; ++e) {
      (model.CausalLmLoss(ids[e], labels[e]) * (k[e] / k_total)).backward();
    }
    const std::vector<at::Tensor> reference = grads();
    for (int64_t i = 0; i < model.num_linears(); ++i) {
      const double scale = reference[i].abs().max().item<double>();
      EXPECT_LE(MaxAbsDiff(packed[i], reference[i]), 1e-5 * std::max(scale, 1e-3))
          << model.LinearName(i);
    }
    model.SetActivationCheckpointing(true);
    model.CausalLmLoss(bids, blab, layout).backward();
    const std::vector<at::Tensor> checkpointed = grads();
    model.SetActivationCheckpointing(false);
    for (int64_t i = 0; i < model.num_linears(); ++i) {
      EXPECT_TRUE(at::equal(checkpointed[i], packed[i])) << model.LinearName(i);
    }
  }
}

TEST_F(TinyLlamaTest, BadRowLayoutsAreRefused) {
  const auto lopts = at::TensorOptions().dtype(at::kLong);
  at::Tensor pos = at::arange(kT, lopts).repeat({kB, 1});
  at::Tensor seg = at::zeros({kB, kT}, lopts);
  EXPECT_TRUE(model_->ValidateLayout(ids_, RowLayout{}).ok());
  EXPECT_TRUE(model_->ValidateLayout(ids_, RowLayout{pos, seg}).ok());
  auto code = [&](const RowLayout& l) { return model_->ValidateLayout(ids_, l).code(); };
  EXPECT_EQ(code(RowLayout{pos, at::Tensor()}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RowLayout{pos.narrow(1, 0, 3), seg}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RowLayout{pos.to(at::kInt), seg}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(RowLayout{pos - 1, seg}), absl::StatusCode::kInvalidArgument);
  at::Tensor down = seg.clone();
  down.index_put_({1, 0}, 1);  // 1, 0, 0, ...: decreasing
  const absl::Status st = model_->ValidateLayout(ids_, RowLayout{pos, down});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("segment_ids"), absl::string_view::npos) << st;
}

TEST_F(TinyLlamaTest, ErrorsAreStatuses) {
  // Projectors of the wrong shape.
  auto P = lsp::SparseProjector::Random(64, 8, 2, 5);
  auto Q = lsp::SparseProjector::Random(64, 8, 2, 6);
  ASSERT_TRUE(P.ok() && Q.ok());
  lsp::LspLinears lsp_linears(*model_);
  EXPECT_EQ(lsp_linears.SetProjectors(6, *P, *Q).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lsp_linears.SetProjectors(14, *P, *Q).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lsp_linears.SetProjectors(-1, *P, *Q).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(lsp_linears.SetProjectors(0, *P, *Q).ok());
  EXPECT_TRUE(lsp_linears.HasProjectors(0));
  EXPECT_FALSE(lsp_linears.HasProjectors(1));
  model_->SetLinearMode(LinearMode::kCustom);
  EXPECT_EQ(lsp_linears.ValidateReady(*model_).code(), absl::StatusCode::kFailedPrecondition);
  model_->SetLinearMode(LinearMode::kFrozen);
  model_->SetLinearMode(0, LinearMode::kCustom);
  EXPECT_TRUE(lsp_linears.ValidateReady(*model_).ok());

  // Tensors.
  EXPECT_EQ(model_->SetTensor("model.norm.weight", at::ones({63})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->SetTensor("model.norm.weight", at::ones({64}, at::kLong)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->SetTensor("model.nope.weight", at::ones({64})).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(model_->SetTensor("lm_head.weight", at::ones({97, 64})).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->GetTensor("lm_head.weight").status().code(), absl::StatusCode::kNotFound);
  at::Tensor alias = model_->LinearWeight(3);
  ASSERT_TRUE(
      model_->SetTensor("model.layers.0.self_attn.o_proj.weight", at::full({64, 64}, 0.5, at::kDouble))
          .ok());
  EXPECT_TRUE(alias.eq(0.5).all().item<bool>());  // in place: aliases see the new values

  // Batches.
  EXPECT_TRUE(model_->ValidateBatch(ids_, labels_, torch::tensor({0, 1, 6}, torch::kLong)).ok());
  EXPECT_EQ(model_->ValidateBatch(ids_ + 97).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->ValidateBatch(ids_.to(at::kInt)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->ValidateBatch(ids_.view(-1)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->ValidateBatch(at::Tensor()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->ValidateBatch(ids_, labels_ - 200).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->ValidateBatch(ids_, labels_.narrow(1, 0, 3)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model_->ValidateBatch(ids_, {}, torch::tensor({0, 1, 7}, torch::kLong)).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace lspo::model
