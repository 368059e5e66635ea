// LlamaModel training features: activation checkpointing (gradients bitwise those of the plain
// graph, dense and LSP), bf16 weight storage (forward equals fp32 weights rounded to bf16;
// an update below bf16 resolution is lost), and the per-layer hooks' order.
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "gtest/gtest.h"
#include "lsp/lsp_linear.h"
#include "lsp/projector.h"
#include "model/llama.h"
#include "model/llama_config.h"

namespace lspo::model {
namespace {

constexpr int64_t kVocab = 97;

class LlamaFeaturesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LlamaModel::RandomInit(TinyLlamaConfig(kVocab), 42);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::make_unique<LlamaModel>(std::move(*m));
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(5);
    ids_ = at::randint(0, kVocab, {2, 9}, gen, at::TensorOptions().dtype(at::kLong));
  }
  // Dense weight gradients of every linear after one backward.
  std::vector<at::Tensor> DenseGrads(bool checkpointing) {
    model_->SetActivationCheckpointing(checkpointing);
    model_->SetLinearMode(LinearMode::kDense);
    model_->ZeroLinearGrads();
    model_->CausalLmLoss(ids_, ids_).backward();
    std::vector<at::Tensor> g;
    for (int64_t i = 0; i < model_->num_linears(); ++i) {
      g.push_back(model_->LinearWeight(i).grad().clone());
    }
    return g;
  }
  std::unique_ptr<LlamaModel> model_;
  at::Tensor ids_;
};

TEST_F(LlamaFeaturesTest, CheckpointingGivesBitwiseSameDenseGradients) {
  std::vector<at::Tensor> plain = DenseGrads(false);
  std::vector<at::Tensor> ckpt = DenseGrads(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    ASSERT_TRUE(plain[i].defined() && ckpt[i].defined()) << model_->LinearName(i);
    EXPECT_GT(plain[i].abs().max().item<float>(), 0.0f);
    EXPECT_TRUE(at::equal(plain[i], ckpt[i])) << model_->LinearName(i);
  }
}

TEST_F(LlamaFeaturesTest, CheckpointingGivesBitwiseSameCompressedGradients) {
  auto lsp_linears = std::make_shared<lsp::LspLinears>(*model_);
  model_->SetLinearImpl(lsp_linears);
  for (int64_t i = 0; i < model_->num_linears(); ++i) {
    const at::Tensor& w = model_->LinearWeight(i);
    auto p = lsp::SparseProjector::Random(w.size(0), 8, 2, 100 + i);
    auto q = lsp::SparseProjector::Random(w.size(1), 8, 2, 200 + i);
    ASSERT_TRUE(p.ok() && q.ok());
    ASSERT_TRUE(lsp_linears->SetProjectors(i, *p, *q).ok());
  }
  model_->SetLinearMode(LinearMode::kCustom);
  std::map<int64_t, at::Tensor> s_plain, s_ckpt;
  std::map<int64_t, at::Tensor>* target = &s_plain;
  lsp_linears->SetSink([&](int64_t i, const at::Tensor& s) { (*target)[i] = s; });
  model_->SetActivationCheckpointing(false);
  model_->CausalLmLoss(ids_, ids_).backward();
  target = &s_ckpt;
  model_->SetActivationCheckpointing(true);
  model_->CausalLmLoss(ids_, ids_).backward();
  ASSERT_EQ(s_plain.size(), static_cast<size_t>(model_->num_linears()));
  ASSERT_EQ(s_ckpt.size(), s_plain.size());
  for (auto& [i, s] : s_plain) EXPECT_TRUE(at::equal(s, s_ckpt[i])) << model_->LinearName(i);
}

TEST_F(LlamaFeaturesTest, Bf16StorageEqualsFp32WeightsRoundedToBf16) {
  // Reference: a second model whose fp32 weights are the bf16-rounded values.
  auto ref = LlamaModel::RandomInit(TinyLlamaConfig(kVocab), 42);
  ASSERT_TRUE(ref.ok());
  for (int64_t i = 0; i < ref->num_linears(); ++i) {
    at::Tensor& w = ref->LinearWeight(i);
    w.copy_(w.to(at::kBFloat16).to(at::kFloat));
  }
  ASSERT_TRUE(model_->SetLinearStorageDtype(at::kBFloat16).ok());
  EXPECT_EQ(model_->LinearWeight(0).scalar_type(), at::kBFloat16);
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(model_->Logits(ids_), ref->Logits(ids_)));
  EXPECT_EQ(model_->SetLinearStorageDtype(at::kHalf).code(), absl::StatusCode::kInvalidArgument);
  // An update far below bf16 resolution (|w| ~ 0.02, ulp ~ 1e-4) leaves bf16 weights as they
  // were: the rounding the master-weight refresh exists to undo.
  at::Tensor& w = model_->LinearWeight(0);
  at::Tensor before = w.clone();
  w.copy_(w.to(at::kFloat) + 1e-7);
  at::Tensor big = before.to(at::kFloat).abs() > 1e-3;  // ulp >= 2^-17 > 2 * 1e-7 there
  EXPECT_GT(big.sum().item<int64_t>(), before.numel() / 2);
  EXPECT_TRUE(at::equal(w.masked_select(big), before.masked_select(big)));
}

// Issue 42: a CUDA worker stores the frozen embedding, head and norms in bf16. The hidden
// states are bitwise those of fp32 tensors holding the bf16-rounded values (rows upcast, norm
// weights exact), the head's GEMM runs in bf16 (its logits and the loss's gradients within bf16
// rounding of the fp32 head), linears and trainable tensors keep their dtype.
TEST_F(LlamaFeaturesTest, Bf16FrozenTensorsComputeWithTheirRoundedValues) {
  for (bool untied : {false, true}) {
    SCOPED_TRACE(untied ? "untied head" : "tied head");
    LlamaConfig cfg = TinyLlamaConfig(kVocab);
    cfg.tie_word_embeddings = !untied;
    auto m = LlamaModel::RandomInit(cfg, 42);
    auto ref = LlamaModel::RandomInit(cfg, 42);
    ASSERT_TRUE(m.ok() && ref.ok());
    int64_t frozen = 0;
    for (auto& [name, t] : ref->NamedTensors()) {
      const bool linear_or_bias = name.find("_proj.") != std::string::npos;
      if (linear_or_bias) continue;
      at::NoGradGuard no_grad;
      t.copy_(t.to(at::kBFloat16).to(at::kFloat));
      ++frozen;
    }
    ASSERT_TRUE(m->SetFrozenStorageDtype(at::kBFloat16).ok());
    int64_t bf16 = 0;
    for (const auto& [name, t] : m->NamedTensors()) {
      const bool linear_or_bias = name.find("_proj.") != std::string::npos;
      EXPECT_EQ(t.scalar_type(), linear_or_bias ? at::kFloat : at::kBFloat16) << name;
      bf16 += t.scalar_type() == at::kBFloat16;
    }
    EXPECT_EQ(bf16, frozen);
    EXPECT_GE(bf16, 2 * cfg.num_layers + 2);  // two norms a layer, the final norm, embedding
    {
      at::NoGradGuard no_grad;
      EXPECT_TRUE(at::equal(m->Hidden(ids_), ref->Hidden(ids_)));
      const at::Tensor logits = m->Logits(ids_), want = ref->Logits(ids_);  // (B, T, V) fp32
      EXPECT_EQ(logits.scalar_type(), at::kFloat);
      const double rel = ((logits - want).norm() / want.norm()).item<double>();
      EXPECT_LT(rel, 1e-2);
      EXPECT_GT(rel, 0.0);  // the head's GEMM did run in bf16
    }
    // Backward through the bf16 head: dense linear gradients within bf16 rounding.
    for (LlamaModel* x : {&*m, &*ref}) {
      x->SetLinearMode(LinearMode::kDense);
      x->ZeroLinearGrads();
      x->CausalLmLoss(ids_, ids_).backward();
    }
    for (int64_t i = 0; i < m->num_linears(); ++i) {
      const at::Tensor g = m->LinearWeight(i).grad(), want = ref->LinearWeight(i).grad();
      EXPECT_LT(((g - want).norm() / want.norm()).item<double>(), 2e-2) << m->LinearName(i);
    }
  }
  // A tensor that needs a gradient (a trained tied embedding) keeps fp32.
  auto trained = LlamaModel::RandomInit(TinyLlamaConfig(kVocab), 42);
  ASSERT_TRUE(trained.ok());
  absl::StatusOr<at::Tensor> embed = trained->GetTensor("model.embed_tokens.weight");
  ASSERT_TRUE(embed.ok());
  embed->requires_grad_(true);
  ASSERT_TRUE(trained->SetFrozenStorageDtype(at::kBFloat16).ok());
  EXPECT_EQ(trained->GetTensor("model.embed_tokens.weight")->scalar_type(), at::kFloat);
  EXPECT_EQ(trained->GetTensor("model.norm.weight")->scalar_type(), at::kBFloat16);
  EXPECT_EQ(trained->SetFrozenStorageDtype(at::kHalf).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(LlamaFeaturesTest, ToCpuKeepsEverythingAndAMissingDeviceFailsCleanly) {
  model_->SetLinearMode(LinearMode::kDense);
  at::Tensor ref;
  {
    at::NoGradGuard no_grad;
    ref = model_->Logits(ids_);  // (B, T, V) fp32
  }
  // CPU -> CPU: values, dtypes and requires_grad flags are kept.
  ASSERT_TRUE(model_->To(at::Device(at::kCPU)).ok());
  EXPECT_TRUE(model_->LinearWeight(0).requires_grad());
  EXPECT_TRUE(model_->device().is_cpu());
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(at::equal(model_->Logits(ids_), ref));
  }
  if (torch::cuda::is_available()) return;  // The next test covers a real device.
  // A CPU-only LibTorch: a clear kInvalidArgument naming the device; the model stays put.
  absl::Status st = model_->To(at::Device(at::kCUDA, 0));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("cuda:0"), std::string::npos) << st.message();
  EXPECT_TRUE(model_->device().is_cpu());
  at::NoGradGuard no_grad;
  EXPECT_TRUE(at::equal(model_->Logits(ids_), ref));
}

TEST_F(LlamaFeaturesTest, ToCudaMovesEveryTensorAndKeepsTheLogits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device: compiled, not run";
  const at::Device gpu(at::kCUDA, 0);
  model_->SetLinearMode(LinearMode::kDense);
  at::NoGradGuard no_grad;
  at::Tensor ref = model_->Logits(ids_);  // (B, T, V) fp32 on the CPU
  at::Tensor labels = ids_.clone();
  labels.narrow(1, 0, 3).fill_(-100);  // Ignored targets, as in chat examples.
  const double loss_ref = model_->CausalLmLoss(ids_, labels).item<double>();
  ASSERT_TRUE(model_->To(gpu).ok());
  for (const auto& [name, t] : model_->NamedTensors()) EXPECT_TRUE(t.is_cuda()) << name;
  EXPECT_TRUE(model_->LinearWeight(0).requires_grad());
  at::Tensor out = model_->Logits(ids_.to(gpu)).cpu();
  // fp32 on both sides (cuBLAS without TF32 by default): relative Frobenius error << 1e-4.
  EXPECT_LT((out - ref).norm().item<double>() / ref.norm().item<double>(), 1e-4);
  // The GPU loss (all rows, ignore_index) equals the CPU one (gathered target rows).
  EXPECT_NEAR(model_->CausalLmLoss(ids_.to(gpu), labels.to(gpu)).item<double>(), loss_ref,
              1e-4 * std::abs(loss_ref));
}

TEST_F(LlamaFeaturesTest, LayerHooksRunInForwardAndBackwardOrder) {
  std::vector<std::string> calls;
  auto record = [&calls](const char* what) {
    return [&calls, what](int64_t l) {
      calls.push_back(what + std::to_string(l));
      return absl::OkStatus();
    };
  };
  model_->SetLayerHooks(record("pre"), record("post"), record("bwd"));
  model_->SetLinearMode(LinearMode::kDense);
  model_->CausalLmLoss(ids_, ids_).backward();
  // TinyLlamaConfig has 2 layers; layer 0's input (the frozen embedding) needs no gradient.
  EXPECT_EQ(calls, (std::vector<std::string>{"pre0", "post0", "pre1", "post1", "bwd1"}));
  EXPECT_TRUE(model_->HookStatus().ok());
}

// A failing hook reports its status with its code (no exception crosses the model): the
// forward completes, no later hook of the pass runs, and HookStatus() keeps the first failure
// until it is cleared.
TEST_F(LlamaFeaturesTest, AFailingHookKeepsItsCodeAndStopsLaterHooks) {
  std::vector<std::string> calls;
  model_->SetLayerHooks(
      [&](int64_t l) -> absl::Status {
        calls.push_back("pre" + std::to_string(l));
        if (l == 1) return absl::DeadlineExceededError("pending update of layer 1 timed out");
        return absl::OkStatus();
      },
      [&](int64_t l) -> absl::Status {
        calls.push_back("post" + std::to_string(l));
        return absl::DataLossError("never reported: the first failure wins");
      },
      [&](int64_t l) -> absl::Status {
        calls.push_back("bwd" + std::to_string(l));
        return absl::OkStatus();
      });
  model_->SetLinearMode(LinearMode::kDense);
  at::Tensor loss = model_->CausalLmLoss(ids_, ids_);
  EXPECT_TRUE(std::isfinite(loss.item<double>()));
  // post0 fails first (DataLoss); pre1 and everything after are skipped.
  EXPECT_EQ(calls, (std::vector<std::string>{"pre0", "post0"}));
  EXPECT_EQ(model_->HookStatus().code(), absl::StatusCode::kDataLoss);
  loss.backward();
  EXPECT_EQ(calls.size(), 2u);  // the backward hook is skipped too
  EXPECT_EQ(model_->HookStatus().code(), absl::StatusCode::kDataLoss);

  model_->ClearHookStatus();
  calls.clear();
  model_->SetLayerHooks(
      [&](int64_t l) -> absl::Status {
        calls.push_back("pre" + std::to_string(l));
        if (l == 1) return absl::DeadlineExceededError("pending update of layer 1 timed out");
        return absl::OkStatus();
      },
      nullptr, nullptr);
  model_->CausalLmLoss(ids_, ids_);
  EXPECT_EQ(calls, (std::vector<std::string>{"pre0", "pre1"}));
  EXPECT_EQ(model_->HookStatus().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(model_->HookStatus().message(), "pending update of layer 1 timed out");
}

}  // namespace
}  // namespace lspo::model
