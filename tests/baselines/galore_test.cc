// GaLore's projector and AdamW (baselines/galore.h) against the galore-torch package and
// float64 references. Oracle: tests/oracle/data/galore_oracle.json, made by
// tests/oracle/make_galore_oracle.py with galore-torch 1.0 on torch 2.15 (PyPI).
#include "baselines/galore.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_files.h"

namespace lspo::baselines {
namespace {

const nlohmann::json& Oracle() {
  static const nlohmann::json* oracle = new nlohmann::json(
      nlohmann::json::parse(tests::ReadAll("tests/oracle/data/galore_oracle.json")));
  return *oracle;
}

at::Tensor Matrix(const nlohmann::json& rows) {  // [m][n] -> (m, n) fp64
  std::vector<double> v;
  for (const auto& r : rows) {
    for (const auto& x : r) v.push_back(x.get<double>());
  }
  return torch::tensor(v, at::kDouble).view({static_cast<int64_t>(rows.size()), -1});
}

const std::vector<std::string> kNames = {"right", "left", "square"};

struct GaloreRun {
  std::vector<at::Tensor> params;
  std::unique_ptr<GaloreAdamW> opt;
};

GaloreRun Make(int64_t gap, int64_t rank) {
  const auto& o = Oracle();
  const auto& s = o["settings"];
  GaloreRun run;
  for (const auto& k : kNames) {
    run.params.push_back(Matrix(o["w0"][k]).to(at::kFloat).requires_grad_(true));
  }
  GaloreSettings g;
  g.rank = rank;
  g.update_proj_gap = gap;
  g.scale = s["scale"].get<double>();
  GaloreAdamSettings adam;
  adam.beta1 = s["beta1"].get<double>();
  adam.beta2 = s["beta2"].get<double>();
  adam.eps = s["eps"].get<double>();
  adam.weight_decay = s["weight_decay"].get<double>();
  auto made = GaloreAdamW::Create(run.params, kNames, g, adam);
  EXPECT_TRUE(made.ok()) << made.status();
  if (made.ok()) run.opt = *std::move(made);
  return run;
}

void SetGrads(GaloreRun& run, int t) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    run.params[i].mutable_grad() = Matrix(Oracle()["grads"][kNames[i]][t]).to(at::kFloat);
  }
}

void CheckAgainstOracle(const std::string& which) {
  const auto& r = Oracle()["runs"][which];
  GaloreRun run =
      Make(r["update_proj_gap"].get<int64_t>(), Oracle()["settings"]["rank"].get<int64_t>());
  ASSERT_NE(run.opt, nullptr);
  const double lr = Oracle()["settings"]["lr"].get<double>();
  for (int t = 0; t < r["steps"].get<int>(); ++t) {
    SetGrads(run, t);
    ASSERT_TRUE(run.opt->Step(lr));
    for (size_t i = 0; i < kNames.size(); ++i) {
      const at::Tensor want = Matrix(r["after"][kNames[i]][t]);
      const at::Tensor got = run.params[i].detach().to(at::kDouble);
      const double diff = (got - want).abs().max().item<double>();
      // fp32 arithmetic and different LAPACK builds (OpenBLAS here, MKL in PyPI's torch):
      // the weights are O(1) and a step moves them by about lr = 0.02.
      EXPECT_LT(diff, 2e-6) << which << " " << kNames[i] << " after step " << t + 1;
    }
  }
  EXPECT_EQ(run.opt->step(), r["steps"].get<int64_t>());
  if (r["canonical_signs"].get<bool>()) {
    for (size_t i = 0; i < kNames.size(); ++i) {
      const at::Tensor want = Matrix(r["projectors"][kNames[i]]);
      const at::Tensor got = run.opt->projector(i).to(at::kDouble);
      ASSERT_EQ(got.sizes(), want.sizes()) << kNames[i];
      EXPECT_LT((got - want).abs().max().item<double>(), 1e-5) << kNames[i];
    }
  }
}

TEST(GaloreOracleTest, OneProjectorPeriodMatchesGaloreTorch) { CheckAgainstOracle("period"); }

TEST(GaloreOracleTest, RefreshesKeepTheMomentsAsGaloreTorchDoes) { CheckAgainstOracle("refresh"); }

TEST(GaloreProjectorTest, SidesShapesAndBestRankRApproximation) {
  at::manual_seed(3);
  for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{{20, 9}, {7, 15}, {10, 10}}) {
    const at::Tensor g = at::randn({m, n}, at::kDouble);
    const int64_t r = 4;
    auto p = GaloreProjector(g, r);
    ASSERT_TRUE(p.ok()) << p.status();
    const GaloreSide side = GaloreSideOf(m, n);
    EXPECT_EQ(side, m >= n ? GaloreSide::kRight : GaloreSide::kLeft);
    EXPECT_EQ(p->sizes(),
              (side == GaloreSide::kRight ? at::IntArrayRef({r, n}) : at::IntArrayRef({m, r})));
    EXPECT_EQ(p->scalar_type(), at::kFloat);
    // Orthonormal vectors.
    const at::Tensor pd = p->to(at::kDouble);
    const at::Tensor gram = side == GaloreSide::kRight ? at::mm(pd, pd.t()) : at::mm(pd.t(), pd);
    EXPECT_LT((gram - at::eye(r, at::kDouble)).abs().max().item<double>(), 1e-5);
    // Projecting and back is the best rank-r approximation: the residual is the tail of the
    // singular values (Eckart-Young), computed in float64.
    const at::Tensor back = GaloreProjectBack(GaloreProject(g, *p, side), *p, side);
    const double resid = (g - back.to(at::kDouble)).norm().item<double>();
    auto [u, s, vh] = at::linalg_svd(g, false);
    const double tail = s.narrow(0, r, s.size(0) - r).pow(2).sum().sqrt().item<double>();
    EXPECT_NEAR(resid, tail, 1e-4 * tail) << m << "x" << n;
    // Canonical signs: the largest-magnitude entry of each vector is positive.
    const at::Tensor vecs = side == GaloreSide::kRight ? pd : pd.t();
    for (int64_t k = 0; k < r; ++k) {
      const at::Tensor v = vecs[k];
      EXPECT_GT(v[v.abs().argmax().item<int64_t>()].item<double>(), 0) << k;
    }
  }
}

TEST(GaloreProjectorTest, RefusesBadInput) {
  const at::Tensor g = at::ones({6, 4});
  EXPECT_EQ(GaloreProjector(g, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GaloreProjector(g, 5).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GaloreProjector(at::ones({6}), 1).status().code(), absl::StatusCode::kInvalidArgument);
  at::Tensor bad = at::ones({6, 4});
  bad[1][2] = std::nan("");
  EXPECT_EQ(GaloreProjector(bad, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GaloreAdamWTest, RefusesBadSettingsByName) {
  std::vector<at::Tensor> params = {at::zeros({16, 8}).requires_grad_(true),
                                    at::zeros({4, 12}).requires_grad_(true)};
  std::vector<std::string> names = {"model.layers.0.mlp.up_proj",
                                    "model.layers.0.self_attn.k_proj"};
  auto create = [&](int64_t rank, int64_t gap, double scale) {
    GaloreSettings s;
    s.rank = rank;
    s.update_proj_gap = gap;
    s.scale = scale;
    return GaloreAdamW::Create(params, names, s, GaloreAdamSettings{}).status();
  };
  EXPECT_TRUE(create(4, 10, 0.25).ok());
  const absl::Status above = create(5, 10, 0.25);
  EXPECT_EQ(above.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(above.message().find("galore.rank = 5"), std::string::npos) << above;
  EXPECT_NE(above.message().find("model.layers.0.self_attn.k_proj (4 x 12)"), std::string::npos)
      << above;
  // The bound is the narrowest matrix's, even when a wider one comes first.
  const absl::Status nine = create(9, 10, 0.25);
  EXPECT_NE(nine.message().find("model.layers.0.self_attn.k_proj (4 x 12), the narrowest"),
            std::string::npos)
      << nine;
  EXPECT_NE(nine.message().find("use a rank <= 4"), std::string::npos) << nine;
  EXPECT_NE(create(0, 10, 0.25).message().find("galore.rank = 0"), std::string::npos);
  // The scale multiplies fp32 updates: it must be a normal fp32 number.
  EXPECT_NE(create(4, 10, 1e39).message().find("galore.scale"), std::string::npos);
  EXPECT_NE(create(4, 10, 1e-40).message().find("galore.scale"), std::string::npos);
  EXPECT_NE(create(4, 0, 0.25).message().find("galore.update_proj_gap = 0"), std::string::npos);
  EXPECT_NE(create(4, 10, std::nan("")).message().find("galore.scale"), std::string::npos);
  EXPECT_NE(create(4, 10, -1).message().find("galore.scale"), std::string::npos);
}

TEST(GaloreAdamWTest, NonFiniteGradientChangesNothing) {
  GaloreRun run = Make(2, 3);
  ASSERT_NE(run.opt, nullptr);
  SetGrads(run, 0);
  ASSERT_TRUE(run.opt->Step(0.02));
  std::vector<at::Tensor> before;
  for (const auto& p : run.params) before.push_back(p.detach().clone());
  SetGrads(run, 1);
  run.params[1].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
  EXPECT_FALSE(run.opt->Step(0.02));
  EXPECT_EQ(run.opt->step(), 1);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], run.params[i]));
}

TEST(GaloreAdamWTest, ClippingScalesTheGradientsAsClipGradNorm) {
  // Gradients 10 G clipped to the norm |G| are G again (up to torch's 1e-6 in the clip
  // factor): the run matches the unclipped run on G, and the reported norm is |10 G|.
  GaloreRun a = Make(200, 3), b = Make(200, 3);
  ASSERT_NE(a.opt, nullptr);
  ASSERT_NE(b.opt, nullptr);
  SetGrads(a, 0);
  SetGrads(b, 0);
  double norm = 0;
  ASSERT_TRUE(a.opt->Step(0.02, &norm));
  double sq = 0;
  for (const auto& k : kNames) sq += Matrix(Oracle()["grads"][k][0]).pow(2).sum().item<double>();
  EXPECT_NEAR(norm, std::sqrt(sq), 1e-6 * std::sqrt(sq));
  // b: the same gradients times 10, clipped back to |g|.
  GaloreSettings s = b.opt->settings();
  GaloreAdamSettings adam;
  adam.beta1 = 0.9;
  adam.beta2 = 0.999;
  adam.eps = 1e-8;
  adam.weight_decay = 0.1;
  adam.max_grad_norm = std::sqrt(sq);
  auto clipped = GaloreAdamW::Create(b.params, kNames, s, adam);
  ASSERT_TRUE(clipped.ok()) << clipped.status();
  for (auto& p : b.params) p.mutable_grad() = p.grad() * 10;
  double norm10 = 0;
  ASSERT_TRUE((*clipped)->Step(0.02, &norm10));
  EXPECT_NEAR(norm10, 10 * std::sqrt(sq), 1e-5 * norm10);
  for (size_t i = 0; i < kNames.size(); ++i) {
    EXPECT_LT((a.params[i] - b.params[i]).abs().max().item<double>(), 1e-6) << kNames[i];
  }
}

TEST(GaloreAdamWTest, StateRoundTripResumesExactly) {
  GaloreRun a = Make(2, 3);
  ASSERT_NE(a.opt, nullptr);
  for (int t = 0; t < 3; ++t) {
    SetGrads(a, t);
    ASSERT_TRUE(a.opt->Step(0.02));
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> meta;
  a.opt->AppendState(&tensors, &meta);
  EXPECT_EQ(meta["galore_step"], "3");
  ASSERT_EQ(tensors.size(), 9u);
  // A fresh optimizer on copies of the weights, given the state, continues identically
  // (step 5 recomputes the projectors; step 4 uses the saved ones).
  GaloreRun b = Make(2, 3);
  ASSERT_NE(b.opt, nullptr);
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < kNames.size(); ++i) b.params[i].copy_(a.params[i]);
  }
  std::map<std::string, at::Tensor> state(tensors.begin(), tensors.end());
  ASSERT_TRUE(b.opt->LoadState(state, 3).ok());
  for (int t = 3; t < 5; ++t) {
    SetGrads(a, t);
    SetGrads(b, t);
    ASSERT_TRUE(a.opt->Step(0.02));
    ASSERT_TRUE(b.opt->Step(0.02));
    for (size_t i = 0; i < kNames.size(); ++i) {
      EXPECT_TRUE(at::equal(a.params[i], b.params[i])) << kNames[i] << " step " << t + 1;
    }
  }
  EXPECT_EQ(b.opt->StateBytes(), 4 * 3 * ((2 * 12 + 8) + (2 * 10 + 6) + (2 * 8 + 8)));
}

TEST(GaloreAdamWTest, CheckStateRefusesDamagedState) {
  GaloreRun a = Make(2, 3);
  ASSERT_NE(a.opt, nullptr);
  SetGrads(a, 0);
  ASSERT_TRUE(a.opt->Step(0.02));
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> meta;
  a.opt->AppendState(&tensors, &meta);
  const std::map<std::string, at::Tensor> good(tensors.begin(), tensors.end());
  EXPECT_TRUE(a.opt->CheckState(good, 1).ok());
  EXPECT_EQ(a.opt->CheckState(good, -1).code(), absl::StatusCode::kDataLoss);
  auto damaged = [&](const std::string& key, at::Tensor t) {
    std::map<std::string, at::Tensor> s = good;
    if (t.defined())
      s[key] = t;
    else
      s.erase(key);
    return a.opt->CheckState(s, 1);
  };
  const absl::Status neg = damaged("left.galore_exp_avg_sq", -at::ones({3, 10}));
  EXPECT_EQ(neg.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(neg.message().find("left.galore_exp_avg_sq"), std::string::npos) << neg;
  EXPECT_EQ(damaged("right.galore_projector", at::ones({8, 3})).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(damaged("square.galore_exp_avg", at::Tensor()).code(), absl::StatusCode::kDataLoss);
  at::Tensor nan = at::zeros({12, 3});
  nan[0][0] = std::nan("");
  EXPECT_EQ(damaged("right.galore_exp_avg", nan).code(), absl::StatusCode::kDataLoss);
  // Nothing installed by a refused LoadState.
  const at::Tensor proj = a.opt->projector(0).clone();
  std::map<std::string, at::Tensor> bad = good;
  bad["left.galore_exp_avg_sq"] = -at::ones({3, 10});
  EXPECT_FALSE(a.opt->LoadState(bad, 7).ok());
  EXPECT_EQ(a.opt->step(), 1);
  EXPECT_TRUE(at::equal(proj, a.opt->projector(0)));
}

}  // namespace
}  // namespace lspo::baselines
