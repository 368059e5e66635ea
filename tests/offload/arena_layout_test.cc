// Tests for offload/arena_layout.h: the slot layout the worker and the optimizer share, for
// MODE_LSP and GaLore-Offload's MODE_GALORE_OFFLOAD (one side the identity, the other a dense rank-r
// projector, plus the |G|^2 slot), with the refusals that name the matrix.
#include "offload/arena_layout.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lspo::offload {
namespace {

using ::testing::HasSubstr;

// One decoder layer of the tiny Llama (hidden 64, 4 heads, 2 KV heads, intermediate 128) in
// linear order: q, k, v, o, gate, up, down.
std::vector<LinearShape> TinyLayer() {
  return {{0, "model.layers.0.self_attn.q_proj.weight", 64, 64},
          {1, "model.layers.0.self_attn.k_proj.weight", 32, 64},
          {2, "model.layers.0.self_attn.v_proj.weight", 32, 64},
          {3, "model.layers.0.self_attn.o_proj.weight", 64, 64},
          {4, "model.layers.0.mlp.gate_proj.weight", 128, 64},
          {5, "model.layers.0.mlp.up_proj.weight", 128, 64},
          {6, "model.layers.0.mlp.down_proj.weight", 64, 128}};
}

std::vector<int64_t> Shape(const lspo::v1::TensorRef& t) {
  return {t.shape().begin(), t.shape().end()};
}

// m >= n projects the in side (S = G B^T, (m, r)); m < n the out side (S = A^T G, (r, n)).
// Every region is 64-byte aligned, disjoint and inside the arena.
TEST(BuildGaloreArenaLayout, OneDenseSidePerMatrixAndTheNormSlot) {
  absl::StatusOr<lspo::v1::ArenaLayout> layout =
      BuildGaloreArenaLayout(TinyLayer(), 7, 8, "/lspo-test");
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->mode(), lspo::v1::MODE_GALORE_OFFLOAD);
  EXPECT_EQ(layout->d(), 8);
  EXPECT_EQ(layout->r(), 8);
  ASSERT_EQ(layout->linears_size(), 7);
  uint64_t end = 0;
  for (const auto& slot : layout->linears()) {
    const bool right = slot.m() >= slot.n();
    const int64_t dp = right ? slot.m() : 8, dq = right ? 8 : slot.n();
    EXPECT_EQ(slot.d_p(), dp) << slot.name();
    EXPECT_EQ(slot.d_q(), dq) << slot.name();
    EXPECT_EQ(Shape(slot.grad()), (std::vector<int64_t>{dp, dq})) << slot.name();
    EXPECT_EQ(Shape(slot.step()), (std::vector<int64_t>{dp, dq})) << slot.name();
    // The identity side: (rows, 1); the dense side: (rows, 8).
    EXPECT_EQ(Shape(slot.p_index()), (std::vector<int64_t>{slot.m(), right ? 1 : 8}));
    EXPECT_EQ(Shape(slot.q_index()), (std::vector<int64_t>{slot.n(), right ? 8 : 1}));
    EXPECT_EQ(Shape(slot.grad_sq()), (std::vector<int64_t>{1}));
    const lsp::MatrixSubspace sub = SlotSubspace(slot);
    EXPECT_EQ(sub.p.identity, right) << slot.name();
    EXPECT_EQ(sub.q.identity, !right) << slot.name();
    EXPECT_EQ(right ? sub.q.r : sub.p.r, 8);
    for (const lspo::v1::TensorRef* t :
         {&slot.grad(), &slot.step(), &slot.p_index(), &slot.p_value(), &slot.q_index(),
          &slot.q_value(), &slot.grad_sq()}) {
      EXPECT_EQ(t->offset() % 64, 0u) << slot.name();
      EXPECT_GE(t->offset(), end) << slot.name() << ": regions overlap";
      end = t->offset() + 4 * static_cast<uint64_t>(Numel(*t));
    }
  }
  EXPECT_LE(end, layout->bytes());
  // The lsp layout has no norm slot.
  std::vector<lsp::MatrixSubspace> subs;
  for (const LinearShape& l : TinyLayer()) {
    subs.push_back(*lsp::ResolveSubspace(l.m, l.n, 16, 0, 4, lsp::NarrowRule::kOneSided));
  }
  absl::StatusOr<lspo::v1::ArenaLayout> lsp_layout =
      BuildArenaLayout(TinyLayer(), 7, subs, 16, 4, "/lspo-test");
  ASSERT_TRUE(lsp_layout.ok()) << lsp_layout.status();
  EXPECT_EQ(lsp_layout->mode(), lspo::v1::MODE_LSP);
  EXPECT_FALSE(lsp_layout->linears(0).has_grad_sq());
}

// A rank at (or above) the smaller side of a matrix is refused naming the narrowest matrix and
// the largest rank that works; so are rank 0 and a layer count that does not divide.
TEST(BuildGaloreArenaLayout, RefusesARankItCannotOffload) {
  for (int32_t rank : {32, 40}) {
    absl::StatusOr<lspo::v1::ArenaLayout> layout =
        BuildGaloreArenaLayout(TinyLayer(), 7, rank, "/lspo-test");
    ASSERT_FALSE(layout.ok()) << rank;
    EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(layout.status().message(),
                HasSubstr("the narrowest is model.layers.0.self_attn.k_proj.weight, 32 x 64): "
                          "use a rank <= 31"));
  }
  EXPECT_TRUE(BuildGaloreArenaLayout(TinyLayer(), 7, 31, "/lspo-test").ok());
  EXPECT_THAT(BuildGaloreArenaLayout(TinyLayer(), 7, 0, "/lspo-test").status().message(),
              HasSubstr("galore.rank = 0"));
  EXPECT_FALSE(BuildGaloreArenaLayout(TinyLayer(), 3, 8, "/lspo-test").ok());
}

}  // namespace
}  // namespace lspo::offload
