// Training-state files (checkpoints, exact resume; docs/checkpoints.md): named CPU tensors in
// safetensors files, validated views for a resume, and projectors as plain tensors. Used by the
// worker (worker_state.safetensors) and the optimizer (optimizer_state.safetensors).
// Thread-safety: stateless functions.
//
// Shapes: a projector's rows (m for P, n for Q), d its subspace dim (columns: d_p for P, d_q
// for Q), r its non-zeros per row; any other tensor is of the shape its caller names.
#ifndef LSPO_OFFLOAD_STATE_FILE_H_
#define LSPO_OFFLOAD_STATE_FILE_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "lsp/projector.h"
#include "model/safetensors.h"

namespace lspo::offload {

// Named CPU tensors of a state file, in write order.
using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` (any shape; fp64, fp32, bf16, int32 or int64; device tensors are copied to
// the host; made contiguous) to the safetensors file `path` with `metadata` through
// model::WriteSafetensors (temp file, fsync, rename).
// Errors: kInvalidArgument (other dtype), I/O errors of WriteSafetensors
// (kPermissionDenied / kInternal naming the path).
absl::Status WriteTensorFile(const std::string& path, const NamedTensors& tensors,
                             const std::map<std::string, std::string>& metadata);

// A read-only CPU tensor (`shape`, `dtype`) viewing tensor `name` of the (memory-mapped) state file
// `file` (described as `what` in messages; valid while `file` lives; never write to it), checking
// its dtype and shape, so a resume validates every tensor before copying any and never holds two
// copies of the state (docs/known-failures.md #15). Floating tensors must be finite (a poisoned
// checkpoint must not resume; docs/known-failures.md #5). Errors: kNotFound (absent), kDataLoss
// (other dtype or shape, non-finite values), each naming the file and the tensor.
absl::StatusOr<at::Tensor> ViewStateTensor(const model::SafetensorsFile& file,
                                           const std::string& what, const std::string& name,
                                           at::ScalarType dtype, at::IntArrayRef shape);
// As ViewStateTensor, but an owning copy.
absl::StatusOr<at::Tensor> ReadStateTensor(const model::SafetensorsFile& file,
                                           const std::string& what, const std::string& name,
                                           at::ScalarType dtype, at::IntArrayRef shape);

// A projector as two state tensors `<prefix>_index` (rows, r) int32 and `<prefix>_value`
// (rows, r) fp32 (docs/known-failures.md #11: plain tensors). p: index (rows, r) int64, value
// (rows, r) fp32, any device.
void AppendProjector(const std::string& prefix, const lsp::SparseProjector& p, NamedTensors* out);
// Reads back what AppendProjector wrote, validated (SparseProjector::FromTensors) against
// `rows`, `r` and `d`: index (rows, r) int64, value (rows, r) fp32, on the CPU.
// Errors: as ReadStateTensor, kDataLoss for an invalid projector.
absl::StatusOr<lsp::SparseProjector> ReadStateProjector(const model::SafetensorsFile& file,
                                                        const std::string& what,
                                                        const std::string& prefix, int64_t rows,
                                                        int64_t d, int64_t r);

}  // namespace lspo::offload

#endif  // LSPO_OFFLOAD_STATE_FILE_H_
