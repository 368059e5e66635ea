#include "model/gguf.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/status_macros.h"
#include "tbb/blocked_range.h"
#include "tbb/parallel_for.h"

namespace lspo::model {
namespace {

constexpr uint64_t kMaxNameBytes = 63;  // ggml GGML_MAX_NAME = 64 including the NUL
constexpr uint32_t kMaxDims = 4;
constexpr uint32_t kDefaultAlignment = 32;
// Minimal encoded sizes, used to bound counts by the bytes left.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;              // key length + type + 1-byte value
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // len + n_dims + type + offset

bool IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

// Encoded size of a scalar of type t (0 for string/array/unknown).
uint64_t ScalarSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

bool IsKnownValueType(uint32_t t) { return t <= 12; }

// Bounds-checked little-endian cursor over the file bytes. Every read failure is kDataLoss
// naming the file, what was being read, the offset, and expected vs actual size.
class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size, const std::string& name)
      : data_(data), size_(size), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }

  absl::Status Truncated(uint64_t need, absl::string_view what) const {
    return absl::DataLossError(
        absl::StrCat("GGUF file '", name_, "' is truncated: reading ", what, " at offset ", pos_,
                     " needs ", need, " bytes, so the file should be at least ", pos_ + need,
                     " bytes, but it is ", size_, " bytes; re-download or re-convert the file"));
  }

  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n > left()) return Truncated(n, what);
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Read(T* out, absl::string_view what) {
    RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(out, data_ + pos_, sizeof(T));  // little-endian host (x86-64 / aarch64)
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out, absl::string_view what) {
    uint64_t len = 0;
    RETURN_IF_ERROR(Read(&len, absl::StrCat(what, " length")));
    if (len > left()) {
      return absl::DataLossError(absl::StrCat("GGUF file '", name_, "': ", what, " at offset ",
                                              pos_ - 8, " has length ", len, " but only ", left(),
                                              " bytes are left in the ", size_,
                                              "-byte file; the file is corrupt or truncated"));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(len));
    pos_ += len;
    return absl::OkStatus();
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& name_;
};

template <typename T>
absl::Status ReadIntElems(Reader& r, uint64_t count, std::vector<int64_t>* out,
                          absl::string_view what) {
  RETURN_IF_ERROR(r.Need(count * sizeof(T), what));  // count already bounded by bytes left
  out->reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    T v;
    RETURN_IF_ERROR(r.Read(&v, what));
    out->push_back(static_cast<int64_t>(v));
  }
  return absl::OkStatus();
}

// Reads `count` elements of type t into `value`.
absl::Status ReadElems(Reader& r, GgufValueType t, uint64_t count, GgufValue* value,
                       const std::string& what) {
  switch (t) {
    case GgufValueType::kUint8:
      return ReadIntElems<uint8_t>(r, count, &value->ints, what);
    case GgufValueType::kInt8:
      return ReadIntElems<int8_t>(r, count, &value->ints, what);
    case GgufValueType::kUint16:
      return ReadIntElems<uint16_t>(r, count, &value->ints, what);
    case GgufValueType::kInt16:
      return ReadIntElems<int16_t>(r, count, &value->ints, what);
    case GgufValueType::kUint32:
      return ReadIntElems<uint32_t>(r, count, &value->ints, what);
    case GgufValueType::kInt32:
      return ReadIntElems<int32_t>(r, count, &value->ints, what);
    case GgufValueType::kUint64:
      return ReadIntElems<uint64_t>(r, count, &value->ints, what);
    case GgufValueType::kInt64:
      return ReadIntElems<int64_t>(r, count, &value->ints, what);
    case GgufValueType::kFloat32: {
      RETURN_IF_ERROR(r.Need(count * 4, what));
      value->floats.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        float f;
        RETURN_IF_ERROR(r.Read(&f, what));
        value->floats.push_back(f);
      }
      return absl::OkStatus();
    }
    case GgufValueType::kFloat64: {
      RETURN_IF_ERROR(r.Need(count * 8, what));
      value->floats.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        double f;
        RETURN_IF_ERROR(r.Read(&f, what));
        value->floats.push_back(f);
      }
      return absl::OkStatus();
    }
    case GgufValueType::kBool: {
      RETURN_IF_ERROR(r.Need(count, what));
      value->bools.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        uint8_t b;
        RETURN_IF_ERROR(r.Read(&b, what));
        value->bools.push_back(b != 0 ? 1 : 0);
      }
      return absl::OkStatus();
    }
    case GgufValueType::kString: {
      RETURN_IF_ERROR(r.Need(count * 8, what));  // each string has at least its u64 length
      value->strings.reserve(count);
      for (uint64_t i = 0; i < count; ++i) {
        std::string s;
        RETURN_IF_ERROR(r.ReadString(&s, what));
        value->strings.push_back(std::move(s));
      }
      return absl::OkStatus();
    }
    default:
      return absl::InternalError("ReadElems: unexpected type");
  }
}

uint64_t AlignUp(uint64_t x, uint64_t a) { return x + (a - x % a) % a; }

absl::Status TypeMismatch(absl::string_view key, const GgufValue& v, absl::string_view want) {
  std::string seen = std::string(GgufValueTypeName(v.type));
  if (v.is_array()) absl::StrAppend(&seen, " of ", GgufValueTypeName(v.array_type));
  return absl::InvalidArgumentError(absl::StrCat("GGUF key '", key, "' holds ", seen, ", expected ",
                                                 want, "; use the getter for the stored type"));
}

absl::Status CheckU64Fits(absl::string_view key, const GgufValue& v) {
  if (v.elem_type() != GgufValueType::kUint64) return absl::OkStatus();
  for (int64_t x : v.ints) {
    if (x < 0) {
      return absl::InvalidArgumentError(absl::StrCat("GGUF key '", key, "' holds the UINT64 value ",
                                                     static_cast<uint64_t>(x),
                                                     " which does not fit int64"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "UINT8";
    case GgufValueType::kInt8:
      return "INT8";
    case GgufValueType::kUint16:
      return "UINT16";
    case GgufValueType::kInt16:
      return "INT16";
    case GgufValueType::kUint32:
      return "UINT32";
    case GgufValueType::kInt32:
      return "INT32";
    case GgufValueType::kFloat32:
      return "FLOAT32";
    case GgufValueType::kBool:
      return "BOOL";
    case GgufValueType::kString:
      return "STRING";
    case GgufValueType::kArray:
      return "ARRAY";
    case GgufValueType::kUint64:
      return "UINT64";
    case GgufValueType::kInt64:
      return "INT64";
    case GgufValueType::kFloat64:
      return "FLOAT64";
  }
  return "UNKNOWN";
}

size_t GgufValue::size() const {
  switch (elem_type()) {
    case GgufValueType::kFloat32:
    case GgufValueType::kFloat64:
      return floats.size();
    case GgufValueType::kBool:
      return bools.size();
    case GgufValueType::kString:
      return strings.size();
    default:
      return ints.size();
  }
}

std::vector<int64_t> GgufTensorInfo::TorchShape() const {
  return std::vector<int64_t>(ne.rbegin(), ne.rend());
}

int64_t GgufTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;  // overflow excluded by Open
  return n;
}

int64_t GgufTensorInfo::num_rows() const {
  const int64_t len = row_length();
  return len == 0 ? 0 : numel() / len;
}

absl::StatusOr<GgufFile> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  return Parse(std::move(mapped), path);
}

absl::StatusOr<GgufFile> GgufFile::FromBytes(std::vector<uint8_t> bytes, const std::string& name) {
  return Parse(MappedFile::FromBytes(std::move(bytes)), name);
}

namespace {

// The header: magic, version (2 or 3, little-endian), tensor and metadata counts, each count
// bounded by the bytes left. Errors: kInvalidArgument (not GGUF, big-endian), kUnimplemented
// (version), kDataLoss (counts), naming the file.
absl::Status ReadHeader(Reader& r, const std::string& name, uint64_t size, uint32_t* version_out,
                        uint64_t* n_tensors_out, uint64_t* n_kv_out) {
  char magic[4];
  RETURN_IF_ERROR(r.Read(&magic, "magic"));
  if (std::memcmp(magic, "GGUF", 4) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a GGUF file: first 4 bytes are ",
                     absl::StrFormat("%02x %02x %02x %02x", static_cast<uint8_t>(magic[0]),
                                     static_cast<uint8_t>(magic[1]), static_cast<uint8_t>(magic[2]),
                                     static_cast<uint8_t>(magic[3])),
                     ", expected 47 47 55 46 (\"GGUF\"); pass a .gguf model file"));
  }
  uint32_t version = 0;
  RETURN_IF_ERROR(r.Read(&version, "version"));
  if ((version & 0xffffu) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF file '", name, "': version field reads 0x", absl::Hex(version, absl::kZeroPad8),
        " (low 16 bits zero): the file is big-endian, only little-endian GGUF is supported; "
        "re-convert it without --bigendian"));
  }
  if (version < 2 || version > 3) {
    return absl::UnimplementedError(absl::StrCat(
        "GGUF file '", name, "' has version ", version,
        ", only versions 2 and 3 are supported; re-convert it with a current llama.cpp"));
  }
  *version_out = version;
  uint64_t n_tensors = 0, n_kv = 0;
  RETURN_IF_ERROR(r.Read(&n_tensors, "tensor count"));
  RETURN_IF_ERROR(r.Read(&n_kv, "metadata key/value count"));
  if (n_kv > r.left() / kMinKvBytes) {
    return absl::DataLossError(absl::StrCat(
        "GGUF file '", name, "': metadata count ", n_kv, " needs at least ", kMinKvBytes,
        " bytes each, but only ", r.left(), " bytes are left after the header of the ", size,
        "-byte file; the header is corrupt or the file is truncated"));
  }
  if (n_tensors > r.left() / kMinTensorInfoBytes) {
    return absl::DataLossError(absl::StrCat(
        "GGUF file '", name, "': tensor count ", n_tensors, " needs at least ", kMinTensorInfoBytes,
        " bytes each, but only ", r.left(), " bytes are left after the header of the ", size,
        "-byte file; the header is corrupt or the file is truncated"));
  }

  *n_tensors_out = n_tensors;
  *n_kv_out = n_kv;
  return absl::OkStatus();
}

// The typed value of metadata key `key` (a scalar, a string or an array of them). Errors:
// kDataLoss naming the file and the key (unknown type, nested array, a length past the end).
absl::StatusOr<GgufValue> ReadValue(Reader& r, const std::string& key, const std::string& name,
                                    uint64_t size) {
  const std::string what = absl::StrCat("value of metadata key '", key, "'");
  uint32_t type_id = 0;
  RETURN_IF_ERROR(r.Read(&type_id, absl::StrCat("type of metadata key '", key, "'")));
  if (!IsKnownValueType(type_id)) {
    return absl::DataLossError(absl::StrCat("GGUF file '", name, "': metadata key '", key,
                                            "' has value type ", type_id,
                                            ", expected 0..12; the file is corrupt"));
  }
  GgufValue value;
  value.type = static_cast<GgufValueType>(type_id);
  if (value.type == GgufValueType::kArray) {
    uint32_t elem_id = 0;
    uint64_t count = 0;
    RETURN_IF_ERROR(r.Read(&elem_id, absl::StrCat("array type of '", key, "'")));
    if (!IsKnownValueType(elem_id) ||
        static_cast<GgufValueType>(elem_id) == GgufValueType::kArray) {
      return absl::DataLossError(absl::StrCat(
          "GGUF file '", name, "': array '", key, "' has element type ", elem_id,
          ", expected a scalar or string type 0..8, 10..12 (nested arrays are not allowed)"));
    }
    value.array_type = static_cast<GgufValueType>(elem_id);
    RETURN_IF_ERROR(r.Read(&count, absl::StrCat("array length of '", key, "'")));
    const uint64_t min_elem =
        value.array_type == GgufValueType::kString ? 8 : ScalarSize(value.array_type);
    if (count > r.left() / min_elem) {
      return absl::DataLossError(absl::StrCat(
          "GGUF file '", name, "': array '", key, "' claims ", count, " elements of ",
          GgufValueTypeName(value.array_type), " but only ", r.left(), " bytes are left in the ",
          size, "-byte file; the file is corrupt or truncated"));
    }
    RETURN_IF_ERROR(ReadElems(r, value.array_type, count, &value, what));
  } else {
    RETURN_IF_ERROR(ReadElems(r, value.type, 1, &value, what));
  }
  return value;
}

// Tensor info #i: name, dimensions, ggml type, byte size and data offset, each bounded.
// Errors: kDataLoss naming the file and the tensor, kUnimplemented for an unknown ggml type.
absl::StatusOr<GgufTensorInfo> ReadTensorInfo(
    Reader& r, uint64_t i, const std::string& name, uint32_t alignment,
    const absl::flat_hash_map<std::string, size_t>& seen) {
  GgufTensorInfo t;
  RETURN_IF_ERROR(r.ReadString(&t.name, absl::StrCat("name of tensor #", i)));
  if (t.name.empty() || t.name.size() > kMaxNameBytes) {
    return absl::DataLossError(absl::StrCat("GGUF file '", name, "': tensor #", i, " name has ",
                                            t.name.size(), " bytes, expected 1..", kMaxNameBytes));
  }
  if (seen.contains(t.name)) {
    return absl::DataLossError(absl::StrCat("GGUF file '", name, "': duplicate tensor name '",
                                            t.name, "'; names must be unique"));
  }
  uint32_t n_dims = 0;
  RETURN_IF_ERROR(r.Read(&n_dims, absl::StrCat("n_dims of tensor '", t.name, "'")));
  if (n_dims > kMaxDims) {
    return absl::DataLossError(absl::StrCat("GGUF file '", name, "': tensor '", t.name,
                                            "' has n_dims ", n_dims, ", expected <= ", kMaxDims));
  }
  int64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    int64_t ne = 0;
    RETURN_IF_ERROR(r.Read(&ne, absl::StrCat("ne[", d, "] of tensor '", t.name, "'")));
    if (ne < 0) {
      return absl::DataLossError(absl::StrCat("GGUF file '", name, "': tensor '", t.name,
                                              "' has ne[", d, "] = ", ne, ", expected >= 0"));
    }
    if (ne != 0 && numel > std::numeric_limits<int64_t>::max() / ne) {
      return absl::DataLossError(absl::StrCat("GGUF file '", name, "': tensor '", t.name,
                                              "' element count overflows int64 at ne[", d,
                                              "] = ", ne));
    }
    numel *= ne;
    t.ne.push_back(ne);
  }
  uint32_t type_id = 0;
  RETURN_IF_ERROR(r.Read(&type_id, absl::StrCat("type of tensor '", t.name, "'")));
  if (!IsKnownGgmlType(type_id)) {
    return absl::UnimplementedError(absl::StrCat(
        "GGUF file '", name, "': tensor '", t.name, "' has ggml type id ", type_id,
        ", which this reader does not know (known: 0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 6 Q5_0, "
        "7 Q5_1, 8 Q8_0, 10-15 Q2_K..Q8_K, 30 BF16); requantise the model to a known type"));
  }
  t.type = static_cast<GgmlType>(type_id);
  const int64_t block = GgmlBlockSize(t.type);
  const int64_t ne0 = t.row_length();
  if (ne0 % block != 0) {
    return absl::DataLossError(absl::StrCat(
        "GGUF file '", name, "': tensor '", t.name, "' has ne[0] = ", ne0,
        ", which is not a multiple of the ", GgmlTypeName(t.type), " block size ", block));
  }
  // nbytes = numel / block * type_size; bound it before multiplying.
  const uint64_t nblocks = static_cast<uint64_t>(numel / block);
  const uint64_t tsize = static_cast<uint64_t>(GgmlTypeSize(t.type));
  if (nblocks > std::numeric_limits<uint64_t>::max() / 2 / tsize) {
    return absl::DataLossError(absl::StrCat("GGUF file '", name, "': tensor '", t.name,
                                            "' byte size overflows (", numel, " elements of ",
                                            GgmlTypeName(t.type), ")"));
  }
  t.nbytes = nblocks * tsize;
  RETURN_IF_ERROR(r.Read(&t.offset, absl::StrCat("offset of tensor '", t.name, "'")));
  if (t.offset % alignment != 0) {
    return absl::DataLossError(
        absl::StrCat("GGUF file '", name, "': tensor '", t.name, "' has data offset ", t.offset,
                     ", which is not a multiple of the alignment ", alignment));
  }
  if (t.offset > std::numeric_limits<uint64_t>::max() / 2) {
    return absl::DataLossError(absl::StrCat("GGUF file '", name, "': tensor '", t.name,
                                            "' has absurd data offset ", t.offset));
  }
  return t;
}

// The data section: tensors do not overlap and end inside the file. Errors: kDataLoss.
absl::Status CheckDataSection(const std::vector<GgufTensorInfo>& tensors, uint64_t data_start,
                              uint64_t size, const std::string& name) {
  uint64_t data_end = 0;  // relative
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const GgufTensorInfo& t : tensors) {
    by_offset.push_back(&t);
    data_end = std::max(data_end, t.offset + t.nbytes);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& prev = *by_offset[i - 1];
    if (prev.offset + prev.nbytes > by_offset[i]->offset) {
      return absl::DataLossError(
          absl::StrCat("GGUF file '", name, "': tensor '", prev.name, "' (bytes ", prev.offset,
                       "..", prev.offset + prev.nbytes, " of the data section) overlaps tensor '",
                       by_offset[i]->name, "' at offset ", by_offset[i]->offset));
    }
  }
  if (!tensors.empty()) {
    const uint64_t need = data_start + data_end;
    if (need > size) {
      return absl::DataLossError(absl::StrCat(
          "GGUF file '", name, "' is truncated: its tensor data ends at byte ", need,
          " (data section starts at ", data_start, "), so the file should be at least ", need,
          " bytes, but it is ", size, " bytes; re-download or re-convert the file"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GgufFile> GgufFile::Parse(MappedFile file, const std::string& name) {
  GgufFile g;
  g.file_ = std::move(file);
  g.name_ = name;
  const uint64_t size = g.file_.size();
  Reader r(g.file_.data(), size, g.name_);
  uint64_t n_tensors = 0, n_kv = 0;
  RETURN_IF_ERROR(ReadHeader(r, name, size, &g.version_, &n_tensors, &n_kv));

  // ---- key/value metadata ----
  g.key_order_.reserve(n_kv);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key;
    RETURN_IF_ERROR(r.ReadString(&key, absl::StrCat("metadata key #", i)));
    if (key.empty()) {
      return absl::DataLossError(absl::StrCat("GGUF file '", name, "': metadata key #", i,
                                              " is empty; the file is corrupt"));
    }
    if (g.kv_.contains(key)) {
      return absl::DataLossError(absl::StrCat("GGUF file '", name, "': duplicate metadata key '",
                                              key, "'; keys must be unique"));
    }
    ASSIGN_OR_RETURN(GgufValue value, ReadValue(r, key, name, size));
    g.key_order_.push_back(key);
    g.kv_.emplace(std::move(key), std::move(value));
  }

  if (const GgufValue* a = g.FindKey("general.alignment"); a != nullptr) {
    if (a->type != GgufValueType::kUint32 || a->ints.size() != 1 || a->ints[0] == 0 ||
        (a->ints[0] & (a->ints[0] - 1)) != 0) {
      return absl::DataLossError(absl::StrCat(
          "GGUF file '", name, "': general.alignment must be a UINT32 power of two, got ",
          GgufValueTypeName(a->type), a->ints.size() == 1 ? absl::StrCat(" ", a->ints[0]) : "",
          "; fix the writer"));
    }
    g.alignment_ = static_cast<uint32_t>(a->ints[0]);
  } else {
    g.alignment_ = kDefaultAlignment;
  }

  // ---- tensor infos ----
  g.tensors_.reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    ASSIGN_OR_RETURN(GgufTensorInfo t, ReadTensorInfo(r, i, name, g.alignment_, g.tensor_index_));
    g.tensor_index_.emplace(t.name, g.tensors_.size());
    g.tensors_.push_back(std::move(t));
  }

  // ---- data section ----
  g.data_start_ = AlignUp(r.pos(), g.alignment_);
  RETURN_IF_ERROR(CheckDataSection(g.tensors_, g.data_start_, size, name));
  return g;
}

const GgufTensorInfo* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::FindKey(absl::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
absl::Status MissingKey(absl::string_view file, absl::string_view key) {
  return absl::NotFoundError(
      absl::StrCat("GGUF file '", file, "' has no metadata key '", key, "'"));
}
}  // namespace

absl::StatusOr<int64_t> GgufFile::GetInt(absl::string_view key) const {
  const GgufValue* v = FindKey(key);
  if (v == nullptr) return MissingKey(name_, key);
  if (v->is_array() || !IsIntegerType(v->type)) return TypeMismatch(key, *v, "an integer");
  RETURN_IF_ERROR(CheckU64Fits(key, *v));
  return v->ints[0];
}

absl::StatusOr<double> GgufFile::GetFloat(absl::string_view key) const {
  const GgufValue* v = FindKey(key);
  if (v == nullptr) return MissingKey(name_, key);
  if (v->type != GgufValueType::kFloat32 && v->type != GgufValueType::kFloat64) {
    return TypeMismatch(key, *v, "FLOAT32 or FLOAT64");
  }
  return v->floats[0];
}

absl::StatusOr<std::string> GgufFile::GetString(absl::string_view key) const {
  const GgufValue* v = FindKey(key);
  if (v == nullptr) return MissingKey(name_, key);
  if (v->type != GgufValueType::kString) return TypeMismatch(key, *v, "STRING");
  return v->strings[0];
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  const GgufValue* v = FindKey(key);
  if (v == nullptr) return MissingKey(name_, key);
  if (v->type != GgufValueType::kBool) return TypeMismatch(key, *v, "BOOL");
  return v->bools[0] != 0;
}

absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(absl::string_view key) const {
  const GgufValue* v = FindKey(key);
  if (v == nullptr) return MissingKey(name_, key);
  if (!v->is_array() || v->array_type != GgufValueType::kString) {
    return TypeMismatch(key, *v, "ARRAY of STRING");
  }
  return v->strings;
}

absl::StatusOr<std::vector<int64_t>> GgufFile::GetIntArray(absl::string_view key) const {
  const GgufValue* v = FindKey(key);
  if (v == nullptr) return MissingKey(name_, key);
  if (!v->is_array() || !IsIntegerType(v->array_type)) {
    return TypeMismatch(key, *v, "ARRAY of an integer type");
  }
  RETURN_IF_ERROR(CheckU64Fits(key, *v));
  return v->ints;
}

absl::StatusOr<std::vector<double>> GgufFile::GetFloatArray(absl::string_view key) const {
  const GgufValue* v = FindKey(key);
  if (v == nullptr) return MissingKey(name_, key);
  if (!v->is_array() ||
      (v->array_type != GgufValueType::kFloat32 && v->array_type != GgufValueType::kFloat64)) {
    return TypeMismatch(key, *v, "ARRAY of FLOAT32 or FLOAT64");
  }
  return v->floats;
}

absl::Span<const uint8_t> GgufFile::TensorData(const GgufTensorInfo& info) const {
  return absl::Span<const uint8_t>(file_.data() + data_start_ + info.offset,
                                   static_cast<size_t>(info.nbytes));
}

absl::StatusOr<std::vector<float>> GgufFile::ReadTensorF32(absl::string_view name) const {
  const GgufTensorInfo* t = FindTensor(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("GGUF file '", name_, "' has no tensor '", name, "'"));
  }
  return ReadRowsF32(name, 0, t->num_rows());
}

absl::StatusOr<std::vector<float>> GgufFile::ReadRowsF32(absl::string_view name, int64_t row_begin,
                                                         int64_t row_count) const {
  const GgufTensorInfo* t = FindTensor(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat("GGUF file '", name_, "' has no tensor '", name, "'"));
  }
  const int64_t rows = t->num_rows();
  if (row_begin < 0 || row_count < 0 || row_begin > rows || row_count > rows - row_begin) {
    return absl::OutOfRangeError(absl::StrCat("rows [", row_begin, ", ", row_begin, "+", row_count,
                                              ") are outside tensor '", name, "' with ", rows,
                                              " rows"));
  }
  if (!CanDequantize(t->type)) {
    return absl::UnimplementedError(absl::StrCat(
        "tensor '", name, "' has ggml type ", GgmlTypeName(t->type),
        ", which cannot be dequantised (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
        "Q8_0, Q4_K, Q5_K, Q6_K)"));
  }
  const int64_t ne0 = t->row_length();
  ASSIGN_OR_RETURN(const uint64_t row_bytes, GgmlRowBytes(t->type, ne0));
  std::vector<float> out(static_cast<size_t>(row_count * ne0));
  if (out.empty()) return out;
  const uint8_t* base = TensorData(*t).data() + static_cast<uint64_t>(row_begin) * row_bytes;
  // Each row is independent; DequantizeRow cannot fail here (sizes were validated at Open),
  // but keep the first error anyway.
  std::atomic<bool> failed{false};
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, row_count, 16), [&](const tbb::blocked_range<int64_t>& range) {
        for (int64_t i = range.begin(); i != range.end(); ++i) {
          absl::Status s = DequantizeRow(t->type, base + static_cast<uint64_t>(i) * row_bytes,
                                         row_bytes, ne0, out.data() + i * ne0);
          if (!s.ok()) failed.store(true);
        }
      });
  if (failed.load()) {
    return absl::InternalError(absl::StrCat("dequantising tensor '", name, "' failed"));
  }
  return out;
}

}  // namespace lspo::model
