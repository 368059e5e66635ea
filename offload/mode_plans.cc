// Each training mode's own memory-plan terms (mode_plans.h); the terms every mode shares and
// the activations are PlanJobMemory's (memory_plan.cc). Every term names the code that
// allocates it.
#include "offload/mode_plans.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "offload/training_mode.h"
#include "runtime/status_macros.h"

namespace lspo::offload {
namespace {

using lspo::v1::JobSpec;

constexpr const char* kModules[kPlanLinears] = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                "gate_proj", "up_proj", "down_proj"};

bool AdaptedByLora(const JobSpec& spec, int64_t kind) {
  for (const auto& t : spec.lora().target_modules()) {
    if (t == kModules[kind]) return true;
  }
  return false;
}

// The terms every offloaded mode (lsp, zero, GaLore-Offload) shares: the arena, the optimizer
// service's fp32 model and its Adam state (`moments`, `moment_bytes`), and the bytes each way
// per optimizer step.
void AddOffloadTerms(MemoryPlan* plan, const lspo::v1::ArenaLayout& layout, int64_t p_total,
                     std::string moments, int64_t moment_bytes, int64_t bytes_per_step) {
  plan->arena = static_cast<int64_t>(layout.bytes());
  AddPlanTerm(&plan->optimizer_host, "fp32 model (master weights, embedding, norms)", 4 * p_total);
  AddPlanTerm(&plan->optimizer_host, std::move(moments), moment_bytes);
  plan->d2h_bytes_per_step = plan->h2d_bytes_per_step = bytes_per_step;
}

// The job's arena layout in `mode` (the descriptor's builder, as the worker calls it).
absl::StatusOr<lspo::v1::ArenaLayout> PlanLayout(lspo::v1::TrainingMode mode,
                                                 const ModePlanContext& c) {
  return DescriptorOf(mode).layout(c.linears, static_cast<int32_t>(kPlanLinears), c.spec, "plan");
}

}  // namespace

void AddPlanTerm(std::vector<PlanTerm>* terms, std::string name, int64_t bytes) {
  terms->push_back({std::move(name), bytes});
}

absl::Status PlanLspTerms(ModePlanContext* c) {
  MemoryPlan* plan = c->plan;
  const JobSpec& spec = c->spec;
  std::fill(c->saves_input, c->saves_input + kPlanLinears, false);
  ASSIGN_OR_RETURN(std::vector<lsp::MatrixSubspace> subs,
                   ResolveJobSubspaces(c->linears, spec.lsp()));
  int64_t proj = 0, max_dd = 0, dense = 0;
  for (size_t i = 0; i < subs.size(); ++i) {
    c->subspace += subs[i].numel();
    max_dd = std::max(max_dd, subs[i].numel());
    // lsp/projector.h: int64 positions + fp32 values, (rows, r) per side.
    proj += 12 * (subs[i].p.rows * subs[i].p.r + subs[i].q.rows * subs[i].q.r);
    // lsp.compression dense (lsp/lsp_linear.h): fp32 (rows, d) per non-identity side.
    if (!subs[i].p.identity) dense += 4 * subs[i].p.rows * subs[i].p.dim;
    if (!subs[i].q.identity) dense += 4 * subs[i].q.rows * subs[i].q.dim;
    if (i < static_cast<size_t>(kPlanLinears)) c->extra[i] = subs[i].q.dim;  // X Q (N, d_q)
  }
  AddPlanTerm(&plan->device_static, absl::StrCat("projectors P, Q (r = ", spec.lsp().r(), ")"),
              proj);
  if (spec.lsp().compression() == lspo::v1::COMPRESSION_DENSE) {
    AddPlanTerm(&plan->device_static, "dense projectors (lsp.compression: dense, fp32)", dense);
  }
  // gpu_worker/lsp_path.h s_accum_: accumulators for the whole job only with grad_accum
  // > 1. With one micro-batch each S lives from its backward to its publication: the serial
  // schedule publishes them all at the end of the backward (all counted there); the overlap
  // schedule as each is formed, freeing it once its copy has landed, so about two layers' S
  // are alive at once (the layer whose copies are on the link and the one being formed: one
  // layer's S is 46 MB at d = 1280, ~2 ms of PCIe against a layer's backward).
  if (spec.grad_accum() > 1) {
    AddPlanTerm(&plan->device_static, "S accumulators (fp32)", 4 * c->subspace);
  } else if (spec.schedule() == lspo::v1::STEP_SCHEDULE_SERIAL) {
    c->s_transient = 4 * c->subspace;
  } else {
    int64_t layer_s = 0, most = 0;
    for (size_t i = 0; i < subs.size(); ++i) {
      layer_s += subs[i].numel();
      if ((i + 1) % kPlanLinears == 0 || i + 1 == subs.size()) {
        most = std::max(most, layer_s);
        layer_s = 0;
      }
    }
    c->s_transient = 4 * std::min(c->subspace, 2 * most);
  }
  // device_offload.h kStagingSlots upload buffers (CUDA).
  if (c->cuda) AddPlanTerm(&plan->device_static, "upload staging (4 slots)", 4 * 4 * max_dd);
  if (c->bf16 && DescriptorOf(lspo::v1::MODE_LSP).keeps_residual(spec)) {
    AddPlanTerm(&plan->device_static, "compensation residuals (bf16)", 2 * c->p_lin);
  }
  ASSIGN_OR_RETURN(lspo::v1::ArenaLayout layout, PlanLayout(lspo::v1::MODE_LSP, *c));
  AddOffloadTerms(plan, layout, c->p_total, "subspace Adam: sum of steps, m, v (fp32)",
                  12 * c->subspace, 4 * c->subspace);
  c->summed = c->subspace;
  return absl::OkStatus();
}

absl::Status PlanZeroTerms(ModePlanContext* c) {
  MemoryPlan* plan = c->plan;
  c->grads = c->p_lin;
  if (c->cuda) {
    AddPlanTerm(&plan->device_static, "transfer staging (4 slots, bf16)", 4 * 2 * c->max_mn);
  }
  ASSIGN_OR_RETURN(lspo::v1::ArenaLayout layout, PlanLayout(lspo::v1::MODE_ZERO, *c));
  AddOffloadTerms(plan, layout, c->p_total, "Adam m, v (fp32)", 8 * c->p_lin, 2 * c->p_lin);
  if (c->spec.schedule() != lspo::v1::STEP_SCHEDULE_SERIAL &&
      c->spec.optim().max_grad_norm() <= 0) {
    // cpu_optimizer_service/optimizer_core.cc: the undo records of the matrices updated
    // before the worker's verdict (master, m, v), at most 1 GiB.
    AddPlanTerm(&plan->optimizer_host, "undo records before the step's verdict (fp32, <= 1 GiB)",
                std::min<int64_t>(12 * c->p_lin, int64_t{1} << 30));
  }
  return absl::OkStatus();
}

absl::Status PlanNativeTerms(ModePlanContext* c) {
  c->grads = c->p_lin;
  // gpu_worker/worker_adamw.h: exp_avg, exp_avg_sq in the parameters' dtype.
  AddPlanTerm(&c->plan->device_static, absl::StrCat("AdamW m, v (", c->wname, ")"),
              2 * c->w * c->p_lin);
  return absl::OkStatus();
}

absl::Status PlanLoraTerms(ModePlanContext* c) {
  const JobSpec& spec = c->spec;
  // ResolveDefaults' (PEFT's) defaults where the spec is of another mode: r 8, every linear.
  const int64_t r = spec.lora().r() > 0 ? spec.lora().r() : 8;
  int64_t adapters = 0;
  for (int64_t k = 0; k < kPlanLinears; ++k) {
    c->saves_input[k] = spec.lora().target_modules().empty() || AdaptedByLora(spec, k);
    if (c->saves_input[k]) c->extra[k] = r;
  }
  for (const auto& l : c->linears) {
    if (!c->saves_input[l.index % kPlanLinears]) continue;
    if (r > std::min(l.m, l.n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("job spec field lora.r = ", r, " is above the smaller side of ", l.name,
                       " (", l.m, " x ", l.n, "): use lora.r <= ", std::min(l.m, l.n)));
    }
    adapters += r * (l.m + l.n);
  }
  // baselines/lora.cc: A (r, n), B (m, r) fp32; their gradients and AdamW's m, v.
  AddPlanTerm(&c->plan->device_static,
              absl::StrCat("LoRA A, B, gradients, AdamW m, v (r = ", r, ")"), 16 * adapters);
  c->summed = adapters;
  return absl::OkStatus();
}

namespace {

// GaLore's rank (ResolveDefaults' default, GaLore's README, where the spec is of another mode:
// 128) and Σ rank max(m, n), Σ rank min(m, n) over the matrices.
// Errors: kInvalidArgument when the rank is above a matrix's smaller side (baselines/galore.h).
absl::Status GaloreSizes(const ModePlanContext& c, int64_t* rank, int64_t* big, int64_t* small) {
  *rank = c.spec.galore().rank() > 0 ? c.spec.galore().rank() : 128;
  *big = *small = 0;
  for (const auto& l : c.linears) {
    if (*rank > std::min(l.m, l.n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec field galore.rank = ", *rank, " is above the smaller side of ", l.name, " (",
          l.m, " x ", l.n, "): use galore.rank <= ", std::min(l.m, l.n)));
    }
    *big += *rank * std::max(l.m, l.n);
    *small += *rank * std::min(l.m, l.n);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PlanGaloreTerms(ModePlanContext* c) {
  int64_t rank, big, small;
  RETURN_IF_ERROR(GaloreSizes(*c, &rank, &big, &small));
  c->grads = c->p_lin;
  // baselines/galore.h GaloreAdamW::StateBytes: m, v (rank x max) and the projector.
  AddPlanTerm(&c->plan->device_static, absl::StrCat("GaLore m, v, projectors (rank ", rank, ")"),
              4 * (2 * big + small));
  return absl::OkStatus();
}

absl::Status PlanGaloreOffloadTerms(ModePlanContext* c) {
  int64_t rank, big, small;
  RETURN_IF_ERROR(GaloreSizes(*c, &rank, &big, &small));
  c->grads = c->p_lin;
  MemoryPlan* plan = c->plan;
  // GaLore-Offload's slots need rank < min(m, n) (offload/arena_layout.h).
  ASSIGN_OR_RETURN(lspo::v1::ArenaLayout layout, PlanLayout(lspo::v1::MODE_GALORE_OFFLOAD, *c));
  c->subspace = big;
  AddPlanTerm(&plan->device_static, absl::StrCat("GaLore projectors (rank ", rank, ")"), 4 * small);
  AddPlanTerm(&plan->device_static, "projected gradients (fp32)", 4 * big);
  if (c->bf16 && DescriptorOf(lspo::v1::MODE_GALORE_OFFLOAD).keeps_residual(c->spec)) {
    AddPlanTerm(&plan->device_static, "compensation residuals (bf16)", 2 * c->p_lin);
  }
  AddOffloadTerms(plan, layout, c->p_total, "subspace Adam: sum of steps, m, v (fp32)", 12 * big,
                  4 * big);
  c->summed = c->subspace;
  return absl::OkStatus();
}

}  // namespace lspo::offload
