// SparseProjector, the value type of a (d, r)-sparse projector: random and identity
// projectors, dense ones (GaLore-Offload), tensors read back, validation, the dense view and
// device moves. The operations on projectors: projector_ops.cc; their kernels:
// projector_kernels.h. Contract and dimension legend: projector.h.
#include "lsp/projector.h"

#include "third_party/torch/torch_api.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lspo::lsp {
namespace {

// Uniform integer in [0, bound) by rejection (unbiased, portable; std distributions are
// implementation-defined).
uint64_t UniformInt(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t limit =
      std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % bound;
  uint64_t x;
  do {
    x = rng();
  } while (x >= limit);
  return x % bound;
}

// Uniform double in (0, 1]: 53 random bits.
double UniformOpen0(std::mt19937_64& rng) {
  return (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// SparseProjector

absl::StatusOr<SparseProjector> SparseProjector::Random(int64_t rows, int64_t d, int64_t r,
                                                        uint64_t seed) {
  if (rows <= 0 || d <= 0 || r <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector::Random: rows=%d d=%d r=%d; expected all > 0", rows, d, r));
  }
  if (r > d) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector::Random: r=%d non-zeros per row exceed the subspace dimension d=%d; "
        "each row needs r distinct columns. Fix: choose r <= d",
        r, d));
  }
  std::mt19937_64 rng(seed);
  at::Tensor index = at::empty({rows, r}, at::kLong);   // (rows, r) int64
  at::Tensor value = at::empty({rows, r}, at::kFloat);  // (rows, r) fp32
  int64_t* idx = index.data_ptr<int64_t>();
  float* val = value.data_ptr<float>();
  std::vector<char> taken(static_cast<size_t>(d), 0);
  std::vector<int64_t> chosen;
  chosen.reserve(static_cast<size_t>(r));
  const double stddev = 1.0 / std::sqrt(static_cast<double>(r));
  double spare = 0;
  bool has_spare = false;
  for (int64_t i = 0; i < rows; ++i) {
    // Floyd's algorithm: a uniformly random r-subset of [0, d) in r draws.
    chosen.clear();
    for (int64_t top = d - r; top < d; ++top) {
      const auto t = static_cast<int64_t>(UniformInt(rng, static_cast<uint64_t>(top) + 1));
      const int64_t pick = taken[static_cast<size_t>(t)] ? top : t;
      taken[static_cast<size_t>(pick)] = 1;
      chosen.push_back(pick);
    }
    std::sort(chosen.begin(), chosen.end());
    for (int64_t j = 0; j < r; ++j) {
      idx[i * r + j] = chosen[static_cast<size_t>(j)];
      taken[static_cast<size_t>(chosen[static_cast<size_t>(j)])] = 0;
      // Box-Muller, both outputs used.
      double z;
      if (has_spare) {
        z = spare;
        has_spare = false;
      } else {
        const double radius = std::sqrt(-2.0 * std::log(UniformOpen0(rng)));
        const double angle = 2.0 * M_PI * UniformOpen0(rng);
        z = radius * std::cos(angle);
        spare = radius * std::sin(angle);
        has_spare = true;
      }
      val[i * r + j] = static_cast<float>(z * stddev);
    }
  }
  SparseProjector p;
  p.index = index;
  p.value = value;
  p.rows = rows;
  p.d = d;
  p.r = r;
  return p;
}

absl::StatusOr<SparseProjector> SparseProjector::Identity(int64_t rows) {
  if (rows <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SparseProjector::Identity: rows=%d; expected > 0", rows));
  }
  SparseProjector p;
  p.index = at::arange(rows, at::kLong).unsqueeze(1).contiguous();  // (rows, 1) int64
  p.value = at::ones({rows, 1}, at::kFloat);                        // (rows, 1) fp32
  p.rows = rows;
  p.d = rows;
  p.r = 1;
  p.identity = true;
  return p;
}

absl::StatusOr<SparseProjector> SparseProjector::FromDense(const at::Tensor& M) {
  if (!M.defined() || M.dim() != 2 || M.size(0) < 1 || M.size(1) < 1 ||
      !at::isFloatingType(M.scalar_type())) {
    return absl::InvalidArgumentError(
        "SparseProjector::FromDense: expected a floating (rows, d) matrix with rows, d >= 1");
  }
  try {
    torch::NoGradGuard no_grad;
    SparseProjector p;
    p.rows = M.size(0);
    p.d = M.size(1);
    p.r = p.d;
    p.value = M.to(at::kFloat).contiguous();
    if (!at::isfinite(p.value).all().item<bool>()) {
      return absl::InvalidArgumentError("SparseProjector::FromDense: the matrix is not finite");
    }
    // (rows, d) int64, 0..d-1 on every row: a stride-0 view of one (d) row, so a dense
    // projector costs no index memory on the device (the dense kernels never read it).
    p.index = at::arange(p.d, at::TensorOptions().dtype(at::kLong).device(M.device()))
                  .unsqueeze(0)
                  .expand({p.rows, p.d});
    p.dense = true;
    p.identity = false;
    return p;
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("SparseProjector::FromDense: ", e.what()));
  }
}

absl::StatusOr<SparseProjector> SparseProjector::ForSide(int64_t rows, int64_t d, int64_t r,
                                                         bool identity, uint64_t seed) {
  if (identity) return Identity(rows);
  return Random(rows, d, r, seed);
}

absl::StatusOr<SparseProjector> SparseProjector::FromTensors(const at::Tensor& index,
                                                             const at::Tensor& value, int64_t d) {
  if (!index.defined() || !value.defined() || index.dim() != 2) {
    return absl::InvalidArgumentError(
        "SparseProjector::FromTensors: index must be a defined 2-D (rows, r) tensor");
  }
  if (!at::isIntegralType(index.scalar_type(), /*includeBool=*/false) ||
      !at::isFloatingType(value.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector::FromTensors: index dtype %s / value dtype %s; expected an integer "
        "index and a floating value",
        std::string(c10::toString(index.scalar_type())),
        std::string(c10::toString(value.scalar_type()))));
  }
  SparseProjector p;
  try {
    p.index = index.to(at::kLong).contiguous();
    p.value = value.to(index.device(), at::kFloat).contiguous();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseProjector::FromTensors: cannot convert tensors: ", e.what()));
  }
  p.rows = index.size(0);
  p.r = index.size(1);
  p.d = d;
  absl::Status st = p.Validate();
  if (!st.ok()) return st;
  if (p.r == 1 && p.d == p.rows) {
    try {
      torch::NoGradGuard no_grad;
      const at::Tensor ar = at::arange(p.rows, p.index.options());  // (rows) int64
      p.identity = at::equal(p.index.reshape({-1}), ar) &&
                   at::equal(p.value.reshape({-1}), at::ones({p.rows}, p.value.options()));
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("SparseProjector::FromTensors: ", e.what()));
    }
  }
  if (!p.identity && p.r == p.d) {
    try {
      torch::NoGradGuard no_grad;
      const at::Tensor ar = at::arange(p.d, p.index.options()).unsqueeze(0);  // (1, d) int64
      p.dense = at::equal(p.index, ar.expand({p.rows, p.d}));
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("SparseProjector::FromTensors: ", e.what()));
    }
  }
  return p;
}

absl::Status SparseProjector::Validate() const {
  if (!index.defined() || !value.defined()) {
    return absl::InvalidArgumentError("SparseProjector: index/value undefined (empty projector)");
  }
  if (index.scalar_type() != at::kLong || value.scalar_type() != at::kFloat) {
    return absl::InvalidArgumentError(
        absl::StrFormat("SparseProjector: index dtype %s, value dtype %s; expected int64 and fp32",
                        std::string(c10::toString(index.scalar_type())),
                        std::string(c10::toString(value.scalar_type()))));
  }
  if (index.dim() != 2 || index.size(0) != rows || index.size(1) != r ||
      value.sizes() != index.sizes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector: index sizes %s, value sizes %s; expected (rows, r) = (%d, %d) for both",
        c10::str(index.sizes()), c10::str(value.sizes()), rows, r));
  }
  if (index.device() != value.device()) {
    return absl::InvalidArgumentError("SparseProjector: index and value on different devices");
  }
  if (rows <= 0 || d <= 0 || r <= 0 || r > d) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SparseProjector: rows=%d d=%d r=%d; expected rows, d, r > 0 and r <= d", rows, d, r));
  }
  try {
    torch::NoGradGuard no_grad;
    const at::Tensor idx = index.cpu();
    const int64_t lo = idx.min().item<int64_t>();
    const int64_t hi = idx.max().item<int64_t>();
    if (lo < 0 || hi >= d) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "SparseProjector: column indices span [%d, %d]; expected [0, %d). The projector was "
          "written for another d",
          lo, hi, d));
    }
    if (r > 1) {
      const at::Tensor sorted = std::get<0>(idx.sort(1));                               // (rows, r)
      const at::Tensor dup = (sorted.slice(1, 1) == sorted.slice(1, 0, r - 1)).any(1);  // (rows)
      if (dup.any().item<bool>()) {
        const int64_t row = dup.nonzero()[0][0].item<int64_t>();
        return absl::InvalidArgumentError(absl::StrFormat(
            "SparseProjector: row %d repeats a column index; expected r=%d distinct columns "
            "per row. Fix: re-initialise with SparseProjector::Random",
            row, r));
      }
    }
    if (!at::isfinite(value).all().item<bool>()) {
      return absl::InvalidArgumentError(
          "SparseProjector: value has non-finite entries; expected finite values. Fix: "
          "re-initialise or refit the projector");
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("SparseProjector::Validate: ", e.what()));
  }
  return absl::OkStatus();
}

at::Tensor SparseProjector::Dense() const {
  torch::NoGradGuard no_grad;
  return at::zeros({rows, d}, value.options().dtype(at::kFloat))
      .scatter_(1, index, value.to(at::kFloat));  // (rows, d) fp32
}

SparseProjector SparseProjector::To(const at::Device& device) const {
  SparseProjector p = *this;
  p.index = index.to(device);
  p.value = value.to(device);
  return p;
}

}  // namespace lspo::lsp
