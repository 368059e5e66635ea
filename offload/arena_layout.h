// The slot layout of a job's shared-memory arena: where every trained matrix's regions lie.
// This is the data-plane contract between the worker (which creates the arena) and the
// optimizer (which attaches to it); both depend on this library, which depends on neither.
// Torch-free (protobuf messages only).
//
// Layout per trained matrix i (m x n) with subspace (d_p, d_q) (lsp/subspace.h; d_p = d_q = d
// unless a side is narrow), each region 64-byte aligned:
//   grad    S  (d_p, d_q) f32   worker -> optimizer (compressed gradient P^T G Q)
//   step    D  (d_p, d_q) f32   optimizer -> worker (W += P D Q^T)
//   p_index    (m, r_p) i32,  p_value (m, r_p) f32   projector P (the identity: r_p = 1)
//   q_index    (n, r_q) i32,  q_value (n, r_q) f32   projector Q
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
#include "lsp/subspace.h"
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

// The subspace of every matrix of `linears` under the job's lsp settings (d or d_ratio, r,
// narrow; lsp/subspace.h ResolveSubspace), in order: what the worker lays out, the optimizer
// attaches to and the memory planner (offload/memory_plan.h) counts.
// Errors: kInvalidArgument "job spec field lsp does not fit NAME (m x n): ..." with
// ResolveSubspace's reason and fix.
absl::StatusOr<std::vector<lsp::MatrixSubspace>> ResolveJobSubspaces(
    const std::vector<LinearShape>& linears, const lspo::v1::LspSpec& lsp);

// Computes offsets for every matrix (see the file comment). `subspaces[i]` is matrix i's
// subspace (lsp/subspace.h ResolveSubspace): its grad/step slots are (d_p, d_q) and its
// projector slots (m, r_p) / (n, r_q). `d` and `r` are the job's settings, recorded in the
// layout (d = 0 with lsp.d_ratio). `name` is the shm name.
// Errors: kInvalidArgument if subspaces and linears differ in count, a subspace does not match
// its matrix (rows, 1 <= r <= dim, identity sides (rows, 1)), or the matrices do not split
// into layers of `linears_per_layer`.
absl::StatusOr<lspo::v1::ArenaLayout> BuildArenaLayout(
    const std::vector<LinearShape>& linears, int32_t linears_per_layer,
    const std::vector<lsp::MatrixSubspace>& subspaces, int32_t d, int32_t r,
    const std::string& name);

// The subspace an MODE_LSP slot was laid out for: P (m, d_p) with r_p = p_index.shape[1], Q
// likewise; a side whose d equals its rows is the identity (a learned side is always narrower
// than its rows, lsp/subspace.h). For a slot of another mode the sides are all zero.
lsp::MatrixSubspace SlotSubspace(const lspo::v1::LinearSlot& slot);

// The MODE_GALORE_OFFLOAD layout of GaLore-Offload (docs/baselines.md "GaLore"): the MODE_LSP
// layout with the subspace of GaLore's one-sided projection of rank `rank`: for m >= n the identity
// on P and a dense (n, rank) Q = B^T (r_q = rank: every column of every row), so S = G B^T
// (m, rank); for m < n a dense (m, rank) P = A and the identity on Q, so S = A^T G (rank, n).
// Each slot also has grad_sq (1) f32, |G|_F^2 of the full gradient (clipping). `d` and `r` of
// the layout are the rank; its mode is MODE_GALORE_OFFLOAD.
// Errors: kInvalidArgument when rank < 1 or rank >= min(m, n) of a matrix (naming the
// narrowest such matrix: a rank at a matrix's smaller side projects nothing away, and the
// slot could not tell it from the identity), and as BuildArenaLayout.
absl::StatusOr<lspo::v1::ArenaLayout> BuildGaloreArenaLayout(
    const std::vector<LinearShape>& linears, int32_t linears_per_layer, int32_t rank,
    const std::string& name);

// The MODE_ZERO layout (see the file comment): 4 m n bytes per matrix plus the flags.
// Errors: kInvalidArgument as BuildArenaLayout for `linears_per_layer`.
absl::StatusOr<lspo::v1::ArenaLayout> BuildZeroArenaLayout(const std::vector<LinearShape>& linears,
                                                           int32_t linears_per_layer,
                                                           const std::string& name);

// Number of decoder layers of `layout`: linears / linears_per_layer.
// Errors: kInvalidArgument when linears_per_layer < 1 or does not divide the matrix count
// (a layout from a peer of another version, or a corrupted message).
absl::StatusOr<int32_t> NumLayers(const lspo::v1::ArenaLayout& layout);

// Number of elements of a slot (product of its shape; 1 for a scalar).
int64_t Numel(const lspo::v1::TensorRef& ref);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_ARENA_LAYOUT_H_
