// The subspace of each trained matrix: how many columns its projectors P (m, d_p) and Q (n, d_q)
// have, how sparse they are, and which sides are not compressed at all. Torch-free (the worker,
// the optimizer and the arena layout all resolve the same plan from the job spec's numbers).
//
// Legend: m out features and n in features of W (m, n) (HF layout), d the job's subspace size,
// r non-zeros per projector row. S = P^T G Q and the step D are (d_p, d_q).
//
// The paper sets d to about half the hidden size (d = 512 for RoBERTa-base's 768, 1280 for a
// 2048-wide 1.3B model; docs/method.md "Hyperparameters"). Under grouped-query attention the
// k/v projections are narrower than that (SmolLM2-135M: 192 x 576 with hidden 576), so a side
// of a matrix may be no wider than d, where a (d, r)-sparse projector would not compress it.
// What such a matrix gets is the job's NarrowRule (see below); with `d_ratio` instead of an
// absolute d every matrix gets its own d_i = round(d_ratio * min(m, n)) and no side is narrow.
//
// Thread-safety: free functions and value types.
#ifndef LSPO_LSP_SUBSPACE_H_
#define LSPO_LSP_SUBSPACE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace lspo::lsp {

// What a matrix gets when a side of it is not wider than d (side <= d). Mirrors the job
// spec's lspo.v1.NarrowRule (proto/job_spec.proto), which documents the measured choice.
enum class NarrowRule {
  // A narrow side gets the identity (exact, never fitted, d_side = side); a wide side keeps its
  // learned (d, r)-sparse projector. Both sides narrow: identity on both (a full update).
  kOneSided,
  // Both sides get a learned projector of the matrix's own d_i = max(1, floor(min(m, n) / 2))
  // (the paper's ratio of about half the smaller side), r_i = min(r, d_i).
  kHalf,
  // Identity on both sides: S = G and Adam runs over the whole matrix (as zero mode does, in
  // fp32), through the same arena slots.
  kFull,
};

// One side of a matrix's subspace: the projector (rows, dim) with r non-zeros per row, or the
// identity (rows == dim, r == 1, values 1: exact and never fitted).
struct SideSubspace {
  int64_t rows = 0;  // m for P, n for Q
  int64_t dim = 0;   // columns of the projector: d_p or d_q
  int64_t r = 0;     // non-zeros per row (1 for the identity)
  bool identity = false;
};

// The subspace of one matrix W (m, n): S, D are (p.dim, q.dim).
struct MatrixSubspace {
  SideSubspace p;  // P (m, d_p)
  SideSubspace q;  // Q (n, d_q)
  // Elements of S (and of D and of each Adam moment): d_p * d_q.
  int64_t numel() const { return p.dim * q.dim; }
  // True when both sides are the identity (S = G, a full update).
  bool full() const { return p.identity && q.identity; }
  // "d_p x d_q" plus the identity sides, for logs and errors, e.g. "192 x 288 (P identity)".
  std::string Describe() const;
};

// The subspace of W (m, n) for the job's settings.
//   d > 0 and d_ratio == 0: absolute d; a side with rows <= d is narrow and `rule` decides.
//     A side wider than d gets a learned (d, min(r, d))-sparse projector.
//   d == 0 and d_ratio in (0, 1): d_i = round(d_ratio * min(m, n)) clamped to
//     [1, min(m, n) - 1] on both sides, r_i = min(r, d_i); `rule` is not used (no side is
//     narrow), except for a matrix with min(m, n) == 1, which gets the identity on both sides.
// Errors: kInvalidArgument if m, n or r < 1, if both or neither of d and d_ratio are set, if
// d < 0, if d_ratio is outside (0, 1) or not finite; the message names lsp.d / lsp.d_ratio /
// lsp.r and the fix.
absl::StatusOr<MatrixSubspace> ResolveSubspace(int64_t m, int64_t n, int64_t d, double d_ratio,
                                               int64_t r, NarrowRule rule);

}  // namespace lspo::lsp

#endif  // LSPO_LSP_SUBSPACE_H_
