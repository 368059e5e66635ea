// The training-mode descriptors (offload/training_mode.h): names and the old spelling of
// GaLore-Offload, the settings-block rule, and each descriptor against what the planner and
// the arena layout make of the same mode (one layout builder, one offload kind).
#include "offload/training_mode.h"

#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/llama_config.h"
#include "offload/memory_plan.h"

namespace lspo::offload {
namespace {

using ::testing::HasSubstr;
namespace v1 = lspo::v1;

TEST(TrainingModeTest, NamesAndSpellingsResolveToOneMode) {
  const struct {
    const char* name;
    v1::TrainingMode mode;
  } cases[] = {{"lsp", v1::MODE_LSP},
               {"MODE_ZERO", v1::MODE_ZERO},
               {"Native", v1::MODE_NATIVE},
               {"lora", v1::MODE_LORA},
               {"GALORE", v1::MODE_GALORE},
               {"galore-offload", v1::MODE_GALORE_OFFLOAD},
               {"galore_offload", v1::MODE_GALORE_OFFLOAD},
               {"mode_galore_offload", v1::MODE_GALORE_OFFLOAD}};
  for (const auto& c : cases) {
    absl::StatusOr<const ModeDescriptor*> m = ModeByName(c.name);
    ASSERT_TRUE(m.ok()) << c.name << ": " << m.status();
    EXPECT_EQ((*m)->mode, c.mode) << c.name;
  }
  absl::StatusOr<const ModeDescriptor*> bad = ModeByName("fast");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("'fast' is not a mode: use lsp, zero, native, lora, galore or "
                        "galore-offload"));
  // Every enum value but UNSPECIFIED has exactly one descriptor, named as the proto's short
  // name; the names are distinct.
  std::set<std::string> names;
  for (int v = v1::TrainingMode_MIN; v <= v1::TrainingMode_MAX; ++v) {
    if (v == v1::MODE_UNSPECIFIED) continue;
    const auto mode = static_cast<v1::TrainingMode>(v);
    ASSERT_TRUE(ModeKnown(mode)) << v1::TrainingMode_Name(mode);
    EXPECT_EQ(DescriptorOf(mode).mode, mode);
    names.insert(std::string(DescriptorOf(mode).name));
  }
  EXPECT_EQ(names.size(), AllModes().size());
  EXPECT_EQ(DescriptorOf(v1::MODE_UNSPECIFIED).mode, v1::MODE_LSP);
  EXPECT_FALSE(ModeKnown(static_cast<v1::TrainingMode>(99)));
}

// A spec written before MODE_GALORE_OFFLOAD existed (mode galore, galore.offload: true) is
// GaLore-Offload, and NormalizeMode writes it in its current form.
TEST(TrainingModeTest, TheOldGaloreOffloadSpellingIsTheSameMode) {
  v1::JobSpec old;
  old.set_mode(v1::MODE_GALORE);
  old.mutable_galore()->set_offload(true);
  old.mutable_galore()->set_rank(8);
  EXPECT_EQ(ModeOf(old).mode, v1::MODE_GALORE_OFFLOAD);
  EXPECT_TRUE(ModeOf(old).offloaded());
  NormalizeMode(&old);
  EXPECT_EQ(old.mode(), v1::MODE_GALORE_OFFLOAD);
  EXPECT_FALSE(old.galore().offload());
  EXPECT_EQ(old.galore().rank(), 8);
  v1::JobSpec unset;
  NormalizeMode(&unset);
  EXPECT_EQ(unset.mode(), v1::MODE_LSP);
  v1::JobSpec on_worker;
  on_worker.set_mode(v1::MODE_GALORE);
  EXPECT_FALSE(ModeOf(on_worker).offloaded());
}

TEST(TrainingModeTest, AnotherModesSettingsAreRefusedAndTheOwnAreChecked) {
  v1::JobSpec spec;
  spec.set_mode(v1::MODE_ZERO);
  spec.mutable_lora()->set_r(4);
  absl::Status st = CheckModeSettings(spec);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("the lora settings apply to mode lora only, and mode is "
                                      "zero; remove lora or set mode: lora"));
  // An empty block is no setting.
  spec.mutable_lora()->Clear();
  EXPECT_TRUE(CheckModeSettings(spec).ok());
  // GaLore-Offload reads the galore block.
  spec.set_mode(v1::MODE_GALORE_OFFLOAD);
  spec.clear_lora();
  DescriptorOf(v1::MODE_GALORE_OFFLOAD).resolve_defaults(&spec);
  EXPECT_EQ(spec.galore().rank(), 128);
  spec.mutable_optim()->set_lr(1e-4);
  EXPECT_TRUE(CheckModeSettings(spec).ok()) << CheckModeSettings(spec);
  spec.mutable_galore()->set_rank(0);
  EXPECT_THAT(CheckModeSettings(spec).message(), HasSubstr("galore.rank = 0 is invalid"));
  spec.set_mode(static_cast<v1::TrainingMode>(99));
  EXPECT_THAT(CheckModeSettings(spec).message(), HasSubstr("job spec field mode = 99"));
}

TEST(TrainingModeTest, DroppingOtherModesSettingsKeepsTheModesOwn) {
  v1::JobSpec spec;
  spec.mutable_lora()->set_r(2);
  spec.mutable_galore()->set_rank(4);
  spec.mutable_lsp()->set_d(64);
  EXPECT_THAT(DropOtherModesSettings(DescriptorOf(v1::MODE_GALORE_OFFLOAD), &spec),
              ::testing::ElementsAre("lora"));
  EXPECT_FALSE(spec.has_lora());
  EXPECT_EQ(spec.galore().rank(), 4);
  EXPECT_EQ(spec.lsp().d(), 64);  // every spec carries lsp's defaults
  EXPECT_THAT(DropOtherModesSettings(DescriptorOf(v1::MODE_ZERO), &spec),
              ::testing::ElementsAre("galore"));
  EXPECT_TRUE(DropOtherModesSettings(DescriptorOf(v1::MODE_ZERO), &spec).empty());
}

// The descriptor, the planner and the layout agree: a mode that offloads has a layout of its
// own mode whose bytes are the plan's arena term, and a mode that does not has neither.
TEST(TrainingModeTest, EachDescriptorsLayoutIsThePlannersArena) {
  model::LlamaConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 256;
  c.max_position_embeddings = 128;
  v1::JobSpec spec;
  spec.set_seq_len(32);
  spec.set_micro_batch_size(2);
  spec.set_grad_accum(1);
  spec.mutable_lsp()->set_d(16);
  spec.mutable_lsp()->set_r(2);
  spec.mutable_galore()->set_rank(8);
  std::vector<LinearShape> linears;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const int64_t m[7] = {qd, kvd, kvd, c.hidden_size, c.intermediate_size, c.intermediate_size,
                        c.hidden_size};
  const int64_t n[7] = {c.hidden_size, c.hidden_size, c.hidden_size, qd, c.hidden_size,
                        c.hidden_size, c.intermediate_size};
  for (int l = 0; l < c.num_layers; ++l) {
    for (int k = 0; k < 7; ++k) {
      const auto index = static_cast<int32_t>(linears.size());
      linears.push_back({index, absl::StrCat("model.layers.", l, ".linear", k), m[k], n[k]});
    }
  }
  for (const ModeDescriptor& mode : AllModes()) {
    SCOPED_TRACE(std::string(mode.name));
    absl::StatusOr<MemoryPlan> plan = PlanJobMemory(spec, c, mode.mode, /*cuda=*/true);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->mode, mode.mode);
    if (!mode.offloaded()) {
      EXPECT_EQ(mode.layout, nullptr);
      EXPECT_EQ(plan->arena, 0);
      EXPECT_TRUE(plan->optimizer_host.empty());
      continue;
    }
    ASSERT_NE(mode.layout, nullptr);
    absl::StatusOr<v1::ArenaLayout> layout = mode.layout(linears, 7, spec, "test");
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->mode(), mode.mode);
    EXPECT_EQ(static_cast<int64_t>(layout->bytes()), plan->arena);
    EXPECT_GT(plan->d2h_bytes_per_step, 0);
  }
}

}  // namespace
}  // namespace lspo::offload
