// The slot layout of a job's shared-memory arena: where every trained matrix's regions lie.
// This is the data-plane contract between the worker (which creates the arena) and the
// optimizer (which attaches to it); both depend on this library, which depends on neither.
// Torch-free (protobuf messages only).
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
//
// Matrices are listed in linear order, `linears_per_layer` per decoder layer
// (ArenaLayout.linears_per_layer; model::kLinearsPerLayer = 7 for the Llama family).
#ifndef LSPO_OFFLOAD_ARENA_LAYOUT_H_
#define LSPO_OFFLOAD_ARENA_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/arena.pb.h"
#include "proto/job_spec.pb.h"

namespace lspo::offload {

// One trained matrix: linear index, HF name, out features m, in features n.
struct LinearShape {
  int32_t index;
  std::string name;
  int64_t m;
  int64_t n;
};

// Computes offsets for every matrix (see the file comment). `name` is the shm name.
// Errors: kInvalidArgument if d < 1, r < 1 or r > d, or if the matrices do not split into
// layers of `linears_per_layer`.
absl::StatusOr<lspo::v1::ArenaLayout> BuildArenaLayout(const std::vector<LinearShape>& linears,
                                                       int32_t linears_per_layer, int32_t d,
                                                       int32_t r, const std::string& name);

// The MODE_ZERO layout (see the file comment): 4 m n bytes per matrix plus the flags.
// Errors: kInvalidArgument as BuildArenaLayout for `linears_per_layer`.
absl::StatusOr<lspo::v1::ArenaLayout> BuildZeroArenaLayout(
    const std::vector<LinearShape>& linears, int32_t linears_per_layer, const std::string& name);

// Number of decoder layers of `layout`: linears / linears_per_layer.
// Errors: kInvalidArgument when linears_per_layer < 1 or does not divide the matrix count
// (a layout from a peer of another version, or a corrupted message).
absl::StatusOr<int32_t> NumLayers(const lspo::v1::ArenaLayout& layout);

// Number of elements of a slot (product of its shape; 1 for a scalar).
int64_t Numel(const lspo::v1::TensorRef& ref);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_ARENA_LAYOUT_H_
