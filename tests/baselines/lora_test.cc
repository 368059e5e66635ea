// LoRA adapters (baselines/lora.h) against Hugging Face PEFT and float64 references.
// Oracle: tests/oracle/data/peft_oracle.json and the adapter folders in
// tests/oracle/data/peft/, made by tests/oracle/make_peft_oracle.py with PEFT 0.21 on the
// fp32 Llama oracle model (tests/oracle/data/hf_models/llama-fp32).
#include "baselines/lora.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "gtest/gtest.h"
#include "model/hf_checkpoint.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "offload/job_assets.h"
#include "proto/job_spec.pb.h"
#include "tests/test_files.h"

namespace lspo::baselines {
namespace {

namespace fs = std::filesystem;

constexpr char kBase[] = "tests/oracle/data/hf_models/llama-fp32";
constexpr char kPeftDir[] = "tests/oracle/data/peft";

const nlohmann::json& Oracle() {
  static const nlohmann::json* oracle = new nlohmann::json(
      nlohmann::json::parse(tests::ReadAll("tests/oracle/data/peft_oracle.json")));
  return *oracle;
}

model::LlamaModel Base() {
  auto ckpt = model::HfCheckpoint::Open(kBase);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  auto m = model::LlamaModel::FromHfCheckpoint(*ckpt);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(*m);
}

at::Tensor Ids(const nlohmann::json& rows) {
  std::vector<int64_t> v;
  for (const auto& r : rows) {
    for (const auto& x : r) v.push_back(x.get<int64_t>());
  }
  return torch::tensor(v, at::kLong).view({static_cast<int64_t>(rows.size()), -1});
}

at::Tensor Logits(const nlohmann::json& rows) {  // [B][T][V] -> (B, T, V) fp64
  std::vector<double> v;
  for (const auto& seq : rows) {
    for (const auto& row : seq) {
      for (const auto& x : row) v.push_back(x.get<double>());
    }
  }
  const int64_t B = static_cast<int64_t>(rows.size()), T = static_cast<int64_t>(rows[0].size());
  return torch::tensor(v, at::kDouble).view({B, T, -1});
}

// Max |a - b| / max |b|.
double RelErr(const at::Tensor& a, const at::Tensor& b) {
  return ((a.to(at::kDouble) - b).abs().max() / b.abs().max()).item<double>();
}

std::string Scratch(const std::string& tag) {
  const fs::path p = fs::path(::testing::TempDir()) / ("lora_test_" + tag);
  fs::remove_all(p);
  return p.string();
}

// The PEFT adapters of the oracle give PEFT's logits, with grad mode on and off.
TEST(LoraPeftOracleTest, AdapterLogitsMatchPeft) {
  for (const char* name : {"lora-r4", "lora-r2-rs"}) {
    SCOPED_TRACE(name);
    const auto& o = Oracle()["adapters"][name];
    model::LlamaModel base = Base();
    const at::Tensor ids = Ids(o["input_ids"]);
    const at::Tensor want = Logits(o["logits"]);
    at::Tensor plain;
    {
      at::NoGradGuard g;
      plain = base.Logits(ids);
    }
    auto adapter = ReadPeftAdapter(std::string(kPeftDir) + "/" + name, base);
    ASSERT_TRUE(adapter.ok()) << adapter.status();
    (*adapter)->Attach(&base);
    EXPECT_EQ((*adapter)->settings().r, o["config"]["r"].get<int64_t>());
    {
      at::NoGradGuard g;  // evaluation and generation run this way
      EXPECT_LT(RelErr(base.Logits(ids), want), 2e-5);
    }
    at::Tensor with_grad = base.Logits(ids);  // training forward (autograd through A, B)
    EXPECT_LT(RelErr(with_grad.detach(), want), 2e-5);
    // Control: the base model alone is far from PEFT's logits.
    EXPECT_GT(RelErr(plain, want), 1e-2);
    // The loss HF computes with labels = input_ids.
    at::NoGradGuard g;
    EXPECT_NEAR(base.CausalLmLoss(ids, ids).item<double>(), o["loss"].get<double>(), 2e-5);
  }
}

// The merged weights W + scaling B A give the same logits (PEFT's merge_and_unload).
TEST(LoraPeftOracleTest, MergedModelMatchesPeft) {
  for (const char* name : {"lora-r4", "lora-r2-rs"}) {
    SCOPED_TRACE(name);
    const auto& o = Oracle()["adapters"][name];
    model::LlamaModel base = Base();
    auto adapter = ReadPeftAdapter(std::string(kPeftDir) + "/" + name, base);
    ASSERT_TRUE(adapter.ok()) << adapter.status();
    model::LlamaModel merged = Base();
    for (const auto& [n, t] : (*adapter)->MergedTensors(base)) {
      ASSERT_TRUE(merged.SetTensor(n, t).ok()) << n;
    }
    at::NoGradGuard g;
    EXPECT_LT(RelErr(merged.Logits(Ids(o["input_ids"])), Logits(o["logits"])), 2e-5);
    // PEFT's scaling: alpha / r, or alpha / sqrt(r) with rsLoRA.
    const double r = o["config"]["r"], alpha = o["config"]["lora_alpha"];
    const bool rs = o["config"].value("use_rslora", false);
    EXPECT_DOUBLE_EQ((*adapter)->scaling(), rs ? alpha / std::sqrt(r) : alpha / r);
  }
}

// A job spec's model.adapter_path merges the adapter at load (offload::LoadJobModel, what the
// worker, the optimizer and lspctl eval / generate use): PEFT's logits again.
TEST(LoraPeftOracleTest, AJobModelWithAnAdapterPathIsThePeftModel) {
  const auto& o = Oracle()["adapters"]["lora-r4"];
  v1::JobSpec spec;
  spec.mutable_model()->set_path(kBase);
  spec.mutable_model()->set_format(v1::MODEL_FORMAT_HF);
  spec.mutable_model()->set_adapter_path(std::string(kPeftDir) + "/lora-r4");
  auto m = offload::LoadJobModel(spec);
  ASSERT_TRUE(m.ok()) << m.status();
  at::NoGradGuard g;
  EXPECT_LT(RelErr(m->Logits(Ids(o["input_ids"])), Logits(o["logits"])), 2e-5);
  spec.mutable_model()->set_adapter_path(std::string(kPeftDir) + "/no-such-adapter");
  auto missing = offload::LoadJobModel(spec);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("job spec field model.adapter_path"),
            std::string::npos)
      << missing.status();
}

// Writing an adapter and reading it back gives the same tensors, under PEFT's keys.
TEST(LoraPeftFolderTest, WriteReadRoundTrip) {
  model::LlamaModel base = Base();
  auto adapter = ReadPeftAdapter(std::string(kPeftDir) + "/lora-r2-rs", base);
  ASSERT_TRUE(adapter.ok()) << adapter.status();
  const std::string dir = Scratch("roundtrip") + "/adapter";
  auto files = WritePeftAdapter(**adapter, base, kBase, dir);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_EQ(files->size(), 2u);
  const nlohmann::json c = nlohmann::json::parse(tests::ReadAll(dir + "/adapter_config.json"));
  EXPECT_EQ(c["peft_type"], "LORA");
  EXPECT_EQ(c["task_type"], "CAUSAL_LM");
  EXPECT_EQ(c["r"], 2);
  EXPECT_EQ(c["lora_alpha"], 3.0);
  EXPECT_EQ(c["use_rslora"], true);
  EXPECT_EQ(c["target_modules"], nlohmann::json({"q_proj", "down_proj"}));
  EXPECT_EQ(c["base_model_name_or_path"], kBase);
  // The same tensor names, shapes and values as PEFT's own file.
  auto ours = model::SafetensorsFile::Open(dir + "/adapter_model.safetensors");
  auto peft = model::SafetensorsFile::Open(std::string(kPeftDir) +
                                           "/lora-r2-rs/adapter_model.safetensors");
  ASSERT_TRUE(ours.ok() && peft.ok());
  std::vector<std::string> a = ours->names(), b = peft->names();
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  EXPECT_EQ(a, b);
  for (const std::string& n : b) {
    EXPECT_EQ(*ours->ReadF32(n), *peft->ReadF32(n)) << n;
  }
  auto again = ReadPeftAdapter(dir, base);
  ASSERT_TRUE(again.ok()) << again.status();
  for (int64_t i = 0; i < base.num_linears(); ++i) {
    ASSERT_EQ((*again)->targets(i), (*adapter)->targets(i));
    if (!(*again)->targets(i)) continue;
    EXPECT_TRUE(at::equal((*again)->A(i), (*adapter)->A(i)));
    EXPECT_TRUE(at::equal((*again)->B(i), (*adapter)->B(i)));
  }
}

// PEFT's initialisation: A ~ U(-1/sqrt(n), 1/sqrt(n)), B = 0 (the model is unchanged), and
// the draw is deterministic in the seed.
TEST(LoraAdapterTest, CreateInitialisesAsPeft) {
  model::LlamaModel m = Base();
  const at::Tensor ids = torch::randint(3, 320, {2, 10}, at::kLong);
  at::Tensor before;
  {
    at::NoGradGuard g;
    before = m.Logits(ids);
  }
  LoraSettings s;
  s.r = 4;
  s.alpha = 16;
  auto a1 = LoraAdapter::Create(m, s, 11);
  auto a2 = LoraAdapter::Create(m, s, 11);
  auto a3 = LoraAdapter::Create(m, s, 12);
  ASSERT_TRUE(a1.ok() && a2.ok() && a3.ok());
  EXPECT_EQ((*a1)->settings().target_modules.size(), 7u);  // empty = all seven
  EXPECT_DOUBLE_EQ((*a1)->scaling(), 4.0);
  int64_t params = 0;
  for (int64_t i = 0; i < m.num_linears(); ++i) {
    ASSERT_TRUE((*a1)->targets(i));
    const at::Tensor& A = (*a1)->A(i);
    const int64_t n = m.LinearWeight(i).size(1), rows = m.LinearWeight(i).size(0);
    ASSERT_EQ(A.sizes(), at::IntArrayRef({4, n}));
    ASSERT_EQ((*a1)->B(i).sizes(), at::IntArrayRef({rows, 4}));
    EXPECT_TRUE(A.requires_grad());
    const double bound = 1 / std::sqrt(static_cast<double>(n));
    EXPECT_LE(A.abs().max().item<double>(), bound);
    EXPECT_GT(A.abs().max().item<double>(), 0.8 * bound);
    EXPECT_EQ((*a1)->B(i).abs().max().item<double>(), 0.0);
    EXPECT_TRUE(at::equal(A, (*a2)->A(i)));
    EXPECT_FALSE(at::equal(A, (*a3)->A(i)));
    params += 4 * (n + rows);
  }
  EXPECT_EQ((*a1)->NumParameters(), params);
  // U(-b, b) has standard deviation b / sqrt(3): over every A of the model.
  const at::Tensor& A0 = (*a1)->A(0);
  const double b0 = 1 / std::sqrt(static_cast<double>(A0.size(1)));
  EXPECT_NEAR(A0.std().item<double>(), b0 / std::sqrt(3.0), 0.15 * b0);
  (*a1)->Attach(&m);
  at::NoGradGuard g;
  EXPECT_TRUE(at::allclose(m.Logits(ids), before, 0, 0));  // B = 0: nothing changes
  EXPECT_EQ(m.linear_mode(0), model::LinearMode::kCustom);
  EXPECT_FALSE(m.LinearWeight(0).requires_grad());
}

// The adapters' gradients equal the float64 formulas dB = s g^T (x A^T), dA = s (g B)^T x,
// and dX = g W + s (g B) A, for y = x W^T + s (x A^T) B^T and loss = sum(y * g).
TEST(LoraAdapterTest, GradientsMatchFloat64Formulas) {
  model::LlamaModel m = Base();
  LoraSettings s;
  s.r = 3;
  s.alpha = 5;
  s.target_modules = {"up_proj"};
  auto made = LoraAdapter::Create(m, s, 5);
  ASSERT_TRUE(made.ok()) << made.status();
  LoraAdapter& ad = **made;
  const int64_t i = model::LinearIndex(1, model::LinearKind::kUp);
  ASSERT_TRUE(ad.targets(i));
  ASSERT_FALSE(ad.targets(model::LinearIndex(1, model::LinearKind::kGate)));
  {
    at::NoGradGuard g;
    ad.B(i).normal_(0, 0.3);  // a trained-looking B, so every term is non-zero
  }
  const at::Tensor w = m.LinearWeight(i);  // (96, 64)
  at::Tensor x = torch::randn({7, w.size(1)}).requires_grad_(true);
  const at::Tensor g = torch::randn({7, w.size(0)});
  at::Tensor y = ad.Forward(x, w, i);
  (y * g).sum().backward();
  const double sc = ad.scaling();
  EXPECT_DOUBLE_EQ(sc, 5.0 / 3.0);
  auto d = [](const at::Tensor& t) { return t.detach().to(at::kDouble); };
  const at::Tensor X = d(x), G = d(g), W = d(w), A = d(ad.A(i)), B = d(ad.B(i));
  const at::Tensor y64 = X.mm(W.t()) + sc * X.mm(A.t()).mm(B.t());
  const at::Tensor dB = sc * G.t().mm(X.mm(A.t()));
  const at::Tensor dA = sc * G.mm(B).t().mm(X);
  const at::Tensor dX = G.mm(W) + sc * G.mm(B).mm(A);
  EXPECT_LT(RelErr(y.detach(), y64), 1e-6);
  EXPECT_LT(RelErr(ad.B(i).grad(), dB), 1e-6);
  EXPECT_LT(RelErr(ad.A(i).grad(), dA), 1e-6);
  EXPECT_LT(RelErr(x.grad(), dX), 1e-6);
  // The merged weight is W + s B A.
  EXPECT_LT(RelErr(ad.MergedWeight(i, w), W + sc * B.mm(A)), 1e-7);
}

TEST(LoraAdapterTest, BadSettingsAreRefusedByName) {
  model::LlamaModel m = Base();
  auto refuse = [&](LoraSettings s, const std::string& needle) {
    auto a = LoraAdapter::Create(m, s, 1);
    ASSERT_FALSE(a.ok()) << needle;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find(needle), std::string::npos) << a.status();
  };
  LoraSettings s;
  s.r = 0;
  refuse(s, "r = 0");
  s.r = 65;  // above every matrix's smaller side: the first target, q_proj (96 x 64), is named,
             // and the limit is the smallest side of all targets (k/v_proj, 48 x 64)
  refuse(s, "model.layers.0.self_attn.q_proj.weight (96 x 64): use r <= 48");
  s.r = 49;  // k_proj is 48 x 64: its smaller side is 48
  s.target_modules = {"q_proj", "k_proj"};
  refuse(s, "exceeds the smaller side of model.layers.0.self_attn.k_proj.weight");
  s.target_modules = {"q_proj"};  // q_proj is 96 x 64: r = 49 fits
  EXPECT_TRUE(LoraAdapter::Create(m, s, 1).ok());
  s.r = 4;
  s.target_modules = {"lm_head"};
  refuse(s, "'lm_head' is not a linear");
  s.target_modules = {"q_proj", "q_proj"};
  refuse(s, "named twice");
  s.target_modules = {};
  s.alpha = std::nan("");
  refuse(s, "lora_alpha");
}

// A copy of an oracle adapter folder whose config or tensors a test then breaks.
std::string CopyAdapter(const std::string& tag) {
  const std::string dst = Scratch(tag);
  fs::copy(std::string(kPeftDir) + "/lora-r2-rs", dst, fs::copy_options::recursive);
  return dst;
}

void EditConfig(const std::string& dir, const std::function<void(nlohmann::json*)>& edit) {
  nlohmann::json c = nlohmann::json::parse(tests::ReadAll(dir + "/adapter_config.json"));
  edit(&c);
  std::ofstream(dir + "/adapter_config.json") << c.dump();
}

TEST(LoraPeftFolderTest, BadAdaptersAreRefused) {
  model::LlamaModel m = Base();
  auto expect = [&](const std::string& dir, absl::StatusCode code, const std::string& needle) {
    auto a = ReadPeftAdapter(dir, m);
    ASSERT_FALSE(a.ok()) << needle;
    EXPECT_EQ(a.status().code(), code) << a.status();
    EXPECT_NE(a.status().message().find(needle), std::string::npos) << a.status();
  };
  expect(Scratch("missing"), absl::StatusCode::kNotFound, "adapter_config.json");
  std::string d = CopyAdapter("type");
  EditConfig(d, [](nlohmann::json* c) { (*c)["peft_type"] = "IA3"; });
  expect(d, absl::StatusCode::kInvalidArgument, "peft_type");
  d = CopyAdapter("dora");
  EditConfig(d, [](nlohmann::json* c) { (*c)["use_dora"] = true; });
  expect(d, absl::StatusCode::kUnimplemented, "use_dora");
  d = CopyAdapter("regex");
  EditConfig(d, [](nlohmann::json* c) { (*c)["target_modules"] = ".*q_proj"; });
  expect(d, absl::StatusCode::kInvalidArgument, "regular expression");
  d = CopyAdapter("rank");
  EditConfig(d, [](nlohmann::json* c) { (*c)["r"] = 3; });  // the tensors are rank 2
  expect(d, absl::StatusCode::kInvalidArgument, "has shape [2, 64] but the model needs [3, 64]");
  d = CopyAdapter("more_targets");
  EditConfig(d, [](nlohmann::json* c) { (*c)["target_modules"].push_back("v_proj"); });
  expect(d, absl::StatusCode::kInvalidArgument,
         "has no tensor base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight");
  d = CopyAdapter("fewer_targets");
  EditConfig(d, [](nlohmann::json* c) { (*c)["target_modules"] = {"q_proj"}; });
  expect(d, absl::StatusCode::kInvalidArgument, "belongs to no target module");
  d = CopyAdapter("garbage");
  std::ofstream(d + "/adapter_config.json") << "{not json";
  expect(d, absl::StatusCode::kInvalidArgument, "not a JSON object");
  // A NaN in a tensor.
  d = CopyAdapter("nan");
  {
    auto f = model::SafetensorsFile::Open(d + "/adapter_model.safetensors");
    ASSERT_TRUE(f.ok());
    std::vector<std::vector<float>> values;
    std::vector<model::SafetensorsEntry> entries;
    for (const std::string& n : f->names()) values.push_back(*f->ReadF32(n));
    values[0][1] = std::nanf("");
    for (size_t k = 0; k < f->names().size(); ++k) {
      const std::string& n = f->names()[k];
      entries.push_back({n, "F32", *f->shape(n), values[k].data(), values[k].size() * 4});
    }
    ASSERT_TRUE(model::WriteSafetensors(d + "/adapter_model.safetensors", entries, {}).ok());
  }
  expect(d, absl::StatusCode::kDataLoss, "non-finite");
}

}  // namespace
}  // namespace lspo::baselines
