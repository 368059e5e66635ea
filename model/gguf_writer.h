// Torch-free writer of GGUF v3 files (the layout model/gguf.h reads; docs/formats.md §1), and
// the encoders of the element types it writes.
//
// A GgufWriter collects metadata (key, value) pairs and tensor infos (name, torch shape, ggml
// type), then WriteFile streams the file: header, metadata in the order set, tensor infos with
// their data offsets (each aligned to 32 bytes, ggml's GGUF_DEFAULT_ALIGNMENT), zero padding,
// and the tensor data, asking a caller's callback for one tensor's f32 values at a time (so a
// model is never held whole). The file is written as PATH.partial, fsynced and renamed to PATH:
// a failure leaves no partial file under PATH.
//
// Element encodings (EncodeRow), the inverses of dequant.h's DequantizeRow:
//   F32   the value
//   F16   IEEE binary16, round to nearest even (runtime/float16.h), as numpy's astype(float16)
//   BF16  the high half of the f32, round to nearest even, NaN kept quiet (runtime/float16.h;
//         ggml's ggml_compute_fp32_to_bf16 rounds alike)
//   Q8_0  per block of 32: d = max|x| / 127 stored as f16, q_j = round(x_j / d) (halves away
//         from zero), int8; d = 0 gives q = 0. (ggml-quants.c quantize_row_q8_0_ref and
//         gguf-py quants.py Q8_0.quantize_blocks: the same rule.)
//
// Thread-safety: a GgufWriter is not thread-safe; EncodeRow is pure.
#ifndef LSPO_MODEL_GGUF_WRITER_H_
#define LSPO_MODEL_GGUF_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "model/dequant.h"
#include "model/gguf.h"

namespace lspo::model {

// True when EncodeRow can write `type` (F32, F16, BF16, Q8_0).
bool CanEncode(GgmlType type);

// Encodes `n` f32 values `src` as `type` into `dst` (`dst_bytes` writable bytes; the row needs
// GgmlRowBytes(type, n)). Formulas: the file comment.
// Errors: kInvalidArgument if n < 0, n is not a whole number of blocks, or dst_bytes is too
// small; kUnimplemented for a type CanEncode refuses.
absl::Status EncodeRow(GgmlType type, const float* src, int64_t n, uint8_t* dst, size_t dst_bytes);

// Fills `values` (resized by the callee to the tensor's element count, row-major in torch
// order) with the f32 values of tensor `index` (in the order AddTensor was called).
using GgufTensorValues = std::function<absl::Status(size_t index, std::vector<float>* values)>;

class GgufWriter {
 public:
  // Metadata setters; a key set twice keeps its first position and takes the last value.
  void SetString(absl::string_view key, std::string value);
  void SetUint32(absl::string_view key, uint32_t value);
  void SetInt32(absl::string_view key, int32_t value);
  void SetFloat32(absl::string_view key, float value);
  void SetBool(absl::string_view key, bool value);
  void SetStringArray(absl::string_view key, std::vector<std::string> values);
  void SetInt32Array(absl::string_view key, std::vector<int32_t> values);
  void SetFloat32Array(absl::string_view key, std::vector<float> values);

  // Declares a tensor: `name` (GGUF name, 1..63 bytes, unique), `torch_shape` (1 to 4 dims, each
  // >= 1; stored reversed as GGUF ne), element `type`.
  // Errors: kInvalidArgument for a bad or repeated name, a bad shape, a type EncodeRow cannot
  // write, or a last dimension (the contiguous row) that is not a whole number of the type's
  // blocks (e.g. 40 elements in Q8_0).
  absl::Status AddTensor(const std::string& name, std::vector<int64_t> torch_shape, GgmlType type);

  // Writes the file (see the file comment) to `path`, taking each tensor's values from
  // `values`. Errors: the callback's status (prefixed with the tensor's name); kInvalidArgument
  // when it returns a vector of the wrong length; kPermissionDenied / kResourceExhausted /
  // kInternal for a file that cannot be written (path named). Nothing is left under `path` on
  // error (a previous file there is kept).
  absl::Status WriteFile(const std::string& path, const GgufTensorValues& values) const;

  // The bytes WriteFile would write before the tensor data (header, metadata, tensor infos,
  // padding); exposed for tests.
  std::string HeaderBytes() const;

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;  // torch order
    GgmlType type;
    uint64_t offset = 0;  // relative to the data section
    uint64_t nbytes = 0;
  };
  void Set(absl::string_view key, GgufValue value);

  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
  absl::flat_hash_set<std::string> tensor_names_;
  uint64_t data_bytes_ = 0;
};

}  // namespace lspo::model

#endif  // LSPO_MODEL_GGUF_WRITER_H_
