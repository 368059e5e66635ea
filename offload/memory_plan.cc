#include "offload/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/linear_cross_entropy.h"
#include "offload/arena_layout.h"
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

bool AdaptedByLora(const JobSpec& spec, int64_t kind) {
  for (const auto& t : spec.lora().target_modules()) {
    if (t == kModules[kind]) return true;
  }
  return false;
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

void Add(std::vector<PlanTerm>* terms, std::string name, int64_t bytes) {
  terms->push_back({std::move(name), bytes});
}

// The terms every offloaded mode (lsp, zero, GaLore-Offload) shares: the arena, the optimizer
// service's fp32 model and its Adam state (`moments`, `moment_bytes`), and the bytes each way
// per optimizer step.
void AddOffloadTerms(MemoryPlan* plan, const lspo::v1::ArenaLayout& layout, int64_t p_total,
                     std::string moments, int64_t moment_bytes, int64_t bytes_per_step) {
  plan->arena = static_cast<int64_t>(layout.bytes());
  Add(&plan->optimizer_host, "fp32 model (master weights, embedding, norms)", 4 * p_total);
  Add(&plan->optimizer_host, std::move(moments), moment_bytes);
  plan->d2h_bytes_per_step = plan->h2d_bytes_per_step = bytes_per_step;
}

}  // namespace

bool KeepsApplyResidual(const lspo::v1::JobSpec& spec) {
  const lspo::v1::ApplyRounding r = spec.lsp().apply_rounding();
  return r == lspo::v1::APPLY_ROUNDING_UNSPECIFIED || r == lspo::v1::APPLY_ROUNDING_COMPENSATED;
}

const char* PlanModeName(PlanMode mode) {
  switch (mode) {
    case PlanMode::kLsp:
      return "lsp";
    case PlanMode::kZero:
      return "zero";
    case PlanMode::kNative:
      return "native";
    case PlanMode::kLora:
      return "lora";
    case PlanMode::kGalore:
      return "galore";
    case PlanMode::kGaloreOffload:
      return "galore-offload";
  }
  return "?";
}

PlanMode PlanModeOf(const JobSpec& spec) {
  switch (spec.mode()) {
    case lspo::v1::MODE_ZERO:
      return PlanMode::kZero;
    case lspo::v1::MODE_NATIVE:
      return PlanMode::kNative;
    case lspo::v1::MODE_LORA:
      return PlanMode::kLora;
    case lspo::v1::MODE_GALORE:
      return spec.galore().offload() ? PlanMode::kGaloreOffload : PlanMode::kGalore;
    default:
      return PlanMode::kLsp;
  }
}

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
                                         PlanMode mode, bool cuda) {
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
  const bool bf16 = spec.weight_dtype() == lspo::v1::WEIGHT_DTYPE_BF16 ||
                    (cuda && spec.weight_dtype() == lspo::v1::WEIGHT_DTYPE_UNSPECIFIED);
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

  // Static device memory: model/llama.cc keeps the trained matrices in the storage dtype and
  // the embedding, norms and biases in fp32 (SetLinearStorageDtype).
  Add(&plan.device_static, absl::StrCat("trained weights (", wname, ")"), w * p_lin);
  Add(&plan.device_static, "embedding, norms (fp32)", 4 * p_rest);

  bool saves_input[kLinears];
  int64_t extra[kLinears] = {0, 0, 0, 0, 0, 0, 0};
  std::fill(saves_input, saves_input + kLinears, mode != PlanMode::kLsp);
  int64_t grads = 0;     // dense weight gradients the worker holds (w bytes each)
  int64_t subspace = 0;  // Σ d_p d_q (lsp) or Σ S elements (galore-offload)
  int64_t summed = p_lin;  // values a data-parallel step all-reduces (the gradients')
  int64_t s_transient = 0;  // lsp, one micro-batch: the step's S, formed in the backward
  switch (mode) {
    case PlanMode::kLsp: {
      ASSIGN_OR_RETURN(std::vector<lsp::MatrixSubspace> subs,
                       ResolveJobSubspaces(linears, spec.lsp()));
      int64_t proj = 0, max_dd = 0, dense = 0;
      for (size_t i = 0; i < subs.size(); ++i) {
        subspace += subs[i].numel();
        max_dd = std::max(max_dd, subs[i].numel());
        // lsp/projector.h: int64 positions + fp32 values, (rows, r) per side.
        proj += 12 * (subs[i].p.rows * subs[i].p.r + subs[i].q.rows * subs[i].q.r);
        // lsp.compression dense (lsp/lsp_linear.h): fp32 (rows, d) per non-identity side.
        if (!subs[i].p.identity) dense += 4 * subs[i].p.rows * subs[i].p.dim;
        if (!subs[i].q.identity) dense += 4 * subs[i].q.rows * subs[i].q.dim;
        if (i < static_cast<size_t>(kLinears)) extra[i] = subs[i].q.dim;  // X Q (N, d_q)
      }
      Add(&plan.device_static, absl::StrCat("projectors P, Q (r = ", spec.lsp().r(), ")"), proj);
      if (spec.lsp().compression() == lspo::v1::COMPRESSION_DENSE) {
        Add(&plan.device_static, "dense projectors (lsp.compression: dense, fp32)", dense);
      }
      // gpu_worker/lsp_path.h s_accum_: accumulators for the whole job only with grad_accum
      // > 1; with one micro-batch each S lives from its backward to its publication (counted
      // at the end of the backward, all of them: the serial schedule's case).
      if (spec.grad_accum() > 1) {
        Add(&plan.device_static, "S accumulators (fp32)", 4 * subspace);
      } else {
        s_transient = 4 * subspace;
      }
      // device_offload.h kStagingSlots upload buffers (CUDA).
      if (cuda) Add(&plan.device_static, "upload staging (4 slots)", 4 * 4 * max_dd);
      if (bf16 && KeepsApplyResidual(spec)) {
        Add(&plan.device_static, "compensation residuals (bf16)", 2 * p_lin);
      }
      ASSIGN_OR_RETURN(
          lspo::v1::ArenaLayout layout,
          BuildArenaLayout(linears, kLinears, subs, spec.lsp().d(), spec.lsp().r(), "plan"));
      AddOffloadTerms(&plan, layout, p_total, "subspace Adam: sum of steps, m, v (fp32)",
                      12 * subspace, 4 * subspace);
      break;
    }
    case PlanMode::kZero: {
      grads = p_lin;
      if (cuda) Add(&plan.device_static, "transfer staging (4 slots, bf16)", 4 * 2 * max_mn);
      ASSIGN_OR_RETURN(lspo::v1::ArenaLayout layout,
                       BuildZeroArenaLayout(linears, kLinears, "plan"));
      AddOffloadTerms(&plan, layout, p_total, "Adam m, v (fp32)", 8 * p_lin, 2 * p_lin);
      if (spec.schedule() != lspo::v1::STEP_SCHEDULE_SERIAL && spec.optim().max_grad_norm() <= 0) {
        // cpu_optimizer_service/optimizer_core.cc: the undo records of the matrices updated
        // before the worker's verdict (master, m, v), at most 1 GiB.
        Add(&plan.optimizer_host, "undo records before the step's verdict (fp32, <= 1 GiB)",
            std::min<int64_t>(12 * p_lin, int64_t{1} << 30));
      }
      break;
    }
    case PlanMode::kNative: {
      grads = p_lin;
      // gpu_worker/worker_adamw.h: exp_avg, exp_avg_sq in the parameters' dtype.
      Add(&plan.device_static, absl::StrCat("AdamW m, v (", wname, ")"), 2 * w * p_lin);
      break;
    }
    case PlanMode::kLora: {
      // ResolveDefaults' (PEFT's) defaults where the spec is of another mode: r 8, every linear.
      const int64_t r = spec.lora().r() > 0 ? spec.lora().r() : 8;
      int64_t adapters = 0;
      for (int64_t k = 0; k < kLinears; ++k) {
        saves_input[k] = spec.lora().target_modules().empty() || AdaptedByLora(spec, k);
        if (saves_input[k]) extra[k] = r;
      }
      for (const auto& l : linears) {
        if (!saves_input[l.index % kLinears]) continue;
        if (r > std::min(l.m, l.n)) {
          return absl::InvalidArgumentError(
              absl::StrCat("job spec field lora.r = ", r, " is above the smaller side of ", l.name,
                           " (", l.m, " x ", l.n, "): use lora.r <= ", std::min(l.m, l.n)));
        }
        adapters += r * (l.m + l.n);
      }
      // baselines/lora.cc: A (r, n), B (m, r) fp32; their gradients and AdamW's m, v.
      Add(&plan.device_static, absl::StrCat("LoRA A, B, gradients, AdamW m, v (r = ", r, ")"),
          16 * adapters);
      summed = adapters;
      break;
    }
    case PlanMode::kGalore:
    case PlanMode::kGaloreOffload: {
      // ResolveDefaults' (GaLore's README) default where the spec is of another mode: 128.
      const int64_t rank = spec.galore().rank() > 0 ? spec.galore().rank() : 128;
      grads = p_lin;
      int64_t big = 0, small = 0;
      for (const auto& l : linears) {
        if (rank > std::min(l.m, l.n)) {  // baselines/galore.h: rank <= min(m, n)
          return absl::InvalidArgumentError(absl::StrCat(
              "job spec field galore.rank = ", rank, " is above the smaller side of ", l.name, " (",
              l.m, " x ", l.n, "): use galore.rank <= ", std::min(l.m, l.n)));
        }
        big += rank * std::max(l.m, l.n);
        small += rank * std::min(l.m, l.n);
      }
      if (mode == PlanMode::kGalore) {
        // baselines/galore.h GaloreAdamW::StateBytes: m, v (rank x max) and the projector.
        Add(&plan.device_static, absl::StrCat("GaLore m, v, projectors (rank ", rank, ")"),
            4 * (2 * big + small));
      } else {
        // GaLore-Offload's slots need rank < min(m, n) (offload/arena_layout.h).
        ASSIGN_OR_RETURN(lspo::v1::ArenaLayout layout,
                         BuildGaloreArenaLayout(linears, kLinears, rank, "plan"));
        subspace = big;
        Add(&plan.device_static, absl::StrCat("GaLore projectors (rank ", rank, ")"), 4 * small);
        Add(&plan.device_static, "projected gradients (fp32)", 4 * big);
        if (bf16) Add(&plan.device_static, "compensation residuals (bf16)", 2 * p_lin);
        AddOffloadTerms(&plan, layout, p_total, "subspace Adam: sum of steps, m, v (fp32)",
                        12 * big, 4 * big);
      }
      break;
    }
  }
  if (spec.distributed().world_size() > 1) {
    // offload/overlap_reducer.h: fp32 buckets of every matrix's S or gradient (native, lora,
    // galore: offload::SumTensorsAcrossRanks' one fp32 buffer of the same size), in host
    // memory: on a CUDA worker they are host copies (offload/collective.h).
    if (mode == PlanMode::kLsp || mode == PlanMode::kGaloreOffload) summed = subspace;
    const int64_t buffers = 4 * summed;
    if (cuda) {
      plan.worker_host_train = buffers;
    } else {
      Add(&plan.device_static, "all-reduce buffers (fp32)", buffers);
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
  const int64_t rows = N;                      // loss rows (see the header)
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

absl::StatusOr<std::vector<std::string>> ChooseFittingDefaults(
    JobSpec* spec, const model::LlamaConfig& config, PlanMode mode, bool cuda,
    int64_t device_bytes) {
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
            PlanModeName(mode), MicroBatchOf(*spec), plan.device_peak / kGiB,
            ckpt.device_peak / kGiB, device_bytes / kGiB));
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
      b, kMaxChosenMicroBatch, PlanModeName(mode), peak / kGiB, device_bytes / kGiB,
      spec->activation_checkpointing() ? "on" : "off"));
  return lines;
}

absl::StatusOr<FitAnswer> FitOnDevice(const JobSpec& spec, const model::LlamaConfig& config,
                                      PlanMode mode, bool cuda, int64_t device_bytes) {
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
  if (mode == PlanMode::kLsp && !a.fits && KeepsApplyResidual(spec)) {
    JobSpec s = spec;
    s.mutable_lsp()->set_apply_rounding(lspo::v1::APPLY_ROUNDING_NEAREST);
    a.fits_with_nearest_rounding = fits_with(s);
  }
  if (mode == PlanMode::kLsp) {
    JobSpec s = spec;
    s.mutable_lsp()->set_d_ratio(0);
    const int64_t widest = std::max(config.hidden_size, config.intermediate_size);
    a.largest_d = largest(static_cast<int32_t>(widest), [&](int32_t d) {
      s.mutable_lsp()->set_d(d);
      return fits_with(s);
    });
  }
  return a;
}

std::string FormatPlans(const std::string& title, const std::vector<MemoryPlan>& plans,
                        PlanMode own) {
  constexpr double kMiB = 1 << 20;
  constexpr int kName = 60, kCol = 16;
  std::string out = absl::StrCat(title, "\n");
  absl::StrAppendFormat(&out, "%-*s", kName, "MiB");
  for (const auto& p : plans) {
    absl::StrAppendFormat(&out, " %*s", kCol - 1,
                          absl::StrCat(PlanModeName(p.mode), p.mode == own ? " *" : ""));
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
