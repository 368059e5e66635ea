// Shapes as in offload/state_file.h.
#include "offload/state_file.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status_macros.h"

namespace lspo::offload {
namespace {

const char* SafetensorsDtype(at::ScalarType t) {
  switch (t) {
    case at::kDouble:
      return "F64";
    case at::kFloat:
      return "F32";
    case at::kBFloat16:
      return "BF16";
    case at::kInt:
      return "I32";
    case at::kLong:
      return "I64";
    default:
      return nullptr;
  }
}

}  // namespace

absl::Status WriteTensorFile(const std::string& path, const NamedTensors& tensors,
                             const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> keep;  // host copies of `tensors`, alive until the write
  std::vector<model::SafetensorsEntry> entries;
  keep.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    const char* dtype = SafetensorsDtype(t.scalar_type());
    if (dtype == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("state tensor ", name, " in '", path,
                                                     "': need an f64/f32/bf16/i32/i64 tensor"));
    }
    keep.push_back(t.detach().cpu().contiguous());  // Device tensors are copied to the host.
    const at::Tensor& c = keep.back();              // t's shape and dtype, CPU, contiguous
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
  // (shape) dtype, a read-only CPU view of the mapped file.
  at::Tensor t =
      at::from_blob(const_cast<uint8_t*>(raw.data()), shape, at::TensorOptions().dtype(dtype));
  if (static_cast<size_t>(t.numel() * t.element_size()) != raw.size()) {
    return absl::DataLossError(absl::StrCat(what, ": tensor '", name, "' has a bad size"));
  }
  if (t.is_floating_point() && !at::isfinite(t).all().item<bool>()) {
    return absl::DataLossError(
        absl::StrCat(what, ": tensor '", name, "' holds NaN or Inf: refusing to resume from it"));
  }
  return t;
}

absl::StatusOr<at::Tensor> ReadStateTensor(const model::SafetensorsFile& file,
                                           const std::string& what, const std::string& name,
                                           at::ScalarType dtype, at::IntArrayRef shape) {
  // (shape) dtype, a read-only CPU view; returned as an owning copy.
  ASSIGN_OR_RETURN(at::Tensor view, ViewStateTensor(file, what, name, dtype, shape));
  return view.clone();
}

void AppendProjector(const std::string& prefix, const lsp::SparseProjector& p, NamedTensors* out) {
  out->emplace_back(prefix + "_index", p.index.to(at::kInt).contiguous());
  out->emplace_back(prefix + "_value", p.value.to(at::kFloat).contiguous());
}

absl::StatusOr<lsp::SparseProjector> ReadStateProjector(const model::SafetensorsFile& file,
                                                        const std::string& what,
                                                        const std::string& prefix, int64_t rows,
                                                        int64_t d, int64_t r) {
  // index (rows, r) int32 and value (rows, r) fp32, CPU.
  ASSIGN_OR_RETURN(at::Tensor index,
                   ReadStateTensor(file, what, prefix + "_index", at::kInt, {rows, r}));
  ASSIGN_OR_RETURN(at::Tensor value,
                   ReadStateTensor(file, what, prefix + "_value", at::kFloat, {rows, r}));
  auto p = lsp::SparseProjector::FromTensors(index, value, d);
  if (!p.ok()) {
    return absl::DataLossError(
        absl::StrCat(what, ": projector '", prefix, "': ", p.status().message()));
  }
  return p;
}

}  // namespace lspo::offload
