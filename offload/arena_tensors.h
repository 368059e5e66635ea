// Zero-copy LibTorch views of the slots of a job's shared-memory arena (offload/arena_layout.h)
// and the projector slots (int32 positions + fp32 values). Used by the worker and the optimizer.
// Thread-safety: the functions are stateless; the views alias shared memory, so concurrent
// writers of one slot must be ordered by the completion flags (runtime/completion_flags.h).
//
// Shapes: m out features, n in features, d subspace dim (d_p for P, d_q for Q), r non-zeros
// per projector row (r_p, r_q); rows = m for P, n for Q. Slot shapes: offload/arena_layout.h.
#ifndef LSPO_OFFLOAD_ARENA_TENSORS_H_
#define LSPO_OFFLOAD_ARENA_TENSORS_H_

#include <cstdint>

#include "third_party/torch/torch_api.h"

#include "absl/status/statusor.h"
#include "lsp/projector.h"
#include "offload/arena_layout.h"
#include "proto/arena.pb.h"
#include "runtime/completion_flags.h"
#include "runtime/shm_arena.h"

namespace lspo::offload {

// A CPU bf16 tensor viewing the slot `ref`, of its shape (MODE_ZERO's full_grad and param:
// (m, n) bf16). Errors as ArenaF32 (dtype must be BF16).
absl::StatusOr<at::Tensor> ArenaBf16(const runtime::ShmArena& arena,
                                     const lspo::v1::TensorRef& ref);

// The completion flags of `layout` inside `arena`. kInvalidArgument if the flags region does
// not hold 1 + 2 L words; kOutOfRange if it lies outside the arena.
absl::StatusOr<runtime::CompletionFlags> ArenaFlags(const runtime::ShmArena& arena,
                                                    const lspo::v1::ArenaLayout& layout);

// A CPU fp32 tensor viewing the slot `ref` (no copy; valid while the arena lives), of its shape:
// S and D (d_p, d_q), a projector's values (rows, r), grad_sq (1), the staging region.
// Errors: kInvalidArgument (dtype is not F32), kOutOfRange (outside the arena).
absl::StatusOr<at::Tensor> ArenaF32(const runtime::ShmArena& arena, const lspo::v1::TensorRef& ref);

// Copies P (index as i32, value f32) into the slots. kInvalidArgument on a shape mismatch.
// p: index (rows, r) int64, value (rows, r) fp32, any device -> slots (rows, r) int32 / fp32.
absl::Status WriteProjector(const runtime::ShmArena& arena, const lspo::v1::TensorRef& index,
                            const lspo::v1::TensorRef& value, const lsp::SparseProjector& p);

// Reads a projector with `d` columns back (index widened to int64), with its `identity` /
// `dense` structure flags set as SparseProjector::FromTensors sets them. kDataLoss if a
// position is outside [0, d). Returns index (rows, r) int64 and value (rows, r) fp32, CPU
// copies (not views of the arena); `d` is d_p for P, d_q for Q.
absl::StatusOr<lsp::SparseProjector> ReadProjector(const runtime::ShmArena& arena,
                                                   const lspo::v1::TensorRef& index,
                                                   const lspo::v1::TensorRef& value, int64_t d);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_ARENA_TENSORS_H_
