// Will it fit? The memory a job needs, per training mode, computed from the model's shape and
// the job spec without loading any weight (issue 18): the worker's device memory term by term,
// the optimizer service's host memory, the shared-memory arena and the bytes moved per step.
//
// Every term is a count of what this code base allocates (the file and the tensor are named in
// memory_plan.cc), not a rule of thumb. Legend: L decoder layers, H hidden size, F intermediate
// size, V vocabulary, nh / nkv query / key-value heads of width hd; B micro-batch rows, T
// seq_len, N = B T tokens; W (m, n) a trained matrix (the 7 linears of every layer, HF
// layout), P_lin = Σ_W m n, P_rest = the other parameters (embedding, untied lm_head, norms,
// biases); w = 2 or 4 bytes, the worker's storage dtype of the trained matrices (bf16 / fp32);
// (d_p, d_q) the lsp subspace of W (lsp/subspace.h). Compute is fp32 everywhere (4-byte
// activations).
//
// Activations kept for the backward of one micro-batch (autograd's saved tensors, counted from
// model/llama.cc DecoderLayer and lsp/lsp_linear.cc), per decoder layer, in floats:
//   N (H + nh hd + 2 nkv hd + H + 3 F + 2) + B nh T^2          every mode: the layer input, the
//       rotated q (a contiguous copy) and k, v, the mid-layer residual, gate / silu(gate) / up,
//       two RMS statistics, the softmax probabilities
//   + N (H + nh hd + H + F)      a linear that saves its input X (native, zero, galore, lora):
//       the two norm outputs, the o_proj input, the down_proj input
//   + N Σ_{7 W} d_q              lsp instead saves X Q (N, d_q) per linear
//   + N r per adapted linear      lora: X A^T
// (no fp32 upcast copy of 16-bit weights: the linears keep W as stored, model::UpcastLinear;
// up to 2026-12-06 each kept one, 4 m n bytes). With activation checkpointing a layer keeps only
// its input (N H floats) and one layer at a time is recomputed in the backward. The loss keeps
// dL/dh of R rows (R H floats, model/linear_cross_entropy.h; up to 2026-12-07 it kept the R V
// log-probabilities; R = N on CUDA, which runs lm_head over every row; on the CPU only the rows
// in the loss, at most N: the plan takes N, exact for text and packed data, an upper bound for
// classification); the loss's blocks of logits (two of LossBlockRows(V) x V floats) and the
// backward of one layer's attention need transient buffers (the workspace term).
//
// Peak of a step = static + max(start of the backward: activations + workspace [+ gradients
// with grad_accum > 1], end of the backward: gradients + the largest matrix's fp32 gradient in
// flight), plus the allocator margin (kCudaAllocatorMargin of it on CUDA; on the CPU glibc's
// heap retention, kCpuHeapRetention). Checked against measurement: tests/offload/
// memory_plan_test.cc (the H200 run's allocator peaks, six jobs: within 3% without the margin)
// and tests/integration/memory_plan_job_test.cc (CPU, SmolLM2-135M, lsp, zero, native).
//
// Thread-safety: free functions and value types.
#ifndef LSPO_OFFLOAD_MEMORY_PLAN_H_
#define LSPO_OFFLOAD_MEMORY_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama_config.h"
#include "proto/job_spec.pb.h"

namespace lspo::offload {

// One term of a plan, bytes.
struct PlanTerm {
  std::string name;  // e.g. "trained weights (bf16)"
  int64_t bytes = 0;
};

// The memory of one job in one mode (see the file comment). All sizes are bytes.
struct MemoryPlan {
  lspo::v1::TrainingMode mode{};   // the plan's mode; its name: training_mode.h DescriptorOf
  bool cuda = false;               // the worker's terms are for a CUDA device (else the CPU)
  int64_t weight_bytes = 4;        // w: storage bytes of a trained matrix element (2 or 4)
  int64_t tokens = 0;              // N = micro_batch_size * seq_len
  bool checkpointing = false;      // the job's activation_checkpointing
  int64_t trained_parameters = 0;  // Σ m n over the trained matrices
  int64_t trained_matrices = 0;    // 7 per decoder layer

  // Worker, on its device.
  std::vector<PlanTerm> device_static;  // weights, gradients, optimizer state, method buffers
  int64_t activations = 0;              // kept for the backward, under `checkpointing`
  int64_t activations_no_checkpointing = 0;
  int64_t activations_checkpointing = 0;
  int64_t workspace = 0;            // transient: the loss's and one layer's backward buffers
  int64_t gradients_in_flight = 0;  // end of the backward: gradients that exist then
  // Allocator margin: on CUDA margin_fraction (kCudaAllocatorMargin) of the peak; on the CPU
  // margin_fraction (kCpuHeapRetention) of activations + workspace.
  double margin_fraction = 0;
  int64_t margin = 0;
  int64_t device_peak = 0;  // static + max(phases) + margin

  // Host.
  std::vector<PlanTerm> optimizer_host;  // the optimizer service: fp32 model, moments
  int64_t arena = 0;                     // shared memory (offload/arena_layout.h), exact
  int64_t worker_host_load = 0;          // a CUDA worker's host peak while it loads: the fp32 model
  // A CUDA worker's host memory while it trains: the data-parallel all-reduce buffers (the
  // collectives run over Gloo on host copies; on the CPU they are in device_static).
  int64_t worker_host_train = 0;
  int64_t d2h_bytes_per_step = 0;  // worker -> optimizer per optimizer step
  int64_t h2d_bytes_per_step = 0;  // optimizer -> worker per optimizer step

  int64_t DeviceStatic() const;   // Σ device_static
  int64_t OptimizerHost() const;  // Σ optimizer_host
  // What one process holds on the CPU when everything runs there (device cpu, embedded mode:
  // worker + optimizer + arena), bytes.
  int64_t CpuTotal() const { return device_peak + OptimizerHost() + arena; }
};

// Allocator margin the plan adds to a CUDA peak, a fraction of it: LibTorch's caching
// allocator rounds blocks up and keeps freed ones (the plan without it is within 3% of the
// allocator's measured peaks on the H200, tests/offload/memory_plan_test.cc).
inline constexpr double kCudaAllocatorMargin = 0.05;
// What a CPU worker's process holds beyond its live tensors, as a fraction of the step's
// transient memory (activations + workspace): glibc's malloc raises its mmap threshold after
// the first large free (up to 32 MiB), so freed activation blocks stay in the heap and
// resident memory exceeds the live tensors. Measured on SmolLM2-135M, micro-batch 4 x 256,
// glibc 2.36, 2 threads, one malloc arena (runtime/process_env.h UseOneMallocArena;
// tests/integration/memory_plan_job_test.cc, docs/bench.md); checked on the ~1.1B shape.
inline constexpr double kCpuHeapRetention = 0.65;
// Device memory outside the allocator: the CUDA context and library handles (measured 0.45 GiB
// on the H200: "4.58 GiB in use, 3.98 GiB allocated by PyTorch + 0.15 GiB reserved").
inline constexpr int64_t kCudaContextBytes = 512LL << 20;

// The plan of `spec` (defaults resolved: spec/job_spec.h ResolveDefaults) in `mode` for a
// model of shape `config` (the mode's own terms: its ModeDescriptor's plan hook,
// offload/mode_plans.cc), with the worker on CUDA when `cuda` (bf16 weights unless
// spec.weight_dtype says fp32) or on the CPU (fp32 unless it says bf16). The spec's settings
// of other modes are used where the mode needs them (lsp.d / r / narrow / apply_rounding,
// lora.r and target_modules, galore.rank; unset, ResolveDefaults' defaults: lora r 8 on every
// linear, galore rank 128); a mode whose settings do not fit the model (e.g.
// galore.rank above a matrix's smaller side) is an error.
// Errors: kInvalidArgument naming the job spec field (micro_batch_size or seq_len < 1, an
// lsp subspace ResolveSubspace refuses, a galore rank BuildGaloreArenaLayout refuses, a lora
// target that is not a linear of the model).
absl::StatusOr<MemoryPlan> PlanJobMemory(const lspo::v1::JobSpec& spec,
                                         const model::LlamaConfig& config,
                                         lspo::v1::TrainingMode mode, bool cuda);

// The largest micro-batch FitOnDevice tries.
inline constexpr int32_t kMaxPlannedMicroBatch = 4096;
// The micro-batch of a job spec that leaves micro_batch_size unset, where nothing is chosen
// (the CPU, data parallel), and the largest a CUDA worker chooses (ChooseFittingDefaults).
inline constexpr int32_t kDefaultMicroBatchSize = 8;
inline constexpr int32_t kMaxChosenMicroBatch = 32;
// spec.micro_batch_size(), or kDefaultMicroBatchSize when unset or 0 (a negative value is
// returned as it is, for the planner to refuse).
inline int32_t MicroBatchOf(const lspo::v1::JobSpec& spec) {
  return spec.micro_batch_size() != 0 ? spec.micro_batch_size() : kDefaultMicroBatchSize;
}

// The answer to "does it fit in `device_bytes`": for each field, 0 when nothing fits.
struct FitAnswer {
  bool fits = false;                              // the job as specified
  int32_t largest_micro_batch = 0;                // at the spec's seq_len and checkpointing
  int32_t largest_micro_batch_checkpointing = 0;  // with activation checkpointing on
  // lsp only: the largest lsp.d at the spec's batch, below the hidden width (from there on
  // the attention matrices get full updates, lsp/subspace.h).
  int32_t largest_d = 0;
  // lsp with bf16 weights and compensated rounding that does not fit: whether it would with
  // lsp.apply_rounding nearest (no 2-byte residual per trained weight).
  bool fits_with_nearest_rounding = false;
};

// Physical memory of this host (MemTotal of /proc/meminfo), bytes; 0 when it cannot be read.
int64_t PhysicalHostMemoryBytes();

// The optimizer service's host memory for a job: PlanJobMemory's optimizer rows plus the
// job's shared-memory arena (`arena_bytes`), against this host's physical memory. OK when it
// fits or cannot be judged (no /proc/meminfo, a spec PlanJobMemory refuses); else
// kResourceExhausted naming the need, its largest rows, the host's memory and the fixes
// (issue 42: refused before a weight is read).
absl::Status CheckOptimizerHostMemory(const lspo::v1::JobSpec& spec,
                                      const model::LlamaConfig& config, lspo::v1::TrainingMode mode,
                                      int64_t arena_bytes);

// Searches the plan (monotone in micro-batch and d) for the largest settings whose device
// peak is at most `device_bytes` (the allocator's budget: a card's memory minus
// kCudaContextBytes, or a device_memory_limit_mb cap). Micro-batches are searched up to
// kMaxPlannedMicroBatch, d up to the model's widest side (hidden or intermediate size).
// Errors: PlanJobMemory's for the spec as given.
absl::StatusOr<FitAnswer> FitOnDevice(const lspo::v1::JobSpec& spec,
                                      const model::LlamaConfig& config, lspo::v1::TrainingMode mode,
                                      bool cuda, int64_t device_bytes);

// Settings a CUDA job left unset, chosen so that its plan fits `device_bytes` (issue 42,
// "defaults that fit the card"), in this order:
//  1. activation_checkpointing, when absent from the spec (has_activation_checkpointing()
//     false): turned on when the plan at the spec's micro-batch (kDefaultMicroBatchSize when
//     unset) does not fit and the plan with checkpointing does;
//  2. micro_batch_size, when absent (or 0) and the job is not data parallel (every rank must
//     train the same batch): the largest power of two up to kMaxChosenMicroBatch whose plan
//     fits with the checkpointing setting of step 1; when none fits and checkpointing was
//     left unset, the largest that fits with it on (turning it on); when none fits at all,
//     kDefaultMicroBatchSize (the caller's fit check then refuses the job, naming what would
//     fit).
// Returns one line per setting chosen, for the run header, saying what and why (the peaks,
// the budget); empty when nothing was chosen (an explicit setting stands, or the CPU: nothing
// changes there). Errors: PlanJobMemory's.
absl::StatusOr<std::vector<std::string>> ChooseFittingDefaults(lspo::v1::JobSpec* spec,
                                                               const model::LlamaConfig& config,
                                                               lspo::v1::TrainingMode mode,
                                                               bool cuda, int64_t device_bytes);

// The plans as a table, one column per plan (each column headed by its mode; the spec's own
// mode marked with '*' when `own` matches), every term in MiB, then the host memory and the
// bytes per step. `title` is the first line.
std::string FormatPlans(const std::string& title, const std::vector<MemoryPlan>& plans,
                        lspo::v1::TrainingMode own);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_MEMORY_PLAN_H_
