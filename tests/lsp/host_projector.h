// Test helper of the torch-free CPU kernel tests (apply_kernel_test, project_kernel_test): a
// random (d, r)-sparse projector in plain host vectors, the layout lsp::SparseProjector keeps
// in its (rows, r) index / value tensors.
#ifndef LSPO_TESTS_LSP_HOST_PROJECTOR_H_
#define LSPO_TESTS_LSP_HOST_PROJECTOR_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace lspo::lsp {

struct HostProjector {
  int64_t d = 0, r = 0;
  std::vector<int64_t> index;  // (rows, r): r distinct columns in [0, d) per row
  std::vector<float> value;    // (rows, r): N(0, 1/r), as SparseProjector::Random
};

// rows x (d, r) with r distinct columns per row (partial Fisher-Yates) drawn from `rng`.
inline HostProjector RandomHostProjector(int64_t rows, int64_t d, int64_t r, std::mt19937& rng) {
  HostProjector p;
  p.d = d;
  p.r = r;
  std::normal_distribution<float> nd(0.f, 1.f / std::sqrt(static_cast<float>(r)));
  std::vector<int64_t> cols(static_cast<size_t>(d));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < d; ++c) cols[static_cast<size_t>(c)] = c;
    for (int64_t k = 0; k < r; ++k) {
      std::uniform_int_distribution<int64_t> pick(k, d - 1);
      std::swap(cols[static_cast<size_t>(k)], cols[static_cast<size_t>(pick(rng))]);
      p.index.push_back(cols[static_cast<size_t>(k)]);
      p.value.push_back(nd(rng));
    }
  }
  return p;
}

}  // namespace lspo::lsp

#endif  // LSPO_TESTS_LSP_HOST_PROJECTOR_H_
