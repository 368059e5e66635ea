// The training modes, each described once (issue 44): its name, its own settings and their
// check, what it moves through the shared-memory arena, its memory-plan terms and its arena
// layout. lspctl, the job spec checks, the job runner, the memory planner and both services
// read a mode from here instead of testing the enum; what a mode *does* lives in its update
// path on the worker (gpu_worker/update_path.h) and its update rule on the optimizer
// (cpu_optimizer_service/update_rule.h). Torch-free: the scheduler links it.
//
// Adding a mode: a value in proto/job_spec.proto's TrainingMode, one entry in kModes
// (training_mode.cc) with its plan terms (mode_plans.cc), its worker path (a file and a line
// in gpu_worker/update_path.cc) and, when it offloads, its optimizer rule
// (docs/architecture.md, "Training modes").
//
// Thread-safety: the descriptors are immutable statics; every function is pure.
#ifndef LSPO_OFFLOAD_TRAINING_MODE_H_
#define LSPO_OFFLOAD_TRAINING_MODE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "offload/arena_layout.h"
#include "proto/arena.pb.h"
#include "proto/job_spec.pb.h"

namespace lspo::offload {

// What a mode moves between the worker and the optimizer service each step.
enum class OffloadKind {
  kNone,      // the optimizer runs on the worker beside the model (native, lora, galore)
  kSubspace,  // compressed gradients down, subspace steps up (lsp, galore-offload)
  kFull,      // full bf16 gradients down, full bf16 weights up (zero)
};

// The memory planner's inputs and the per-mode terms a plan hook fills (memory_plan.h).
struct ModePlanContext;

// One training mode (see the file comment). Every function pointer is set unless its comment
// says it may be null.
struct ModeDescriptor {
  lspo::v1::TrainingMode mode;
  // How specs, lspctl, plans and run headers name it: "lsp", "galore-offload".
  absl::string_view name;
  // One line for help texts and run headers: "no offload" or what crosses the arena.
  absl::string_view summary;
  // The JobSpec block (a message field's name) that holds this mode's settings: "lsp",
  // "lora", "galore", or "" when it has none. A spec that sets another mode's block is
  // refused (CheckModeSettings), except lsp's, whose defaults every spec carries.
  absl::string_view settings_block;
  OffloadKind offload;
  // Calibrates and refits learned projectors (the job runner's fit at step 0 and the
  // check / refit cadence of lsp.check_freq; the summary's d, r, narrow, rounding).
  bool learned_projectors;
  // May run with distributed.world_size > 1 (docs/distributed.md).
  bool data_parallel;
  // Writes its block's defaults into a spec of this mode (ResolveDefaults); may be null.
  void (*resolve_defaults)(lspo::v1::JobSpec* spec);
  // Checks its block's settings of a resolved spec. Errors: kInvalidArgument naming the
  // field and the fix. May be null.
  absl::Status (*check)(const lspo::v1::JobSpec& spec);
  // With 16-bit worker weights: whether the worker keeps a bf16 compensation residual per
  // trained weight (lsp.apply_rounding compensated; GaLore-Offload always). May be null (never).
  bool (*keeps_residual)(const lspo::v1::JobSpec& spec);
  // The mode's own memory terms (memory_plan.h PlanJobMemory; mode_plans.cc).
  // Errors: kInvalidArgument naming the job spec field that does not fit the model.
  absl::Status (*plan)(ModePlanContext* context);
  // The arena layout of a job of this mode over `linears` (offload/arena_layout.h), the one
  // builder both the worker's update path and the planner call; null when offload is kNone.
  // `name` is the shm name. Errors: kInvalidArgument naming the job spec field that does not
  // fit (as ResolveJobSubspaces / BuildGaloreArenaLayout).
  absl::StatusOr<lspo::v1::ArenaLayout> (*layout)(const std::vector<LinearShape>& linears,
                                                  int32_t linears_per_layer,
                                                  const lspo::v1::JobSpec& spec,
                                                  const std::string& name);
  // The run header's words for the mode's settings, e.g. "d=128 r=4" or
  // "lora r=8 alpha=8 on q_proj,v_proj"; "" when it has none. May be null.
  std::string (*describe)(const lspo::v1::JobSpec& spec);

  bool offloaded() const { return offload != OffloadKind::kNone; }
};

// Every mode, in the order plans and help texts list them: lsp, zero, native, lora, galore,
// galore-offload.
// lsp.apply_rounding as the worker runs it with 16-bit weights: the spec's, and unset =
// stochastic (proto ApplyRounding; compensated until 2026-12-07).
lspo::v1::ApplyRounding LspApplyRounding(const lspo::v1::JobSpec& spec);

// lsp.refresh_every of a job whose rounding keeps no residual on 16-bit weights: each weight
// re-rounded from the master once every 100 steps (docs/fidelity.md: the drift this bounds
// and what it costs).
inline constexpr int32_t kDefaultRefreshEvery = 100;

// Whether a worker stores its trained weights in 16 bits: weight_dtype bf16, or unset on a
// CUDA worker (`cuda`); the CPU's default is fp32.
bool SixteenBitWorkerWeights(const lspo::v1::JobSpec& spec, bool cuda);

// lsp.refresh_every as the worker resolves it at LoadJob (steps; 0 = no rolling refresh): the
// spec's when set; unset, kDefaultRefreshEvery when `sixteen_bit_weights` (the worker's storage
// dtype is bf16 or fp16), LspApplyRounding keeps no residual and lsp.master_refresh is not never,
// else 0.
int32_t LspRefreshEvery(const lspo::v1::JobSpec& spec, bool sixteen_bit_weights);

absl::Span<const ModeDescriptor> AllModes();

// The descriptor of `mode`; MODE_UNSPECIFIED is lsp (the proto's default). A value this
// build does not know is lsp too: ValidateJobSpec refuses it first (ModeKnown).
const ModeDescriptor& DescriptorOf(lspo::v1::TrainingMode mode);

// The descriptor of a spec: its mode, where a spec written before MODE_GALORE_OFFLOAD existed
// (mode galore with galore.offload: true) is GaLore-Offload.
const ModeDescriptor& ModeOf(const lspo::v1::JobSpec& spec);

// Whether this build has a descriptor for `mode` (MODE_UNSPECIFIED included).
bool ModeKnown(lspo::v1::TrainingMode mode);

// The mode a user named: "lsp", "galore-offload", "galore_offload", "MODE_ZERO", "Lora"
// (case, a MODE_ prefix and - vs _ do not matter). Errors: kInvalidArgument listing the modes.
absl::StatusOr<const ModeDescriptor*> ModeByName(absl::string_view name);

// "lsp, zero, native, lora, galore or galore-offload": the names for error messages.
std::string ModeNames();

// Writes the spec's mode in its current form: MODE_UNSPECIFIED -> MODE_LSP; mode galore with
// galore.offload -> MODE_GALORE_OFFLOAD, and galore.offload cleared (the mode says it). Used by
// ResolveDefaults and by the training fingerprint, so that a checkpoint written before the
// enum value existed resumes.
void NormalizeMode(lspo::v1::JobSpec* spec);

// The settings-block rule of a resolved spec: a block of another mode that sets anything is
// refused ("the lora settings apply to mode lora only, and mode is zero; ..."), then the
// mode's own check runs. Errors: kInvalidArgument naming the field and the fix.
absl::Status CheckModeSettings(const lspo::v1::JobSpec& spec);

// Drops the blocks of modes other than `mode` from `spec` (lspctl --mode=...), returning the
// names of the blocks dropped. Does not touch lsp (every spec carries its defaults).
std::vector<std::string> DropOtherModesSettings(const ModeDescriptor& mode,
                                                lspo::v1::JobSpec* spec);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_TRAINING_MODE_H_
