// Each training mode's own memory-plan terms (memory_plan.h PlanJobMemory calls the hook of
// the job's ModeDescriptor, training_mode.h). Internal to offload/: the descriptor table and the
// planner include it.
#ifndef LSPO_OFFLOAD_MODE_PLANS_H_
#define LSPO_OFFLOAD_MODE_PLANS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "offload/arena_layout.h"
#include "offload/memory_plan.h"
#include "proto/job_spec.pb.h"

namespace lspo::offload {

// Linears per decoder layer (model::kLinearsPerLayer: q, k, v, o, gate, up, down).
inline constexpr int64_t kPlanLinears = 7;

// What PlanJobMemory knows before the mode's terms, and what the mode's hook adds beside its
// terms in `plan`. Sizes in elements unless named bytes.
struct ModePlanContext {
  const lspo::v1::JobSpec& spec;
  const std::vector<LinearShape>& linears;  // every trained matrix, linear order
  bool cuda;                                // the worker's terms are for a CUDA device
  bool bf16;                                // the trained matrices are stored in bf16
  int64_t w;                                // their storage bytes per element (2 or 4)
  const char* wname;                        // "bf16" or "fp32"
  int64_t max_mn;                           // the largest m n
  int64_t p_lin;                            // Σ m n
  int64_t p_total;                          // every parameter of the model
  MemoryPlan* plan;                         // the terms are added here
  // Filled by the hook (defaults: a dense linear that keeps its input X).
  bool saves_input[kPlanLinears] = {true, true, true, true, true, true, true};
  int64_t extra[kPlanLinears] = {0, 0, 0, 0, 0, 0, 0};  // floats per token besides, linear k
  int64_t grads = 0;        // dense weight gradients the worker holds (w bytes each)
  int64_t subspace = 0;     // Σ d_p d_q (lsp) or Σ S elements (galore-offload)
  int64_t summed = 0;       // values a data-parallel step all-reduces (PlanJobMemory: p_lin)
  int64_t s_transient = 0;  // lsp, one micro-batch: the step's S, formed in the backward
};

// Appends the term (`name`, `bytes`) to `terms`.
void AddPlanTerm(std::vector<PlanTerm>* terms, std::string name, int64_t bytes);

// The hooks of the descriptors (training_mode.cc), one per mode. Errors: kInvalidArgument
// naming the job spec field that does not fit the model (an lsp subspace, lora.r, galore.rank).
absl::Status PlanLspTerms(ModePlanContext* c);
absl::Status PlanZeroTerms(ModePlanContext* c);
absl::Status PlanNativeTerms(ModePlanContext* c);
absl::Status PlanLoraTerms(ModePlanContext* c);
absl::Status PlanGaloreTerms(ModePlanContext* c);
absl::Status PlanGaloreOffloadTerms(ModePlanContext* c);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_MODE_PLANS_H_
