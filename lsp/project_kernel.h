// The token-tiled sparse projection on the CPU: (X P)^T for one layer input X and one or more
// (d, r)-sparse projectors P, the compression's first stage (docs/method.md "Math": the
// forward's X Q, the backward's dY P). Torch-free (TBB only); lsp::ProjectRowsTransposed and
// lsp::CompressFactored (lsp/projector.h) call it for CPU tensors.
//
// Legend (lsp/projector.h): N tokens; `rows` features of X (n for X Q, m for dY P); d columns
// of a projector; r non-zeros per projector row.
//
// Output layout: token-minor, out (d, N) fp32 row-major, i.e. (X P)^T. That is the operand
// layout of S = (dY P)^T (X Q) = out_P (out_Q)^T, one BLAS GEMM with no transpose copy.
//
// Method: tiles of 16 tokens (one AVX-512 vector of fp32). Per tile, X's 16 rows are
// transposed once into a (rows, 16) buffer (AVX-512 16 x 16 register transposes, converting
// bf16 / fp16 to fp32 on load), then every projector scatters: for each feature i ascending and
// each non-zero k of P's row i, acc[P.index[i, k], :] += P.value[i, k] * xt[i, :] (16 lanes),
// and the (d, 16) accumulator is stored into out's 16 columns. Several projectors of one input
// (q|k|v, gate|up) share one read and one transpose of X.
//
// Numerics: per output element (c, t) the sum over features i ascending of value * x, each
// product rounded to fp32 and then added (no fused multiply-add: compiled with
// -ffp-contract=off, so every CPU clone, AVX-512, AVX2 or baseline, gives the same bits). The
// result does not depend on the thread count or the split (each task owns whole tiles).
//
// Cost: reads X once (N rows 4 or 2 bytes per element), writes out once (4 d N bytes per
// projector); N rows r multiply-adds per projector, 16 per vector instruction.
#ifndef LSPO_LSP_PROJECT_KERNEL_H_
#define LSPO_LSP_PROJECT_KERNEL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "lsp/apply_kernel.h"

namespace lspo::lsp {

// One projector of a ProjectTokensCpu call and where its result goes. Host memory, row-major.
struct ProjectTarget {
  const int64_t* index = nullptr;  // (rows, r): the r distinct columns of each row, in [0, d).
  const float* value = nullptr;    // (rows, r): the non-zeros.
  int64_t d = 0;                   // Columns of P (>= 1).
  int64_t r = 0;                   // Non-zeros per row (1 <= r <= d).
  float* out = nullptr;            // (d, n_tok) fp32: (X P)^T, overwritten.
};

// The input and the projectors of one call.
struct ProjectArgs {
  const void* x = nullptr;                    // X (n_tok, rows) in `dtype`, row-major.
  WeightDtype dtype = WeightDtype::kFloat32;  // fp32, bf16 bits or IEEE fp16 bits.
  int64_t n_tok = 0;                          // N (>= 1).
  int64_t rows = 0;                           // Features of X = rows of every P (>= 1).
  const ProjectTarget* targets = nullptr;     // The projectors.
  int64_t n_targets = 0;                      // How many (>= 1).
};

// out_k = (X P_k)^T for every target k, as above. Errors (nothing written): kInvalidArgument
// for null pointers, non-positive sizes, or r outside [1, d]. P's indices are trusted (checked
// when the projector was built, SparseProjector::Validate); each must be in [0, d).
absl::Status ProjectTokensCpu(const ProjectArgs& args);

}  // namespace lspo::lsp

#endif  // LSPO_LSP_PROJECT_KERNEL_H_
