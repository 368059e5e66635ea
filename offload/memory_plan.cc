#include "offload/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/loss_blocks.h"
#include "offload/arena_layout.h"
#include "offload/mode_plans.h"
#include "offload/training_mode.h"
#include "runtime/status_macros.h"

namespace lspo::offload {
namespace {

using lspo::v1::JobSpec;

constexpr int64_t kLinears = 7;  // model::kLinearsPerLayer: q, k, v, o, gate, up, down.
constexpr const char* kModules[kLinears] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                            "gate_proj", "up_proj", "down_proj"};

// The trained matrices of `c` in linear order (model/llama.h LinearKind), HF names and shapes.
std::vector<LinearShape> LinearShapesOf(const model::LlamaConfig& c) {
  const int64_t H = c.hidden_size, F = c.intermediate_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  const int64_t m[kLinears] = {qd, kvd, kvd, H, F, F, H};
  const int64_t n[kLinears] = {H, H, H, qd, H, H, F};
  std::vector<LinearShape> out;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (int64_t k = 0; k < kLinears; ++k) {
      const char* block = k < 4 ? "self_attn" : "mlp";
      out.push_back({static_cast<int32_t>(out.size()),
                     absl::StrCat("model.layers.", l, ".", block, ".", kModules[k], ".weight"),
                     m[k], n[k]});
    }
  }
  return out;
}

// Floats one decoder layer keeps for its backward (see the header), without the fp32 upcast
// copies of bf16 weights. `saves_input[k]`: linear k keeps its input X (dense weight gradient
// or LoRA's A gradient); `extra[k]`: floats per token linear k keeps besides (lsp: d_q of X Q;
// lora: r of X A^T).
int64_t LayerSavedFloats(const model::LlamaConfig& c, int64_t B, int64_t T,
                         const bool saves_input[kLinears], const int64_t extra[kLinears]) {
  const int64_t N = B * T, H = c.hidden_size, F = c.intermediate_size;
  const int64_t qd = c.num_heads * c.head_dim, kvd = c.num_kv_heads * c.head_dim;
  // Layer input (input norm), rotated q as a contiguous copy, rotated k, v (attention
  // matmuls), mid-layer residual (post norm), gate / silu(gate) / up (SwiGLU), two RMS
  // statistics; the softmax probabilities (B, nh, T, T).
  int64_t per_token = H + qd + 2 * kvd + H + 3 * F + 2;
  // Qwen3's and Gemma's q_norm / k_norm keep their inputs (q, k before the norm) and one RMS
  // statistic per head.
  if (c.qk_norm) per_token += qd + kvd + c.num_heads + c.num_kv_heads;
  // Gemma's sandwich norms keep two more inputs (the attention and MLP outputs) and statistics.
  if (c.sandwich_norms) per_token += 2 * H + 2;
  // Inputs kept by the linears that keep them: the input norm's output (q, k, v), the o_proj
  // input, the post norm's output (gate, up), the down_proj input.
  if (saves_input[0] || saves_input[1] || saves_input[2]) per_token += H;
  if (saves_input[3]) per_token += qd;
  if (saves_input[4] || saves_input[5]) per_token += H;
  if (saves_input[6]) per_token += F;
  for (int64_t k = 0; k < kLinears; ++k) per_token += extra[k];
  return N * per_token + B * c.num_heads * T * T;
}

int64_t ParamsOther(const model::LlamaConfig& c) {
  int64_t lin = 0;
  for (const auto& l : LinearShapesOf(c)) lin += l.m * l.n;
  return c.NumParameters() - lin;
}

}  // namespace

int64_t MemoryPlan::DeviceStatic() const {
  int64_t s = 0;
  for (const auto& t : device_static) s += t.bytes;
  return s;
}

int64_t MemoryPlan::OptimizerHost() const {
  int64_t s = 0;
  for (const auto& t : optimizer_host) s += t.bytes;
  return s;
}

absl::StatusOr<MemoryPlan> PlanJobMemory(const JobSpec& spec, const model::LlamaConfig& c,
                                         lspo::v1::TrainingMode mode, bool cuda) {
  const int64_t B = MicroBatchOf(spec), T = spec.seq_len();
  if (B < 1 || T < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec fields micro_batch_size = ", B, ", seq_len = ", T,
                     ": both must be >= 1 (e.g. micro_batch_size: 8, seq_len: 512)"));
  }
  if (spec.grad_accum() < 0 || spec.lora().r() < 0 || spec.galore().rank() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec fields grad_accum = ", spec.grad_accum(),
                     ", lora.r = ", spec.lora().r(), ", galore.rank = ", spec.galore().rank(),
                     ": none may be negative (0 takes the default: 1, 8, 128)"));
  }
  MemoryPlan plan;
  plan.mode = mode;
  plan.cuda = cuda;
  plan.tokens = B * T;
  plan.checkpointing = spec.activation_checkpointing();
  // worker_core.cc LoadJob: bf16 storage when asked, or on CUDA unless fp32 is asked.
  const bool bf16 = SixteenBitWorkerWeights(spec, cuda);
  const int64_t w = bf16 ? 2 : 4;
  plan.weight_bytes = w;
  const char* wname = bf16 ? "bf16" : "fp32";
  const int64_t N = plan.tokens, L = c.num_layers, H = c.hidden_size, V = c.vocab_size;

  const std::vector<LinearShape> linears = LinearShapesOf(c);
  int64_t p_lin = 0, max_mn = 0;
  for (const auto& l : linears) {
    p_lin += l.m * l.n;
    max_mn = std::max(max_mn, l.m * l.n);
  }
  const int64_t p_rest = ParamsOther(c);
  const int64_t p_total = p_lin + p_rest;
  plan.trained_parameters = p_lin;
  plan.trained_matrices = static_cast<int64_t>(linears.size());

  // Static device memory: model/llama.cc keeps the trained matrices in the storage dtype
  // (SetLinearStorageDtype); a CUDA worker with 16-bit weights keeps the embedding, head and
  // norms in bf16 too (SetFrozenStorageDtype, worker job_loading.cc PlaceModel), the biases
  // in fp32; otherwise all three in fp32.
  AddPlanTerm(&plan.device_static, absl::StrCat("trained weights (", wname, ")"), w * p_lin);
  const int64_t p_bias =
      c.num_layers *
      ((c.qkv_bias ? c.num_heads * c.head_dim + 2 * c.num_kv_heads * c.head_dim : 0) +
       (c.o_bias ? H : 0));
  if (cuda && bf16) {
    AddPlanTerm(&plan.device_static, "embedding, norms (bf16)", 2 * (p_rest - p_bias));
    if (p_bias > 0) AddPlanTerm(&plan.device_static, "biases (fp32)", 4 * p_bias);
  } else {
    AddPlanTerm(&plan.device_static, "embedding, norms (fp32)", 4 * p_rest);
  }

  ModePlanContext mc{spec, linears, cuda, bf16, w, wname, max_mn, p_lin, p_total, &plan};
  mc.summed = p_lin;
  RETURN_IF_ERROR(DescriptorOf(mode).plan(&mc));
  const bool* saves_input = mc.saves_input;
  const int64_t* extra = mc.extra;
  const int64_t grads = mc.grads, summed = mc.summed, s_transient = mc.s_transient;
  if (spec.distributed().world_size() > 1) {
    // offload/overlap_reducer.h: fp32 buckets of every matrix's S or gradient (native, lora,
    // galore: offload::SumTensorsAcrossRanks' one fp32 buffer of the same size), in host
    // memory: on a CUDA worker they are host copies (offload/collective.h).
    const int64_t buffers = 4 * summed;
    if (cuda) {
      plan.worker_host_train = buffers;
    } else {
      AddPlanTerm(&plan.device_static, "all-reduce buffers (fp32)", buffers);
    }
  }

  // Activations (see the header), bytes.
  int64_t layer_mn = 0;  // Σ m n of one layer
  for (int64_t k = 0; k < kLinears; ++k)
    layer_mn += linears[static_cast<size_t>(k)].m * linears[static_cast<size_t>(k)].n;
  // No fp32 upcast copies of 16-bit weights: every linear keeps W as stored for its backward
  // (model::UpcastLinear, the LinearImpl contract). Up to 2026-12-06 each linear kept one
  // (4 m n bytes), which the H200 run's peaks include (tests/offload/memory_plan_test.cc).
  const int64_t layer = 4 * LayerSavedFloats(c, B, T, saves_input, extra);
  const int64_t rows = N;  // loss rows (see the header)
  // model/linear_cross_entropy.h: the loss keeps dL/dh (R, H) for its backward and holds two
  // blocks of fp32 logits at a time (the block and logsumexp's temporary).
  const int64_t loss_kept = 4 * rows * H;
  const int64_t loss_blocks = 4 * 2 * std::min(rows, model::LossBlockRows(V)) * V;
  const int64_t final_norm = 4 * (N * H + N);  // last layer output, RMS statistics
  plan.activations_no_checkpointing = L * layer + final_norm + loss_kept;
  plan.activations_checkpointing = L * 4 * N * H + final_norm + loss_kept + layer;
  plan.activations =
      plan.checkpointing ? plan.activations_checkpointing : plan.activations_no_checkpointing;
  // Transients: the loss's logits blocks and, at the start of the backward, dL/dh scaled
  // (R H), or one layer's attention backward (gradients of the probabilities and scores,
  // 2 B nh T^2) with its SwiGLU gradients (4 N F).
  const int64_t attn_ws = 4 * (2 * B * c.num_heads * T * T + 4 * N * c.intermediate_size);
  plan.workspace = std::max(loss_blocks + 4 * rows * H, attn_ws);
  // End of the backward: every dense gradient, plus the largest matrix's fp32 gradient on its
  // way into a bf16 one.
  plan.gradients_in_flight = (grads > 0 ? w * grads + (bf16 ? 4 * max_mn : 0) : 0) + s_transient;
  const int64_t accum_grads = spec.grad_accum() > 1 ? w * grads : 0;
  const int64_t phase_start = plan.activations + plan.workspace + accum_grads;
  const int64_t phase_end = plan.gradients_in_flight + attn_ws;
  const int64_t peak = plan.DeviceStatic() + std::max(phase_start, phase_end);
  plan.margin_fraction = cuda ? kCudaAllocatorMargin : kCpuHeapRetention;
  plan.margin = static_cast<int64_t>(
      std::llround(plan.margin_fraction * (cuda ? peak : plan.activations + plan.workspace)));
  plan.device_peak = peak + plan.margin;
  plan.worker_host_load = cuda ? 4 * p_total : 0;
  return plan;
}

absl::StatusOr<std::vector<std::string>> ChooseFittingDefaults(JobSpec* spec,
                                                               const model::LlamaConfig& config,
                                                               lspo::v1::TrainingMode mode,
                                                               bool cuda, int64_t device_bytes) {
  std::vector<std::string> lines;
  if (!cuda) return lines;
  constexpr double kGiB = 1LL << 30;
  const bool ckpt_unset = !spec->has_activation_checkpointing();
  if (ckpt_unset) {
    ASSIGN_OR_RETURN(MemoryPlan plan, PlanJobMemory(*spec, config, mode, cuda));
    if (plan.device_peak > device_bytes) {
      JobSpec with = *spec;
      with.set_activation_checkpointing(true);
      ASSIGN_OR_RETURN(MemoryPlan ckpt, PlanJobMemory(with, config, mode, cuda));
      if (ckpt.device_peak <= device_bytes) {
        spec->set_activation_checkpointing(true);
        lines.push_back(absl::StrFormat(
            "activation checkpointing: on (chosen: the %s plan at micro-batch %d needs %.2f GiB "
            "without it and %.2f GiB with it, of %.2f GiB on the device; set "
            "activation_checkpointing to decide)",
            std::string(DescriptorOf(mode).name).c_str(), MicroBatchOf(*spec),
            plan.device_peak / kGiB, ckpt.device_peak / kGiB, device_bytes / kGiB));
      }
    }
  }
  if (spec->micro_batch_size() != 0 || spec->distributed().world_size() > 1) return lines;
  // The largest power of two up to kMaxChosenMicroBatch that fits with `ckpt`, and its peak.
  auto largest = [&](bool ckpt, int64_t* peak) -> absl::StatusOr<int32_t> {
    JobSpec s = *spec;
    s.set_activation_checkpointing(ckpt);
    for (int32_t b = kMaxChosenMicroBatch; b >= 1; b /= 2) {
      s.set_micro_batch_size(b);
      ASSIGN_OR_RETURN(MemoryPlan p, PlanJobMemory(s, config, mode, cuda));
      if (p.device_peak <= device_bytes) {
        *peak = p.device_peak;
        return b;
      }
    }
    return 0;
  };
  int64_t peak = 0;
  ASSIGN_OR_RETURN(int32_t b, largest(spec->activation_checkpointing(), &peak));
  if (b == 0 && ckpt_unset && !spec->activation_checkpointing()) {
    ASSIGN_OR_RETURN(b, largest(true, &peak));
    if (b > 0) {
      spec->set_activation_checkpointing(true);
      lines.push_back(absl::StrFormat(
          "activation checkpointing: on (chosen: no micro-batch fits %.2f GiB on the device "
          "without it; set activation_checkpointing to decide)",
          device_bytes / kGiB));
    }
  }
  if (b == 0) {
    spec->set_micro_batch_size(kDefaultMicroBatchSize);  // refused by the caller's fit check
    return lines;
  }
  spec->set_micro_batch_size(b);
  lines.push_back(absl::StrFormat(
      "micro_batch_size: %d (chosen: the largest power of two up to %d whose %s plan fits, "
      "%.2f GiB of %.2f GiB on the device with activation checkpointing %s; set "
      "micro_batch_size to decide)",
      b, kMaxChosenMicroBatch, std::string(DescriptorOf(mode).name).c_str(), peak / kGiB,
      device_bytes / kGiB, spec->activation_checkpointing() ? "on" : "off"));
  return lines;
}

int64_t PhysicalHostMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") return kb * 1024;
  }
  return 0;
}

absl::Status CheckOptimizerHostMemory(const JobSpec& spec, const model::LlamaConfig& config,
                                      lspo::v1::TrainingMode mode, int64_t arena_bytes) {
  const int64_t host = PhysicalHostMemoryBytes();
  if (host <= 0) return absl::OkStatus();
  // A spec the planner cannot plan (an unset seq_len of a direct caller) cannot be judged.
  absl::StatusOr<MemoryPlan> planned = PlanJobMemory(spec, config, mode, /*cuda=*/false);
  if (!planned.ok()) return absl::OkStatus();
  const MemoryPlan& plan = *planned;
  const int64_t need = plan.OptimizerHost() + arena_bytes;
  if (need <= host) return absl::OkStatus();
  constexpr double kGiB = 1LL << 30;
  std::vector<PlanTerm> terms = plan.optimizer_host;
  terms.push_back({"shared-memory arena", arena_bytes});
  std::sort(terms.begin(), terms.end(),
            [](const PlanTerm& a, const PlanTerm& b) { return a.bytes > b.bytes; });
  std::vector<std::string> rows;
  for (size_t i = 0; i < terms.size() && i < 3; ++i) {
    rows.push_back(absl::StrFormat("%s %.2f GiB", terms[i].name, terms[i].bytes / kGiB));
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the optimizer service needs %.2f GiB of host memory for this %s job (%s) but this host "
      "has %.2f GiB: run the optimizer service on a host with more memory, or train a smaller "
      "model (a smaller lsp.d shrinks the subspace state); `lspctl plan --spec=FILE` prints "
      "the whole plan",
      need / kGiB, std::string(DescriptorOf(mode).name), absl::StrJoin(rows, ", "), host / kGiB));
}

absl::StatusOr<FitAnswer> FitOnDevice(const JobSpec& spec, const model::LlamaConfig& config,
                                      lspo::v1::TrainingMode mode, bool cuda,
                                      int64_t device_bytes) {
  FitAnswer a;
  ASSIGN_OR_RETURN(MemoryPlan plan, PlanJobMemory(spec, config, mode, cuda));
  a.fits = plan.device_peak <= device_bytes;
  // Largest value in [1, hi] for which fits(v) holds, 0 when none (fits is monotone).
  auto largest = [](int32_t hi, auto fits) -> int32_t {
    if (!fits(1)) return 0;
    int32_t lo = 1;
    while (lo < hi) {
      const int32_t mid = lo + (hi - lo + 1) / 2;
      if (fits(mid)) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  };
  auto fits_with = [&](const JobSpec& s) {
    absl::StatusOr<MemoryPlan> p = PlanJobMemory(s, config, mode, cuda);
    return p.ok() && p->device_peak <= device_bytes;
  };
  for (bool ckpt : {spec.activation_checkpointing(), true}) {
    JobSpec s = spec;
    s.set_activation_checkpointing(ckpt);
    const int32_t mb = largest(kMaxPlannedMicroBatch, [&](int32_t b) {
      s.set_micro_batch_size(b);
      return fits_with(s);
    });
    if (ckpt == spec.activation_checkpointing() && a.largest_micro_batch == 0) {
      a.largest_micro_batch = mb;
    }
    if (ckpt) a.largest_micro_batch_checkpointing = mb;
  }
  // lsp's own settings (the learned-projector mode's): rounding and d.
  const ModeDescriptor& m = DescriptorOf(mode);
  if (m.learned_projectors && !a.fits && m.keeps_residual(spec)) {
    JobSpec s = spec;
    s.mutable_lsp()->set_apply_rounding(lspo::v1::APPLY_ROUNDING_NEAREST);
    a.fits_with_nearest_rounding = fits_with(s);
  }
  if (m.learned_projectors) {
    JobSpec s = spec;
    s.mutable_lsp()->set_d_ratio(0);
    // Below the hidden width: from d = hidden on, every side of the attention matrices and the
    // hidden side of the MLP's is the identity (a full update, lsp/subspace.h), not the method.
    const int64_t widest = std::max<int64_t>(1, config.hidden_size - 1);
    a.largest_d = largest(static_cast<int32_t>(widest), [&](int32_t d) {
      s.mutable_lsp()->set_d(d);
      return fits_with(s);
    });
  }
  return a;
}

std::string FormatPlans(const std::string& title, const std::vector<MemoryPlan>& plans,
                        lspo::v1::TrainingMode own) {
  constexpr double kMiB = 1 << 20;
  constexpr int kName = 60, kCol = 16;
  std::string out = absl::StrCat(title, "\n");
  absl::StrAppendFormat(&out, "%-*s", kName, "MiB");
  for (const auto& p : plans) {
    absl::StrAppendFormat(&out, " %*s", kCol - 1,
                          absl::StrCat(DescriptorOf(p.mode).name, p.mode == own ? " *" : ""));
  }
  out += "\n";
  auto row = [&](const std::string& name, auto value) {
    absl::StrAppendFormat(&out, "%-*s", kName, name);
    for (const auto& p : plans) {
      const int64_t v = value(p);
      absl::StrAppendFormat(&out, "%*s", kCol,
                            v < 0 ? std::string("-") : absl::StrFormat("%.1f", v / kMiB));
    }
    out += "\n";
  };
  // Term names in order of first appearance.
  auto names_of = [&](auto terms_of) {
    std::vector<std::string> names;
    for (const auto& p : plans) {
      for (const auto& t : terms_of(p)) {
        if (std::find(names.begin(), names.end(), t.name) == names.end()) names.push_back(t.name);
      }
    }
    return names;
  };
  auto term = [](const std::vector<PlanTerm>& terms, const std::string& name) -> int64_t {
    for (const auto& t : terms) {
      if (t.name == name) return t.bytes;
    }
    return -1;
  };
  const bool cuda = !plans.empty() && plans[0].cuda;
  out += cuda ? "worker, GPU memory\n" : "worker (CPU)\n";
  for (const auto& n : names_of([](const MemoryPlan& p) { return p.device_static; })) {
    row("  " + n, [&](const MemoryPlan& p) { return term(p.device_static, n); });
  }
  const bool ckpt = !plans.empty() && plans[0].checkpointing;
  row(ckpt ? "  activations, checkpointed (the job's setting)"
           : "  activations (the job's setting)",
      [](const MemoryPlan& p) { return p.activations; });
  row(ckpt ? "    without activation checkpointing" : "    with activation checkpointing",
      [&](const MemoryPlan& p) {
        return ckpt ? p.activations_no_checkpointing : p.activations_checkpointing;
      });
  row("  workspace (loss, one layer's backward)", [](const MemoryPlan& p) { return p.workspace; });
  row("  gradients at the end of the backward (+)",
      [](const MemoryPlan& p) { return p.gradients_in_flight > 0 ? p.gradients_in_flight : -1; });
  const double fraction = plans.empty() ? 0.0 : plans[0].margin_fraction;
  row(cuda
          ? absl::StrFormat("  allocator margin (%.0f%% of the rest)", 100 * fraction)
          : absl::StrFormat("  heap retention (%.0f%% of activations + workspace)", 100 * fraction),
      [](const MemoryPlan& p) { return p.margin; });
  // The two phases do not add up: see the header.
  row("  peak: static + max(activations + workspace, (+)) + margin",
      [](const MemoryPlan& p) { return p.device_peak; });
  out += "optimizer service (host)\n";
  for (const auto& n : names_of([](const MemoryPlan& p) { return p.optimizer_host; })) {
    row("  " + n, [&](const MemoryPlan& p) { return term(p.optimizer_host, n); });
  }
  // "-" where a mode has no optimizer service (native, lora, galore train on the worker).
  auto offloaded = [](const MemoryPlan& p, int64_t v) { return p.arena > 0 ? v : -1; };
  row("  total", [&](const MemoryPlan& p) { return offloaded(p, p.OptimizerHost()); });
  row("shared-memory arena (pinned on CUDA)",
      [&](const MemoryPlan& p) { return offloaded(p, p.arena); });
  if (cuda) {
    row("worker host memory while loading (fp32 model)",
        [](const MemoryPlan& p) { return p.worker_host_load; });
    if (std::any_of(plans.begin(), plans.end(),
                    [](const MemoryPlan& p) { return p.worker_host_train > 0; })) {
      row("worker host memory while training (all-reduce buffers)",
          [](const MemoryPlan& p) { return p.worker_host_train; });
    }
  } else {
    row("one process, everything on the CPU", [](const MemoryPlan& p) { return p.CpuTotal(); });
  }
  row("moved per step, worker -> optimizer",
      [&](const MemoryPlan& p) { return offloaded(p, p.d2h_bytes_per_step); });
  row("moved per step, optimizer -> worker",
      [&](const MemoryPlan& p) { return offloaded(p, p.h2d_bytes_per_step); });
  return out;
}

}  // namespace lspo::offload
