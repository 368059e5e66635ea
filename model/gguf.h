// Bounded, torch-free reader of GGUF v2/v3 files (llama.cpp model checkpoints).
//
// File layout (docs/formats.md §1; ggml docs/gguf.md, ggml src/gguf.cpp), all little-endian:
//   "GGUF" | u32 version (2 or 3) | u64 n_tensors | u64 n_kv
//   | n_kv x (string key, u32 value_type, value)
//   | n_tensors x (string name, u32 n_dims <= 4, u64 ne[n_dims], u32 ggml_type, u64 offset)
//   | zero padding to alignment A | tensor data
// string = u64 length + bytes (no NUL). Value types: 0 u8, 1 i8, 2 u16, 3 i16, 4 u32, 5 i32,
// 6 f32, 7 bool (1 byte), 8 string, 9 array (u32 elem type, u64 count, elems; not nested),
// 10 u64, 11 i64, 12 f64. A = `general.alignment` (u32 power of two, default 32).
// data_start = align(end of tensor infos); tensor i's bytes are at data_start + offset_i and
// span nbytes = ne0/B * type_size * ne1 * ne2 * ne3 (B, type_size: dequant.h).
//
// Shapes: GGUF `ne` lists the contiguous dimension first. The PyTorch shape is ne reversed:
// a torch [out, in] weight has ne = [in, out]. ReadTensorF32 returns row-major data in torch
// order, which is exactly the file's element order.
//
// Validation done by Open (each failure returns a status, never crashes):
//   - header: magic "GGUF" (else kInvalidArgument); version low 16 bits == 0 means a
//     big-endian file (kInvalidArgument); version not 2 or 3 (kUnimplemented).
//   - n_kv / n_tensors bounded by the bytes left (min. 13 / 24 bytes per entry) (kDataLoss).
//   - every string / array length <= bytes left (kDataLoss); unknown value type or nested
//     array (kDataLoss); duplicate keys (kDataLoss); `general.alignment` not a u32 power of
//     two (kDataLoss).
//   - tensor infos: name non-empty and < 64 bytes, unique; n_dims <= 4; ne >= 0; element
//     count and byte size without int64 overflow; type id in GgmlType (else kUnimplemented,
//     naming the tensor and the id); ne0 % B == 0; offset % A == 0; tensors do not overlap
//     (all kDataLoss).
//   - any read past the end, or data_start + max(offset + nbytes) > file size: kDataLoss with
//     the expected and the actual file size (the file is truncated).
//
// Thread-safety: a GgufFile is immutable after Open; all const methods may be called
// concurrently. Movable, not copyable.
#ifndef LSPO_MODEL_GGUF_H_
#define LSPO_MODEL_GGUF_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/dequant.h"
#include "model/mapped_file.h"

namespace lspo::model {

// GGUF metadata value types (u32 on disk).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "UINT8", "STRING", ...; "UNKNOWN" for other values.
absl::string_view GgufValueTypeName(GgufValueType type);

// One metadata value: a scalar (one element) or an array. Exactly one of the vectors below is
// used, chosen by the element type (`type`, or `array_type` when type == kArray):
// integers (u8..u64, i8..i64) -> `ints` (u64 stored bit-cast: values > INT64_MAX appear
// negative, and GetInt reports them), bool -> `bools`, f32/f64 -> `floats`, string -> `strings`.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType array_type = GgufValueType::kUint8;  // element type; valid if type == kArray
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<uint8_t> bools;
  std::vector<std::string> strings;

  bool is_array() const { return type == GgufValueType::kArray; }
  // Element type: array_type for arrays, else type.
  GgufValueType elem_type() const { return is_array() ? array_type : type; }
  // Number of elements (1 for scalars).
  size_t size() const;
};

// One tensor info record.
struct GgufTensorInfo {
  std::string name;         // e.g. "blk.0.attn_q.weight"
  std::vector<int64_t> ne;  // GGUF dims, contiguous first; size n_dims (0..4)
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // bytes, relative to the start of the data section
  uint64_t nbytes = 0;  // bytes of the whole tensor

  // PyTorch shape: ne reversed (e.g. ne [576, 192] -> [192, 576]).
  std::vector<int64_t> TorchShape() const;
  // Product of ne (1 for n_dims == 0).
  int64_t numel() const;
  // ne[0] (elements of one contiguous row); 1 if n_dims == 0.
  int64_t row_length() const { return ne.empty() ? 1 : ne[0]; }
  // numel() / row_length() (0 when the row length is 0).
  int64_t num_rows() const;
};

class GgufFile {
 public:
  GgufFile(GgufFile&&) = default;
  GgufFile& operator=(GgufFile&&) = default;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  // Memory-maps and validates `path` (see the file comment for every check and its code).
  // kNotFound if the file does not exist.
  static absl::StatusOr<GgufFile> Open(const std::string& path);

  // As Open, over an in-memory copy of a file's bytes; `name` is used in messages.
  static absl::StatusOr<GgufFile> FromBytes(std::vector<uint8_t> bytes,
                                            const std::string& name = "<memory>");

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  // Absolute file offset of the data section.
  uint64_t data_start() const { return data_start_; }
  // Tensor infos in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // Metadata keys in file order.
  const std::vector<std::string>& keys() const { return key_order_; }

  // nullptr if no tensor has this name.
  const GgufTensorInfo* FindTensor(absl::string_view name) const;
  // nullptr if the key is absent.
  const GgufValue* FindKey(absl::string_view key) const;
  bool HasKey(absl::string_view key) const { return FindKey(key) != nullptr; }

  // Typed metadata getters. All return kNotFound for a missing key and kInvalidArgument for a
  // value of another type (the message names the key, the stored and the requested type).
  // GetInt accepts any integer scalar type (llama.cpp writes hparams as u32, the spec says
  // u64); kInvalidArgument for a u64 above INT64_MAX. GetFloat accepts f32 and f64 (widened).
  absl::StatusOr<int64_t> GetInt(absl::string_view key) const;
  absl::StatusOr<double> GetFloat(absl::string_view key) const;
  absl::StatusOr<std::string> GetString(absl::string_view key) const;
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(absl::string_view key) const;
  // Any integer element type; kInvalidArgument for a u64 element above INT64_MAX.
  absl::StatusOr<std::vector<int64_t>> GetIntArray(absl::string_view key) const;
  // f32 or f64 elements.
  absl::StatusOr<std::vector<double>> GetFloatArray(absl::string_view key) const;

  // Raw bytes of a tensor (info must come from this file's tensors()).
  absl::Span<const uint8_t> TensorData(const GgufTensorInfo& info) const;

  // Whole tensor dequantised to f32, row-major in torch order (shape info.TorchShape()).
  // kNotFound if absent; kUnimplemented if its type cannot be dequantised (dequant.h).
  // Rows are dequantised in parallel (TBB).
  absl::StatusOr<std::vector<float>> ReadTensorF32(absl::string_view name) const;

  // Rows [row_begin, row_begin + row_count) of a tensor viewed as (num_rows, ne0), dequantised
  // to f32: (row_count, ne0) row-major. E.g. token_embd rows = embeddings of token ids.
  // kNotFound if absent; kOutOfRange if the rows are not inside the tensor; kUnimplemented as
  // ReadTensorF32.
  absl::StatusOr<std::vector<float>> ReadRowsF32(absl::string_view name, int64_t row_begin,
                                                 int64_t row_count) const;

 private:
  GgufFile() = default;
  static absl::StatusOr<GgufFile> Parse(MappedFile file, const std::string& name);

  MappedFile file_;
  std::string name_;
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  uint64_t data_start_ = 0;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
  std::vector<std::string> key_order_;
  absl::flat_hash_map<std::string, GgufValue> kv_;
};

}  // namespace lspo::model

#endif  // LSPO_MODEL_GGUF_H_
