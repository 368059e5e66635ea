// Per-matrix subspace plan. See subspace.h for the rules.
#include "lsp/subspace.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lspo::lsp {
namespace {

SideSubspace Identity(int64_t rows) { return SideSubspace{rows, rows, 1, true}; }

SideSubspace Learned(int64_t rows, int64_t dim, int64_t r) {
  return SideSubspace{rows, dim, std::min(r, dim), false};
}

}  // namespace

std::string MatrixSubspace::Describe() const {
  std::string s = absl::StrCat(p.dim, " x ", q.dim);
  if (full()) return absl::StrCat(s, " (identity on both sides: full update)");
  if (p.identity) return absl::StrCat(s, " (P identity)");
  if (q.identity) return absl::StrCat(s, " (Q identity)");
  return s;
}

absl::StatusOr<MatrixSubspace> ResolveSubspace(int64_t m, int64_t n, int64_t d, double d_ratio,
                                               int64_t r, NarrowRule rule) {
  if (m < 1 || n < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "subspace of a (%d x %d) matrix: both sides must be >= 1 (W must be a non-empty 2-D "
        "matrix)",
        m, n));
  }
  if (r < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("lsp.r = ", r, ": non-zeros per projector row must be >= 1"));
  }
  if (d < 0) {
    return absl::InvalidArgumentError(absl::StrCat("lsp.d = ", d, ": must be >= 1"));
  }
  const bool have_ratio = d_ratio != 0;
  if (have_ratio && !(std::isfinite(d_ratio) && d_ratio > 0 && d_ratio < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lsp.d_ratio = ", d_ratio, ": must lie in (0, 1) (the paper uses about 0.5)"));
  }
  if ((d > 0) == have_ratio) {
    return absl::InvalidArgumentError(
        absl::StrCat("lsp.d = ", d, " and lsp.d_ratio = ", d_ratio,
                     ": set exactly one of them (an absolute subspace size, or a fraction of each "
                     "matrix's smaller side)"));
  }
  const int64_t min_mn = std::min(m, n);
  if (have_ratio) {
    if (min_mn == 1) return MatrixSubspace{Identity(m), Identity(n)};
    const int64_t di =
        std::clamp<int64_t>(std::llround(d_ratio * static_cast<double>(min_mn)), 1, min_mn - 1);
    return MatrixSubspace{Learned(m, di, r), Learned(n, di, r)};
  }
  if (d < min_mn) return MatrixSubspace{Learned(m, d, r), Learned(n, d, r)};
  switch (rule) {
    case NarrowRule::kOneSided:
      return MatrixSubspace{m <= d ? Identity(m) : Learned(m, d, r),
                            n <= d ? Identity(n) : Learned(n, d, r)};
    case NarrowRule::kHalf: {
      if (min_mn == 1) return MatrixSubspace{Identity(m), Identity(n)};
      const int64_t di = min_mn / 2;
      return MatrixSubspace{Learned(m, di, r), Learned(n, di, r)};
    }
    case NarrowRule::kFull:
      return MatrixSubspace{Identity(m), Identity(n)};
  }
  return absl::InvalidArgumentError("lsp.narrow: unknown rule");
}

}  // namespace lspo::lsp
