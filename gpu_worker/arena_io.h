// Typed access to the job's shared-memory arena: the slot layout of every trained matrix and
// zero-copy tensor views of slots. Used by the worker (creator) and the optimizer (attacher).
//
// Layout per trained matrix i (m x n), each region 64-byte aligned:
//   grad    S  (d, d) f32   worker -> optimizer (compressed gradient P^T G Q)
//   step    D  (d, d) f32   optimizer -> worker (W += P D Q^T)
//   p_index    (m, r) i32,  p_value (m, r) f32   projector P
//   q_index    (n, r) i32,  q_value (n, r) f32   projector Q
// then the completion flags (runtime/completion_flags.h) and a one-layer fp32 staging region
// (master-weight refresh). MODE_ZERO (BuildZeroArenaLayout) instead has per matrix:
//   full_grad  (m, n) bf16  worker -> optimizer (full weight gradient)
//   param      (m, n) bf16  optimizer -> worker (updated parameters)
// followed by the flags.
#ifndef LSPO_GPU_WORKER_ARENA_IO_H_
#define LSPO_GPU_WORKER_ARENA_IO_H_

#include <map>
#include <utility>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "lsp/projector.h"
#include "model/safetensors.h"
#include "proto/lsp_offload.pb.h"
#include "runtime/completion_flags.h"
#include "runtime/shm_arena.h"

namespace lspo::worker {

// One trained matrix: linear index, HF name, out features m, in features n.
struct LinearShape {
  int32_t index;
  std::string name;
  int64_t m;
  int64_t n;
};

// Computes offsets for every matrix (see the file comment). `name` is the shm name.
// Errors: kInvalidArgument if d < 1, r < 1 or r > d.
absl::StatusOr<lspo::v1::ArenaLayout> BuildArenaLayout(const std::vector<LinearShape>& linears,
                                                       int32_t d, int32_t r,
                                                       const std::string& name);

// The MODE_ZERO layout (see the file comment): 4 m n bytes per matrix plus the flags.
absl::StatusOr<lspo::v1::ArenaLayout> BuildZeroArenaLayout(
    const std::vector<LinearShape>& linears, const std::string& name);

// A CPU bf16 tensor viewing the slot `ref`. Errors as ArenaF32 (dtype must be BF16).
absl::StatusOr<at::Tensor> ArenaBf16(const runtime::ShmArena& arena, const lspo::v1::TensorRef& ref);

// The completion flags of `layout` inside `arena`. kInvalidArgument if the flags region does
// not hold 1 + 2 L words; kOutOfRange if it lies outside the arena.
absl::StatusOr<runtime::CompletionFlags> ArenaFlags(const runtime::ShmArena& arena,
                                                    const lspo::v1::ArenaLayout& layout);

// A CPU fp32 tensor viewing the slot `ref` (no copy; valid while the arena lives).
// Errors: kInvalidArgument (dtype is not F32), kOutOfRange (outside the arena).
absl::StatusOr<at::Tensor> ArenaF32(const runtime::ShmArena& arena, const lspo::v1::TensorRef& ref);

// Copies P (index as i32, value f32) into the slots. kInvalidArgument on a shape mismatch.
absl::Status WriteProjector(const runtime::ShmArena& arena, const lspo::v1::TensorRef& index,
                            const lspo::v1::TensorRef& value, const lsp::SparseProjector& p);

// Reads a projector with `d` columns back (index widened to int64). kDataLoss if a position
// is outside [0, d).
absl::StatusOr<lsp::SparseProjector> ReadProjector(const runtime::ShmArena& arena,
                                                   const lspo::v1::TensorRef& index,
                                                   const lspo::v1::TensorRef& value, int64_t d);

// ---- Training-state files (checkpoints, exact resume) ----------------------------------------

// Named CPU tensors of a state file, in write order.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` (CPU; fp32, bf16, int32 or int64; made contiguous) to the safetensors file
// `path` with `metadata` through model::WriteSafetensors (temp file, fsync, rename).
// Errors: kInvalidArgument (other dtype, or a CUDA tensor), I/O errors of WriteSafetensors
// (kPermissionDenied / kInternal naming the path).
absl::Status WriteTensorFile(const std::string& path, const NamedTensors& tensors,
                             const std::map<std::string, std::string>& metadata);

// A read-only CPU tensor viewing tensor `name` of the (memory-mapped) state file `file`
// (described as `what` in messages; valid while `file` lives; never write to it), checking its
// dtype and shape, so a resume validates every tensor before copying any and never holds two
// copies of the state (known-failures.md #15). Floating tensors must be finite (a poisoned
// checkpoint must not resume; known-failures.md #5). Errors: kNotFound (absent), kDataLoss
// (other dtype or shape, non-finite values), each naming the file and the tensor.
absl::StatusOr<at::Tensor> ViewStateTensor(const model::SafetensorsFile& file,
                                           const std::string& what, const std::string& name,
                                           at::ScalarType dtype, at::IntArrayRef shape);
// As ViewStateTensor, but an owning copy.
absl::StatusOr<at::Tensor> ReadStateTensor(const model::SafetensorsFile& file,
                                           const std::string& what, const std::string& name,
                                           at::ScalarType dtype, at::IntArrayRef shape);

// A projector as two state tensors `<prefix>_index` (rows, r) int32 and `<prefix>_value`
// (rows, r) fp32 (known-failures.md #11: plain tensors).
void AppendProjector(const std::string& prefix, const lsp::SparseProjector& p,
                     NamedTensors* out);
// Reads back what AppendProjector wrote, validated (SparseProjector::FromTensors) against
// `rows` and `d`. Errors: as ReadStateTensor, kDataLoss for an invalid projector.
absl::StatusOr<lsp::SparseProjector> ReadStateProjector(const model::SafetensorsFile& file,
                                                        const std::string& what,
                                                        const std::string& prefix,
                                                        int64_t rows, int64_t d, int64_t r);

}  // namespace lspo::worker

#endif  // LSPO_GPU_WORKER_ARENA_IO_H_
