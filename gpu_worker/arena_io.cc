#include "gpu_worker/arena_io.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status_macros.h"

namespace lspo::worker {
namespace {

using lspo::v1::TensorRef;

uint64_t ElementBytes(lspo::v1::DType dtype) { return dtype == lspo::v1::BF16 ? 2 : 4; }

TensorRef MakeRef(uint64_t* cursor, lspo::v1::DType dtype, std::vector<int64_t> shape) {
  TensorRef ref;
  ref.set_offset(*cursor);
  ref.set_dtype(dtype);
  uint64_t numel = 1;
  for (int64_t s : shape) {
    ref.add_shape(s);
    numel *= static_cast<uint64_t>(s);
  }
  *cursor += runtime::AlignUp64(numel * ElementBytes(dtype));
  return ref;
}

int64_t Numel(const TensorRef& ref) {
  int64_t n = 1;
  for (int64_t s : ref.shape()) n *= s;
  return n;
}

// A new slot of `layout` naming linear `l` (index, HF name, m, n); regions are added by the
// caller.
lspo::v1::LinearSlot* AddSlot(const LinearShape& l, lspo::v1::ArenaLayout* layout) {
  auto* slot = layout->add_linears();
  slot->set_index(l.index);
  slot->set_name(l.name);
  slot->set_m(l.m);
  slot->set_n(l.n);
  return slot;
}

// The completion flags: 1 + 2 L uint32 words.
void AddFlags(const std::vector<LinearShape>& linears, lspo::v1::ArenaLayout* layout,
              uint64_t* cursor) {
  *layout->mutable_flags() =
      MakeRef(cursor, lspo::v1::I32, {1 + 2 * static_cast<int64_t>(linears.size())});
}

// The one-layer fp32 staging region (7 matrices in linear order).
void AddStaging(const std::vector<LinearShape>& linears, lspo::v1::ArenaLayout* layout,
                uint64_t* cursor) {
  int64_t largest_layer = 0;
  for (size_t s = 0; s < linears.size(); s += 7) {
    int64_t layer = 0;
    for (size_t k = s; k < std::min(linears.size(), s + 7); ++k) {
      layer += linears[k].m * linears[k].n;
    }
    largest_layer = std::max(largest_layer, layer);
  }
  *layout->mutable_staging() = MakeRef(cursor, lspo::v1::F32, {std::max<int64_t>(largest_layer, 1)});
}

}  // namespace

absl::StatusOr<lspo::v1::ArenaLayout> BuildArenaLayout(const std::vector<LinearShape>& linears,
                                                       int32_t d, int32_t r,
                                                       const std::string& name) {
  if (d < 1 || r < 1 || r > d) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena layout: need 1 <= r <= d, got d = ", d, ", r = ", r));
  }
  lspo::v1::ArenaLayout layout;
  layout.set_name(name);
  layout.set_d(d);
  layout.set_r(r);
  uint64_t cursor = 0;
  for (const LinearShape& l : linears) {
    auto* slot = AddSlot(l, &layout);
    *slot->mutable_grad() = MakeRef(&cursor, lspo::v1::F32, {d, d});
    *slot->mutable_step() = MakeRef(&cursor, lspo::v1::F32, {d, d});
    *slot->mutable_p_index() = MakeRef(&cursor, lspo::v1::I32, {l.m, r});
    *slot->mutable_p_value() = MakeRef(&cursor, lspo::v1::F32, {l.m, r});
    *slot->mutable_q_index() = MakeRef(&cursor, lspo::v1::I32, {l.n, r});
    *slot->mutable_q_value() = MakeRef(&cursor, lspo::v1::F32, {l.n, r});
  }
  AddFlags(linears, &layout, &cursor);
  AddStaging(linears, &layout, &cursor);
  layout.set_mode("lsp");
  layout.set_bytes(std::max<uint64_t>(cursor, 64));
  return layout;
}

absl::StatusOr<lspo::v1::ArenaLayout> BuildZeroArenaLayout(
    const std::vector<LinearShape>& linears, const std::string& name) {
  lspo::v1::ArenaLayout layout;
  layout.set_name(name);
  uint64_t cursor = 0;
  for (const LinearShape& l : linears) {
    auto* slot = AddSlot(l, &layout);
    *slot->mutable_full_grad() = MakeRef(&cursor, lspo::v1::BF16, {l.m, l.n});
    *slot->mutable_param() = MakeRef(&cursor, lspo::v1::BF16, {l.m, l.n});
  }
  AddFlags(linears, &layout, &cursor);
  layout.set_mode("zero");
  layout.set_bytes(std::max<uint64_t>(cursor, 64));
  return layout;
}

absl::StatusOr<at::Tensor> ArenaBf16(const runtime::ShmArena& arena, const TensorRef& ref) {
  if (ref.dtype() != lspo::v1::BF16) {
    return absl::InvalidArgumentError(absl::StrCat("arena slot at offset ", ref.offset(),
                                                   " is not BF16"));
  }
  ASSIGN_OR_RETURN(uint16_t* ptr, arena.At<uint16_t>(ref.offset(), Numel(ref)));
  std::vector<int64_t> shape(ref.shape().begin(), ref.shape().end());
  return at::from_blob(ptr, shape, at::TensorOptions().dtype(at::kBFloat16));
}

absl::StatusOr<runtime::CompletionFlags> ArenaFlags(const runtime::ShmArena& arena,
                                                    const lspo::v1::ArenaLayout& layout) {
  const int64_t n = layout.linears_size();
  if (Numel(layout.flags()) != 1 + 2 * n) {
    return absl::InvalidArgumentError(absl::StrCat("arena flags region has ",
                                                   Numel(layout.flags()), " words, expected ",
                                                   1 + 2 * n));
  }
  ASSIGN_OR_RETURN(uint32_t* words, arena.At<uint32_t>(layout.flags().offset(), 1 + 2 * n));
  return runtime::CompletionFlags(words, n);
}

absl::StatusOr<at::Tensor> ArenaF32(const runtime::ShmArena& arena, const TensorRef& ref) {
  if (ref.dtype() != lspo::v1::F32) {
    return absl::InvalidArgumentError(absl::StrCat("arena slot at offset ", ref.offset(),
                                                   " is not F32"));
  }
  ASSIGN_OR_RETURN(float* ptr, arena.At<float>(ref.offset(), Numel(ref)));
  std::vector<int64_t> shape(ref.shape().begin(), ref.shape().end());
  return at::from_blob(ptr, shape, at::TensorOptions().dtype(at::kFloat));
}

absl::Status WriteProjector(const runtime::ShmArena& arena, const TensorRef& index,
                            const TensorRef& value, const lsp::SparseProjector& p) {
  const int64_t n = p.rows * p.r;
  if (Numel(index) != n || Numel(value) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "projector (", p.rows, " x ", p.r, " non-zeros) does not fit slot of shape [",
        absl::StrJoin(index.shape(), ","), "]"));
  }
  ASSIGN_OR_RETURN(int32_t* idx, arena.At<int32_t>(index.offset(), n));
  ASSIGN_OR_RETURN(float* val, arena.At<float>(value.offset(), n));
  at::Tensor src_idx = p.index.to(at::kInt).cpu().contiguous();
  at::Tensor src_val = p.value.to(at::kFloat).cpu().contiguous();
  std::memcpy(idx, src_idx.data_ptr<int32_t>(), n * sizeof(int32_t));
  std::memcpy(val, src_val.data_ptr<float>(), n * sizeof(float));
  return absl::OkStatus();
}

absl::StatusOr<lsp::SparseProjector> ReadProjector(const runtime::ShmArena& arena,
                                                   const TensorRef& index,
                                                   const TensorRef& value, int64_t d) {
  if (index.shape_size() != 2 || value.shape_size() != 2 || Numel(index) != Numel(value)) {
    return absl::InvalidArgumentError("projector slots must be 2-D and of equal shape");
  }
  const int64_t rows = index.shape(0), r = index.shape(1);
  ASSIGN_OR_RETURN(int32_t* idx, arena.At<int32_t>(index.offset(), rows * r));
  ASSIGN_OR_RETURN(float* val, arena.At<float>(value.offset(), rows * r));
  lsp::SparseProjector p;
  p.rows = rows;
  p.d = d;
  p.r = r;
  p.index = at::from_blob(idx, {rows, r}, at::TensorOptions().dtype(at::kInt)).to(at::kLong);
  p.value = at::from_blob(val, {rows, r}, at::TensorOptions().dtype(at::kFloat)).clone();
  const int64_t lo = p.index.min().item<int64_t>(), hi = p.index.max().item<int64_t>();
  if (lo < 0 || hi >= d) {
    return absl::DataLossError(absl::StrCat("projector positions in the arena span [", lo, ", ",
                                            hi, "], expected [0, ", d, ")"));
  }
  return p;
}

namespace {

const char* SafetensorsDtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kBFloat16: return "BF16";
    case at::kInt: return "I32";
    case at::kLong: return "I64";
    default: return nullptr;
  }
}

}  // namespace

absl::Status WriteTensorFile(const std::string& path, const NamedTensors& tensors,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> keep;
  std::vector<model::SafetensorsEntry> entries;
  keep.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    const char* dtype = SafetensorsDtype(t.scalar_type());
    if (dtype == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("state tensor ", name, " in '", path,
                                                     "': need an f32/bf16/i32/i64 tensor"));
    }
    keep.push_back(t.detach().cpu().contiguous());  // Device tensors are copied to the host.
    const at::Tensor& c = keep.back();
    entries.push_back({name, dtype, c.sizes().vec(), c.data_ptr(),
                       static_cast<size_t>(c.numel() * c.element_size())});
  }
  return model::WriteSafetensors(path, entries, metadata);
}

absl::StatusOr<at::Tensor> ViewStateTensor(const model::SafetensorsFile& file,
                                           const std::string& what, const std::string& name,
                                           at::ScalarType dtype, at::IntArrayRef shape) {
  const model::SafetensorsTensorInfo* info = file.Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(what, " has no tensor '", name,
                                            "': the checkpoint is incomplete or of another job"));
  }
  if (info->dtype != SafetensorsDtype(dtype) ||
      info->shape != std::vector<int64_t>(shape.begin(), shape.end())) {
    return absl::DataLossError(absl::StrCat(
        what, ": tensor '", name, "' is ", info->dtype, " [", absl::StrJoin(info->shape, ", "),
        "], expected ", SafetensorsDtype(dtype), " [", absl::StrJoin(shape, ", "),
        "]: the checkpoint belongs to a different model or spec"));
  }
  ASSIGN_OR_RETURN(absl::Span<const uint8_t> raw, file.RawData(name));
  at::Tensor t = at::from_blob(const_cast<uint8_t*>(raw.data()), shape,
                               at::TensorOptions().dtype(dtype));
  if (static_cast<size_t>(t.numel() * t.element_size()) != raw.size()) {
    return absl::DataLossError(absl::StrCat(what, ": tensor '", name, "' has a bad size"));
  }
  if (t.is_floating_point() && !at::isfinite(t).all().item<bool>()) {
    return absl::DataLossError(absl::StrCat(what, ": tensor '", name,
                                            "' holds NaN or Inf: refusing to resume from it"));
  }
  return t;
}

absl::StatusOr<at::Tensor> ReadStateTensor(const model::SafetensorsFile& file,
                                           const std::string& what, const std::string& name,
                                           at::ScalarType dtype, at::IntArrayRef shape) {
  ASSIGN_OR_RETURN(at::Tensor view, ViewStateTensor(file, what, name, dtype, shape));
  return view.clone();
}

void AppendProjector(const std::string& prefix, const lsp::SparseProjector& p,
                     NamedTensors* out) {
  out->emplace_back(prefix + "_index", p.index.to(at::kInt).contiguous());
  out->emplace_back(prefix + "_value", p.value.to(at::kFloat).contiguous());
}

absl::StatusOr<lsp::SparseProjector> ReadStateProjector(const model::SafetensorsFile& file,
                                                        const std::string& what,
                                                        const std::string& prefix,
                                                        int64_t rows, int64_t d, int64_t r) {
  ASSIGN_OR_RETURN(at::Tensor index,
                   ReadStateTensor(file, what, prefix + "_index", at::kInt, {rows, r}));
  ASSIGN_OR_RETURN(at::Tensor value,
                   ReadStateTensor(file, what, prefix + "_value", at::kFloat, {rows, r}));
  auto p = lsp::SparseProjector::FromTensors(index, value, d);
  if (!p.ok()) {
    return absl::DataLossError(absl::StrCat(what, ": projector '", prefix, "': ",
                                            p.status().message()));
  }
  return p;
}

}  // namespace lspo::worker
