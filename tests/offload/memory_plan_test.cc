// The memory planner (offload/memory_plan.h) against numbers measured elsewhere: the bytes the
// H200 run moved per step and the CUDA caching allocator's peaks of that run
// (docs/gpu/results-2026-12-04-h200.json, scripts/device-check on 2026-12-04), and its
// out-of-memory outcomes under the 4 GB cap; plus exact counts on a small shape.
#include "offload/memory_plan.h"
#include "offload/training_mode.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "model/linear_cross_entropy.h"
#include "model/llama_config.h"
#include "offload/arena_layout.h"
#include "offload/job_assets.h"
#include "proto/job_spec.pb.h"

namespace lspo::offload {
namespace {

// The shapes of scripts/device_check.py (tiny-random, SmolLM2's 49152-token vocabulary).
model::LlamaConfig Shape(int h, int f, int layers, int heads, int kv) {
  lspo::v1::LlamaShape s;
  s.set_hidden_size(h);
  s.set_intermediate_size(f);
  s.set_num_hidden_layers(layers);
  s.set_num_attention_heads(heads);
  s.set_num_key_value_heads(kv);
  absl::StatusOr<model::LlamaConfig> c = RandomLlamaConfig(s, 49152);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}
model::LlamaConfig Smol() { return Shape(576, 1536, 30, 9, 3); }
model::LlamaConfig Llama11b() { return Shape(2048, 5632, 22, 32, 8); }

// The device-check job: text blocks (every row full, every token in the loss), r = 8, the
// overlap schedule, the CUDA defaults of the H200 run (bf16 weights, compensated lsp
// rounding: the default until 2026-12-07).
lspo::v1::JobSpec DeviceCheckSpec(int d, int micro_batch, int seq_len) {
  lspo::v1::JobSpec spec;
  spec.mutable_lsp()->set_apply_rounding(lspo::v1::APPLY_ROUNDING_COMPENSATED);
  spec.set_micro_batch_size(micro_batch);
  spec.set_seq_len(seq_len);
  spec.set_grad_accum(1);
  spec.mutable_lsp()->set_d(d);
  spec.mutable_lsp()->set_r(8);
  spec.mutable_galore()->set_rank(128);
  spec.mutable_lora()->set_r(8);
  return spec;
}

MemoryPlan Plan(const lspo::v1::JobSpec& spec, const model::LlamaConfig& c,
                lspo::v1::TrainingMode mode, bool cuda) {
  absl::StatusOr<MemoryPlan> p = PlanJobMemory(spec, c, mode, cuda);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : MemoryPlan{};
}

TEST(MemoryPlanTest, BytesPerStepAreTheMeasuredTransfersOfTheH200Run) {
  // d2h_bytes_per_step of results-2026-12-04-h200.json: lsp d = 256 on the ~1.1B shape moved
  // 40,370,176 bytes (154 matrices x 256^2 fp32), zero 1,983,905,792 (bf16 gradients); the
  // SmolLM2 shape at d = 128: 13,762,560 and 212,336,640.
  EXPECT_EQ(
      Plan(DeviceCheckSpec(256, 4, 512), Llama11b(), lspo::v1::MODE_LSP, true).d2h_bytes_per_step,
      40370176);
  EXPECT_EQ(
      Plan(DeviceCheckSpec(256, 4, 512), Llama11b(), lspo::v1::MODE_ZERO, true).d2h_bytes_per_step,
      1983905792);
  EXPECT_EQ(Plan(DeviceCheckSpec(128, 8, 512), Smol(), lspo::v1::MODE_LSP, true).d2h_bytes_per_step,
            13762560);
  EXPECT_EQ(
      Plan(DeviceCheckSpec(128, 8, 512), Smol(), lspo::v1::MODE_ZERO, true).d2h_bytes_per_step,
      212336640);
  EXPECT_EQ(
      Plan(DeviceCheckSpec(128, 8, 512), Smol(), lspo::v1::MODE_NATIVE, true).d2h_bytes_per_step,
      0);
}

// Data parallel: the all-reduce buffers hold every matrix's S (lsp: 13,762,560 bytes on the
// SmolLM2 shape at d = 128, the bytes each step moves), gradient (zero, native: Σ m n fp32 =
// 2 x the bf16 gradients' 212,336,640) or adapters' gradients (lora r 8: Σ 8 (m + n) fp32 =
// 9,768,960), on the CPU worker's heap, or in a CUDA worker's host memory (the collectives run
// over Gloo on host copies), never on the GPU.
TEST(MemoryPlanTest, DataParallelBuffersAreHostMemory) {
  lspo::v1::JobSpec spec = DeviceCheckSpec(128, 8, 512);
  spec.mutable_distributed()->set_world_size(2);
  auto bucket_term = [](const MemoryPlan& p) -> int64_t {
    for (const PlanTerm& t : p.device_static) {
      if (t.name == "all-reduce buffers (fp32)") return t.bytes;
    }
    return -1;
  };
  const int64_t lsp_bytes = 13762560, dense_bytes = 2 * 212336640LL;
  for (const auto& [mode, bytes] : {std::make_pair(lspo::v1::MODE_LSP, lsp_bytes),
                                    std::make_pair(lspo::v1::MODE_ZERO, dense_bytes),
                                    std::make_pair(lspo::v1::MODE_NATIVE, dense_bytes),
                                    std::make_pair(lspo::v1::MODE_LORA, int64_t{9768960})}) {
    const MemoryPlan cpu = Plan(spec, Smol(), mode, false);
    const MemoryPlan gpu = Plan(spec, Smol(), mode, true);
    EXPECT_EQ(bucket_term(cpu), bytes) << std::string(DescriptorOf(mode).name);
    EXPECT_EQ(cpu.worker_host_train, 0) << std::string(DescriptorOf(mode).name);
    EXPECT_EQ(bucket_term(gpu), -1) << std::string(DescriptorOf(mode).name);
    EXPECT_EQ(gpu.worker_host_train, bytes) << std::string(DescriptorOf(mode).name);
    // One rank: no buffers at all.
    lspo::v1::JobSpec one = spec;
    one.mutable_distributed()->set_world_size(1);
    EXPECT_EQ(bucket_term(Plan(one, Smol(), mode, false)), -1)
        << std::string(DescriptorOf(mode).name);
    EXPECT_EQ(Plan(one, Smol(), mode, true).worker_host_train, 0)
        << std::string(DescriptorOf(mode).name);
  }
}

// The plan's bf16 embedding / head / norms term (CUDA): what those took more in fp32.
int64_t FrozenBf16Bytes(const MemoryPlan& p) {
  for (const PlanTerm& t : p.device_static) {
    if (t.name == "embedding, norms (bf16)") return t.bytes;
  }
  ADD_FAILURE() << "no bf16 embedding term";
  return 0;
}

TEST(MemoryPlanTest, PeakIsWithin15PercentOfTheH200AllocatorPeaks) {
  // peak_gpu_allocated_bytes of the H200 run (the allocator's peak of allocated bytes over the
  // training steps); the plan without its allocator margin is what it predicts.
  struct Case {
    const char* name;
    model::LlamaConfig config;
    int d, micro_batch;
    lspo::v1::TrainingMode mode;
    double measured;
  };
  const Case cases[] = {
      {"smollm2-135m native", Smol(), 128, 8, lspo::v1::MODE_NATIVE, 10870516224.0},
      {"smollm2-135m zero", Smol(), 128, 8, lspo::v1::MODE_ZERO, 10445318656.0},
      {"smollm2-135m lsp", Smol(), 128, 8, lspo::v1::MODE_LSP, 9643465216.0},
      {"llama-1.1b native", Llama11b(), 256, 4, lspo::v1::MODE_NATIVE, 20985096192.0},
      {"llama-1.1b zero", Llama11b(), 256, 4, lspo::v1::MODE_ZERO, 17109559296.0},
      {"llama-1.1b lsp", Llama11b(), 256, 4, lspo::v1::MODE_LSP, 17345193984.0},
  };
  for (const Case& c : cases) {
    const MemoryPlan p = Plan(DeviceCheckSpec(c.d, c.micro_batch, 512), c.config, c.mode, true);
    // The run's code (commit 1af6848) kept each bf16 linear's fp32 upcast copy for the
    // backward, 4 bytes per linear parameter; model::UpcastLinear keeps none since 2026-12-06,
    // so the plan of today's code plus those copies is what the run measured.
    const model::LlamaConfig& k = c.config;
    const int64_t hd = k.head_dim;
    const int64_t per_layer = 2 * k.hidden_size * k.num_heads * hd +
                              2 * k.hidden_size * k.num_kv_heads * hd +
                              3 * k.hidden_size * k.intermediate_size;
    const double upcast_copies = 4.0 * static_cast<double>(per_layer * k.num_layers);
    // It also kept the loss's R x V fp32 log-probabilities with a 2 R V transient in the
    // backward, where model/linear_cross_entropy.h keeps dL/dh (R x H) and two blocks of
    // logits (since 2026-12-07); R = N on CUDA. Both at the start of the backward, the peak.
    const int64_t N = int64_t{c.micro_batch} * 512, V = k.vocab_size, H = k.hidden_size;
    const int64_t attn =
        4 * (2 * int64_t{c.micro_batch} * k.num_heads * 512 * 512 + 4 * N * k.intermediate_size);
    const int64_t blocks = 4 * 2 * std::min(N, model::LossBlockRows(V)) * V;
    const double old_loss = 4.0 * N * V + static_cast<double>(std::max(8 * N * V, attn));
    const double new_loss = 4.0 * N * H + static_cast<double>(std::max(blocks + 4 * N * H, attn));
    // It kept the embedding, head and norms in fp32 too (bf16 since 2026-12-07).
    const double frozen_fp32 = static_cast<double>(FrozenBf16Bytes(p));
    const double planned = static_cast<double>(p.device_peak - p.margin) + upcast_copies +
                           old_loss - new_loss + frozen_fp32;
    EXPECT_NEAR(planned / c.measured, 1.0, 0.15)
        << c.name << ": planned " << planned / (1 << 20) << " MiB, measured "
        << c.measured / (1 << 20) << " MiB";
  }
}

TEST(MemoryPlanTest, TheFourGigabyteCapOutcomesOfTheH200RunArePredicted) {
  // Micro-batch 1 x 512 with activation checkpointing under device_memory_limit_mb 4096: lsp
  // with compensated rounding, native and zero all ran out of memory on the H200; lsp with
  // nearest rounding (no residuals) is the paper's setting and fits by the plan.
  lspo::v1::JobSpec spec = DeviceCheckSpec(256, 1, 512);
  spec.set_activation_checkpointing(true);
  const int64_t cap = 4096LL << 20;
  // That run's code kept the embedding, head and norms in fp32: what they take more than
  // today's bf16 comes off its cap.
  const int64_t run_cap = cap - FrozenBf16Bytes(Plan(spec, Llama11b(), lspo::v1::MODE_LSP, true));
  for (lspo::v1::TrainingMode mode :
       {lspo::v1::MODE_LSP, lspo::v1::MODE_NATIVE, lspo::v1::MODE_ZERO}) {
    absl::StatusOr<FitAnswer> fit = FitOnDevice(spec, Llama11b(), mode, true, run_cap);
    ASSERT_TRUE(fit.ok()) << fit.status();
    EXPECT_FALSE(fit->fits) << std::string(DescriptorOf(mode).name);
    EXPECT_EQ(fit->fits_with_nearest_rounding, mode == lspo::v1::MODE_LSP)
        << std::string(DescriptorOf(mode).name);
  }
  spec.mutable_lsp()->clear_apply_rounding();  // today's default keeps no residual either
  absl::StatusOr<FitAnswer> fit = FitOnDevice(spec, Llama11b(), lspo::v1::MODE_LSP, true, cap);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_TRUE(fit->fits);
  spec.mutable_lsp()->set_apply_rounding(lspo::v1::APPLY_ROUNDING_NEAREST);
  fit = FitOnDevice(spec, Llama11b(), lspo::v1::MODE_LSP, true, cap);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_TRUE(fit->fits);
  EXPECT_GE(fit->largest_micro_batch, 1);
  // The answers are the largest that fit: one more does not.
  spec.set_micro_batch_size(fit->largest_micro_batch);
  EXPECT_LE(Plan(spec, Llama11b(), lspo::v1::MODE_LSP, true).device_peak, cap);
  spec.set_micro_batch_size(fit->largest_micro_batch + 1);
  EXPECT_GT(Plan(spec, Llama11b(), lspo::v1::MODE_LSP, true).device_peak, cap);
  spec.set_micro_batch_size(1);
  spec.mutable_lsp()->set_d(fit->largest_d);
  EXPECT_LE(Plan(spec, Llama11b(), lspo::v1::MODE_LSP, true).device_peak, cap);
  spec.mutable_lsp()->set_d(fit->largest_d + 1);
  EXPECT_LT(fit->largest_d, Llama11b().hidden_size);  // never a d that compresses nothing
  if (fit->largest_d < Llama11b().hidden_size - 1) {
    EXPECT_GT(Plan(spec, Llama11b(), lspo::v1::MODE_LSP, true).device_peak, cap);
  }
}

TEST(MemoryPlanTest, AnUnsetCheckpointingIsTurnedOnOnlyWhenThatMakesTheJobFit) {
  // Issue 42: with device cuda and activation_checkpointing unset, the worker turns it on when
  // the plan does not fit without it and does with it; never on the CPU, never over an
  // explicit setting, never when it would not make the job fit.
  const lspo::v1::JobSpec spec = DeviceCheckSpec(256, 4, 512);
  ASSERT_FALSE(spec.has_activation_checkpointing());
  lspo::v1::JobSpec on = spec;
  on.set_activation_checkpointing(true);
  const int64_t without = Plan(spec, Llama11b(), lspo::v1::MODE_LSP, true).device_peak;
  const int64_t with = Plan(on, Llama11b(), lspo::v1::MODE_LSP, true).device_peak;
  ASSERT_LT(with, without / 2) << "checkpointing must save most of the activations here";
  const int64_t between = (with + without) / 2;
  auto choose = [&](lspo::v1::JobSpec s, bool cuda, int64_t budget) {
    absl::StatusOr<std::vector<std::string>> lines =
        ChooseFittingDefaults(&s, Llama11b(), lspo::v1::MODE_LSP, cuda, budget);
    EXPECT_TRUE(lines.ok()) << lines.status();
    return std::make_pair(s, lines.ok() ? absl::StrJoin(*lines, "\n") : std::string("<error>"));
  };
  auto [chosen, line] = choose(spec, true, between);
  EXPECT_TRUE(chosen.has_activation_checkpointing() && chosen.activation_checkpointing());
  EXPECT_NE(line.find("activation checkpointing: on"), std::string::npos) << line;
  EXPECT_NE(line.find(absl::StrFormat("%.2f GiB without it", without / double(1LL << 30))),
            std::string::npos)
      << line;
  EXPECT_LE(Plan(chosen, Llama11b(), lspo::v1::MODE_LSP, true).device_peak, between);
  for (const auto& [s, cuda, budget] :
       {std::make_tuple(spec, true, without),      // fits as given
        std::make_tuple(spec, true, with - 1),     // checkpointing would not make it fit
        std::make_tuple(spec, false, between)}) {  // the CPU
    auto [same, none] = choose(s, cuda, budget);
    EXPECT_FALSE(same.has_activation_checkpointing());
    EXPECT_EQ(none, "");
  }
  lspo::v1::JobSpec off = spec;
  off.set_activation_checkpointing(false);  // explicit: stands
  auto [kept, nothing] = choose(off, true, between);
  EXPECT_TRUE(kept.has_activation_checkpointing());
  EXPECT_FALSE(kept.activation_checkpointing());
  EXPECT_EQ(nothing, "");
}

TEST(MemoryPlanTest, AnUnsetMicroBatchIsTheLargestPowerOfTwoThatFits) {
  // Issue 42: with device cuda and micro_batch_size unset, the worker takes the largest power
  // of two up to kMaxChosenMicroBatch whose plan fits; with checkpointing unset and no
  // micro-batch fitting without it, it turns checkpointing on too; never data parallel, never
  // on the CPU, never over an explicit micro-batch.
  lspo::v1::JobSpec spec = DeviceCheckSpec(256, 4, 512);
  spec.clear_micro_batch_size();
  ASSERT_FALSE(spec.has_micro_batch_size());
  EXPECT_EQ(MicroBatchOf(spec), kDefaultMicroBatchSize);
  auto peak = [&](int b, bool ckpt) {
    lspo::v1::JobSpec s = spec;
    s.set_micro_batch_size(b);
    s.set_activation_checkpointing(ckpt);
    return Plan(s, Llama11b(), lspo::v1::MODE_LSP, true).device_peak;
  };
  for (int b = 1; b < kMaxChosenMicroBatch; b *= 2) {
    ASSERT_LT(peak(b, false), peak(2 * b, false)) << b;  // the plan grows with the batch
  }
  auto choose = [&](lspo::v1::JobSpec s, bool cuda, int64_t budget) {
    absl::StatusOr<std::vector<std::string>> lines =
        ChooseFittingDefaults(&s, Llama11b(), lspo::v1::MODE_LSP, cuda, budget);
    EXPECT_TRUE(lines.ok()) << lines.status();
    return std::make_pair(s, lines.ok() ? *lines : std::vector<std::string>{"<error>"});
  };
  lspo::v1::JobSpec no_ckpt = spec;
  no_ckpt.set_activation_checkpointing(false);
  // Exactly the peak of 16 (and one byte less: 8); far above everything: the cap, 32.
  for (const auto& [budget, want] :
       {std::make_pair(peak(16, false), 16), std::make_pair(peak(16, false) - 1, 8),
        std::make_pair(int64_t{1} << 50, kMaxChosenMicroBatch)}) {
    auto [s, lines] = choose(no_ckpt, true, budget);
    EXPECT_EQ(s.micro_batch_size(), want) << budget;
    ASSERT_EQ(lines.size(), 1u);
    EXPECT_NE(lines[0].find(absl::StrCat("micro_batch_size: ", want, " (chosen")),
              std::string::npos)
        << lines[0];
    EXPECT_LE(Plan(s, Llama11b(), lspo::v1::MODE_LSP, true).device_peak, budget);
  }
  // Nothing fits: the default stays for the fit check to refuse, nothing said.
  auto [none, silent] = choose(no_ckpt, true, peak(1, false) - 1);
  EXPECT_EQ(none.micro_batch_size(), kDefaultMicroBatchSize);
  EXPECT_TRUE(silent.empty());
  // Checkpointing unset, no micro-batch fits without it: on, and the largest with it.
  const int64_t tight = peak(2, true);
  if (peak(1, false) > tight) {
    auto [both, two] = choose(spec, true, tight);
    EXPECT_TRUE(both.activation_checkpointing());
    EXPECT_EQ(both.micro_batch_size(), 2);
    EXPECT_EQ(two.size(), 2u);
  } else {
    ADD_FAILURE() << "the shape no longer needs checkpointing at micro-batch 1 under " << tight
                  << " bytes: pick a tighter case";
  }
  // Data parallel, the CPU, an explicit micro-batch: unchanged.
  lspo::v1::JobSpec dp = no_ckpt;
  dp.mutable_distributed()->set_world_size(2);
  EXPECT_FALSE(choose(dp, true, int64_t{1} << 50).first.has_micro_batch_size());
  EXPECT_FALSE(choose(no_ckpt, false, int64_t{1} << 50).first.has_micro_batch_size());
  lspo::v1::JobSpec four = no_ckpt;
  four.set_micro_batch_size(4);
  EXPECT_EQ(choose(four, true, int64_t{1} << 50).first.micro_batch_size(), 4);
}

TEST(MemoryPlanTest, StaticTermsAreExactCountsOnTheTinyShape) {
  // TinyLlamaConfig: hidden 64, 2 layers, 4 heads of 16, 2 kv heads, intermediate 128, tied.
  const model::LlamaConfig c = model::TinyLlamaConfig(256);
  lspo::v1::JobSpec spec = DeviceCheckSpec(16, 4, 32);
  spec.mutable_lsp()->set_r(4);
  // Per layer: q, o 64x64; k, v 32x64; gate, up 128x64; down 64x128 -> 36864 elements.
  const int64_t p_lin = 2 * 36864;
  const int64_t p_rest = 256 * 64 + 2 * 2 * 64 + 64;  // embedding, 2 norms per layer, final
  const MemoryPlan lsp = Plan(spec, c, lspo::v1::MODE_LSP, /*cuda=*/false);
  ASSERT_GE(lsp.device_static.size(), 3u);
  EXPECT_EQ(lsp.weight_bytes, 4);
  EXPECT_EQ(lsp.device_static[0].bytes, 4 * p_lin);  // fp32 on the CPU
  EXPECT_EQ(lsp.device_static[1].bytes, 4 * p_rest);
  // Every side is wider than d = 16: projectors (m + n) r (8 + 4) bytes, S 4 d^2 per matrix.
  const int64_t sides = 2 * ((64 + 64) * 2 + (32 + 64) * 2 + (128 + 64) * 2 + (64 + 128));
  EXPECT_EQ(lsp.device_static[2].bytes, sides * 4 * 12);
  // One micro-batch per step: no S accumulators for the whole job; the step's 14 S (4 d^2
  // bytes each) exist at the end of its backward. With grad_accum 2 they are accumulators.
  const auto term = [](const MemoryPlan& p, const std::string& name) -> int64_t {
    for (const PlanTerm& t : p.device_static) {
      if (t.name == name) return t.bytes;
    }
    return -1;
  };
  EXPECT_EQ(term(lsp, "S accumulators (fp32)"), -1);
  EXPECT_EQ(lsp.gradients_in_flight, 14 * 16 * 16 * 4);
  lspo::v1::JobSpec accum = spec;
  accum.set_grad_accum(2);
  const MemoryPlan lsp2 = Plan(accum, c, lspo::v1::MODE_LSP, false);
  EXPECT_EQ(term(lsp2, "S accumulators (fp32)"), 14 * 16 * 16 * 4);
  EXPECT_EQ(lsp2.gradients_in_flight, 0);
  EXPECT_EQ(lsp.OptimizerHost(), 4 * (p_lin + p_rest) + 12 * 14 * 16 * 16);
  EXPECT_EQ(lsp.d2h_bytes_per_step, 14 * 16 * 16 * 4);
  // lsp.compression dense adds each side densified, 4 (m + n) d bytes per matrix.
  lspo::v1::JobSpec dense_spec = spec;
  dense_spec.mutable_lsp()->set_compression(lspo::v1::COMPRESSION_DENSE);
  const MemoryPlan dense = Plan(dense_spec, c, lspo::v1::MODE_LSP, false);
  ASSERT_EQ(dense.device_static.size(), lsp.device_static.size() + 1);
  EXPECT_EQ(term(dense, "dense projectors (lsp.compression: dense, fp32)"), sides * 4 * 16);
  EXPECT_EQ(dense.DeviceStatic() - lsp.DeviceStatic(), sides * 4 * 16);
  // The arena is the layout the worker creates.
  const MemoryPlan zero = Plan(spec, c, lspo::v1::MODE_ZERO, false);
  EXPECT_EQ(zero.d2h_bytes_per_step, 2 * p_lin);
  // The overlap schedule without clipping keeps undo records of the matrices updated before
  // the worker's verdict (12 bytes per parameter here: under the 1 GiB cap); serial does not.
  EXPECT_EQ(zero.OptimizerHost(), 4 * (p_lin + p_rest) + 8 * p_lin + 12 * p_lin);
  lspo::v1::JobSpec serial = spec;
  serial.set_schedule(lspo::v1::STEP_SCHEDULE_SERIAL);
  EXPECT_EQ(Plan(serial, c, lspo::v1::MODE_ZERO, false).OptimizerHost(),
            4 * (p_lin + p_rest) + 8 * p_lin);
  EXPECT_GE(zero.arena, 4 * p_lin);
  EXPECT_LT(zero.arena, 4 * p_lin + 64 * 15 + 4096);
  // Activations, no checkpointing, lsp on fp32 weights (N = 128 tokens, B = 4, T = 32): per
  // layer N (H + qd + 2 kvd + H + 3F + 2 + Σ d_q) + B nh T^2 floats, Σ d_q = 7 x 16.
  const int64_t N = 128;
  const int64_t layer = N * (64 + 64 + 64 + 64 + 3 * 128 + 2 + 7 * 16) + 4 * 4 * 32 * 32;
  // The loss keeps dL/dh (N x H floats, model/linear_cross_entropy.h), not N x V.
  EXPECT_EQ(lsp.activations_no_checkpointing, 4 * (2 * layer + N * 64 + N + N * 64));
  // Native keeps each linear's input instead of X Q: + N (H + qd + H + F) - N Σ d_q per layer.
  const MemoryPlan native = Plan(spec, c, lspo::v1::MODE_NATIVE, false);
  EXPECT_EQ(native.activations_no_checkpointing - lsp.activations_no_checkpointing,
            4 * 2 * N * ((64 + 64 + 64 + 128) - 7 * 16));
  // With checkpointing: every layer's input, one layer recomputed.
  EXPECT_EQ(lsp.activations_checkpointing, 4 * (2 * N * 64 + layer + N * 64 + N + N * 64));
}

TEST(MemoryPlanTest, BadSettingsAreRefusedNamingTheField) {
  lspo::v1::JobSpec spec = DeviceCheckSpec(16, -1, 32);  // 0 is unset: planned as 8
  absl::StatusOr<MemoryPlan> p = PlanJobMemory(spec, Smol(), lspo::v1::MODE_LSP, true);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("micro_batch_size"), std::string::npos) << p.status();
  spec = DeviceCheckSpec(16, 1, 32);
  spec.mutable_galore()->set_rank(4096);
  p = PlanJobMemory(spec, Smol(), lspo::v1::MODE_GALORE, true);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("rank"), std::string::npos) << p.status();
  spec = DeviceCheckSpec(16, 1, 32);
  spec.mutable_lsp()->set_r(0);
  p = PlanJobMemory(spec, Smol(), lspo::v1::MODE_LSP, true);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("lsp"), std::string::npos) << p.status();
}

TEST(MemoryPlanTest, AnHfFolderNeedsOnlyItsConfigToBePlanned) {
  // TinyLlama-1.1B's config.json (TinyLlama/TinyLlama-1.1B-Chat-v1.0 on the Hugging Face hub),
  // no weight file: the model has 1,100,048,384 parameters (the hub's count).
  char tmpl[] = "/tmp/lspo-plan-hf-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::ofstream(dir + "/config.json")
      << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
             "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
             "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-05,
             "rope_theta": 10000.0, "tie_word_embeddings": false})";
  lspo::v1::JobSpec spec = DeviceCheckSpec(256, 1, 512);
  spec.mutable_model()->set_path(dir);
  spec.mutable_model()->set_format(lspo::v1::MODEL_FORMAT_HF);
  absl::StatusOr<model::LlamaConfig> c = LoadJobModelConfig(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->NumParameters(), 1100048384);
  const MemoryPlan lsp = Plan(spec, *c, lspo::v1::MODE_LSP, true);
  // bf16 on CUDA: 2 bytes per trained element, and per parameter of the untied lm_head,
  // the embedding and the norms (no biases).
  EXPECT_EQ(lsp.device_static[0].bytes, 2 * 968884224LL);
  EXPECT_EQ(lsp.device_static[1].name, "embedding, norms (bf16)");
  EXPECT_EQ(lsp.device_static[1].bytes, 2 * (1100048384LL - 968884224LL));
  // On the CPU (fp32 weights) all in fp32.
  const MemoryPlan cpu = Plan(spec, *c, lspo::v1::MODE_LSP, false);
  EXPECT_EQ(cpu.device_static[1].name, "embedding, norms (fp32)");
  EXPECT_EQ(cpu.device_static[1].bytes, 4 * (1100048384LL - 968884224LL));
  EXPECT_EQ(lsp.trained_parameters, 968884224LL);
  EXPECT_EQ(lsp.trained_matrices, 22 * 7);
  spec.mutable_model()->set_path(dir + "/missing");
  c = LoadJobModelConfig(spec);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("missing/config.json"), std::string::npos) << c.status();
}

}  // namespace
}  // namespace lspo::offload
