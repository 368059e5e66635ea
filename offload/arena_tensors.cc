// Shapes as in offload/arena_tensors.h.
#include "offload/arena_tensors.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status_macros.h"

namespace lspo::offload {

using lspo::v1::TensorRef;

absl::StatusOr<at::Tensor> ArenaBf16(const runtime::ShmArena& arena, const TensorRef& ref) {
  if (ref.dtype() != lspo::v1::BF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena slot at offset ", ref.offset(), " is not BF16"));
  }
  ASSIGN_OR_RETURN(uint16_t * ptr, arena.At<uint16_t>(ref.offset(), Numel(ref)));
  std::vector<int64_t> shape(ref.shape().begin(), ref.shape().end());
  return at::from_blob(ptr, shape, at::TensorOptions().dtype(at::kBFloat16));
}

absl::StatusOr<runtime::CompletionFlags> ArenaFlags(const runtime::ShmArena& arena,
                                                    const lspo::v1::ArenaLayout& layout) {
  const int64_t n = layout.linears_size();
  if (Numel(layout.flags()) != runtime::CompletionFlags::Words(n)) {
    return absl::InvalidArgumentError(absl::StrCat("arena flags region has ", Numel(layout.flags()),
                                                   " words, expected ",
                                                   runtime::CompletionFlags::Words(n)));
  }
  ASSIGN_OR_RETURN(uint32_t * words,
                   arena.At<uint32_t>(layout.flags().offset(), runtime::CompletionFlags::Words(n)));
  return runtime::CompletionFlags(words, n);
}

absl::StatusOr<at::Tensor> ArenaF32(const runtime::ShmArena& arena, const TensorRef& ref) {
  if (ref.dtype() != lspo::v1::F32) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena slot at offset ", ref.offset(), " is not F32"));
  }
  ASSIGN_OR_RETURN(float* ptr, arena.At<float>(ref.offset(), Numel(ref)));
  std::vector<int64_t> shape(ref.shape().begin(), ref.shape().end());
  return at::from_blob(ptr, shape, at::TensorOptions().dtype(at::kFloat));
}

absl::Status WriteProjector(const runtime::ShmArena& arena, const TensorRef& index,
                            const TensorRef& value, const lsp::SparseProjector& p) {
  const int64_t n = p.rows * p.r;
  if (Numel(index) != n || Numel(value) != n) {
    return absl::InvalidArgumentError(absl::StrCat("projector (", p.rows, " x ", p.r,
                                                   " non-zeros) does not fit slot of shape [",
                                                   absl::StrJoin(index.shape(), ","), "]"));
  }
  ASSIGN_OR_RETURN(int32_t * idx, arena.At<int32_t>(index.offset(), n));
  ASSIGN_OR_RETURN(float* val, arena.At<float>(value.offset(), n));
  at::Tensor src_idx = p.index.to(at::kInt).cpu().contiguous();    // (rows, r) int32 CPU
  at::Tensor src_val = p.value.to(at::kFloat).cpu().contiguous();  // (rows, r) fp32 CPU
  std::memcpy(idx, src_idx.data_ptr<int32_t>(), n * sizeof(int32_t));
  std::memcpy(val, src_val.data_ptr<float>(), n * sizeof(float));
  return absl::OkStatus();
}

absl::StatusOr<lsp::SparseProjector> ReadProjector(const runtime::ShmArena& arena,
                                                   const TensorRef& index, const TensorRef& value,
                                                   int64_t d) {
  if (index.shape_size() != 2 || value.shape_size() != 2 || Numel(index) != Numel(value)) {
    return absl::InvalidArgumentError("projector slots must be 2-D and of equal shape");
  }
  const int64_t rows = index.shape(0), r = index.shape(1);
  ASSIGN_OR_RETURN(int32_t * idx, arena.At<int32_t>(index.offset(), rows * r));
  ASSIGN_OR_RETURN(float* val, arena.At<float>(value.offset(), rows * r));
  lsp::SparseProjector p;
  p.rows = rows;
  p.d = d;
  p.r = r;
  // index (rows, r) int64 and value (rows, r) fp32: CPU copies of the slots.
  p.index = at::from_blob(idx, {rows, r}, at::TensorOptions().dtype(at::kInt)).to(at::kLong);
  p.value = at::from_blob(val, {rows, r}, at::TensorOptions().dtype(at::kFloat)).clone();
  const int64_t lo = p.index.min().item<int64_t>(), hi = p.index.max().item<int64_t>();
  if (lo < 0 || hi >= d) {
    return absl::DataLossError(absl::StrCat("projector positions in the arena span [", lo, ", ", hi,
                                            "], expected [0, ", d, ")"));
  }
  // The structure the kernels take shortcuts for (lsp/projector.h): the identity side of a
  // one-sided subspace, and GaLore-Offload's dense projectors.
  if (r == 1 && d == rows) {
    p.identity = at::equal(p.index.view({-1}), at::arange(rows, at::kLong)) &&
                 at::equal(p.value.view({-1}), at::ones({rows}, at::kFloat));
  } else if (r == d) {
    p.dense = at::equal(p.index, at::arange(d, at::kLong).unsqueeze(0).expand({rows, d}));
  }
  return p;
}

}  // namespace lspo::offload
