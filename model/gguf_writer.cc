#include "model/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "runtime/file_io.h"
#include "runtime/float16.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

constexpr uint32_t kAlignment = 32;  // ggml GGUF_DEFAULT_ALIGNMENT
constexpr uint32_t kVersion = 3;

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

void PutU32(std::string* out, uint32_t v) {
  char b[4];
  std::memcpy(b, &v, 4);  // little-endian hosts only (the reader checks the same)
  out->append(b, 4);
}
void PutU64(std::string* out, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  out->append(b, 8);
}
void PutString(std::string* out, absl::string_view s) {
  PutU64(out, s.size());
  out->append(s.data(), s.size());
}

// One element of `v` of type `type` at index i.
void PutElement(std::string* out, const GgufValue& v, GgufValueType type, size_t i) {
  switch (type) {
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
      PutU32(out, static_cast<uint32_t>(v.ints[i]));
      break;
    case GgufValueType::kFloat32: {
      const float f = static_cast<float>(v.floats[i]);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      PutU32(out, u);
      break;
    }
    case GgufValueType::kBool:
      out->push_back(static_cast<char>(v.bools[i] ? 1 : 0));
      break;
    case GgufValueType::kString:
      PutString(out, v.strings[i]);
      break;
    default:  // the setters make no other type
      break;
  }
}

}  // namespace

bool CanEncode(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16 ||
         type == GgmlType::kQ8_0;
}

absl::Status EncodeRow(GgmlType type, const float* src, int64_t n, uint8_t* dst, size_t dst_bytes) {
  if (!CanEncode(type)) {
    return absl::UnimplementedError(absl::StrCat("cannot encode ggml type ", GgmlTypeName(type),
                                                 "; F32, F16, BF16 and Q8_0 are written"));
  }
  ASSIGN_OR_RETURN(uint64_t need, GgmlRowBytes(type, n));
  if (dst_bytes < need) {
    return absl::InvalidArgumentError(absl::StrCat("EncodeRow: ", n, " ", GgmlTypeName(type),
                                                   " elements need ", need, " bytes, got ",
                                                   dst_bytes));
  }
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      break;
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = runtime::Fp32ToFp16(src[i]);
        std::memcpy(dst + 2 * i, &h, 2);
      }
      break;
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t b = runtime::Fp32ToBf16(src[i]);
        std::memcpy(dst + 2 * i, &b, 2);
      }
      break;
    case GgmlType::kQ8_0:
      for (int64_t b = 0; b < n / 32; ++b) {
        const float* x = src + b * 32;
        uint8_t* block = dst + b * 34;
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t dh = runtime::Fp32ToFp16(d);
        std::memcpy(block, &dh, 2);
        for (int j = 0; j < 32; ++j) {
          block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::round(x[j] * id)));
        }
      }
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

void GgufWriter::Set(absl::string_view key, GgufValue value) {
  for (auto& [k, v] : kv_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  kv_.emplace_back(std::string(key), std::move(value));
}

void GgufWriter::SetString(absl::string_view key, std::string value) {
  GgufValue v;
  v.type = GgufValueType::kString;
  v.strings.push_back(std::move(value));
  Set(key, std::move(v));
}
void GgufWriter::SetUint32(absl::string_view key, uint32_t value) {
  GgufValue v;
  v.type = GgufValueType::kUint32;
  v.ints.push_back(value);
  Set(key, std::move(v));
}
void GgufWriter::SetInt32(absl::string_view key, int32_t value) {
  GgufValue v;
  v.type = GgufValueType::kInt32;
  v.ints.push_back(value);
  Set(key, std::move(v));
}
void GgufWriter::SetFloat32(absl::string_view key, float value) {
  GgufValue v;
  v.type = GgufValueType::kFloat32;
  v.floats.push_back(value);
  Set(key, std::move(v));
}
void GgufWriter::SetBool(absl::string_view key, bool value) {
  GgufValue v;
  v.type = GgufValueType::kBool;
  v.bools.push_back(value ? 1 : 0);
  Set(key, std::move(v));
}
void GgufWriter::SetStringArray(absl::string_view key, std::vector<std::string> values) {
  GgufValue v;
  v.type = GgufValueType::kArray;
  v.array_type = GgufValueType::kString;
  v.strings = std::move(values);
  Set(key, std::move(v));
}
void GgufWriter::SetInt32Array(absl::string_view key, std::vector<int32_t> values) {
  GgufValue v;
  v.type = GgufValueType::kArray;
  v.array_type = GgufValueType::kInt32;
  v.ints.assign(values.begin(), values.end());
  Set(key, std::move(v));
}
void GgufWriter::SetFloat32Array(absl::string_view key, std::vector<float> values) {
  GgufValue v;
  v.type = GgufValueType::kArray;
  v.array_type = GgufValueType::kFloat32;
  v.floats.assign(values.begin(), values.end());
  Set(key, std::move(v));
}

absl::Status GgufWriter::AddTensor(const std::string& name, std::vector<int64_t> torch_shape,
                                   GgmlType type) {
  if (name.empty() || name.size() >= 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor name '", name, "' must be 1 to 63 bytes long"));
  }
  if (tensor_names_.contains(name)) {
    return absl::InvalidArgumentError(absl::StrCat("GGUF tensor '", name, "' added twice"));
  }
  if (torch_shape.empty() || torch_shape.size() > 4 ||
      std::any_of(torch_shape.begin(), torch_shape.end(), [](int64_t d) { return d < 1; })) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF tensor '", name, "': the shape needs 1 to 4 dimensions, each at least 1"));
  }
  if (!CanEncode(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("GGUF tensor '", name, "': type ", GgmlTypeName(type), " cannot be written"));
  }
  const int64_t row = torch_shape.back();
  auto row_bytes = GgmlRowBytes(type, row);
  if (!row_bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GGUF tensor '", name, "': rows of ", row, " elements are not a whole number of ",
        GgmlTypeName(type), " blocks of ", GgmlBlockSize(type)));
  }
  uint64_t rows = 1;
  for (size_t i = 0; i + 1 < torch_shape.size(); ++i) rows *= static_cast<uint64_t>(torch_shape[i]);
  Tensor t{name, std::move(torch_shape), type};
  t.offset = AlignUp(data_bytes_, kAlignment);
  t.nbytes = rows * *row_bytes;
  data_bytes_ = t.offset + t.nbytes;
  tensor_names_.insert(name);
  tensors_.push_back(std::move(t));
  return absl::OkStatus();
}

std::string GgufWriter::HeaderBytes() const {
  std::string out;
  out.append("GGUF", 4);
  PutU32(&out, kVersion);
  PutU64(&out, tensors_.size());
  PutU64(&out, kv_.size());
  for (const auto& [key, v] : kv_) {
    PutString(&out, key);
    PutU32(&out, static_cast<uint32_t>(v.type));
    if (v.is_array()) {
      PutU32(&out, static_cast<uint32_t>(v.array_type));
      PutU64(&out, v.size());
      for (size_t i = 0; i < v.size(); ++i) PutElement(&out, v, v.array_type, i);
    } else {
      PutElement(&out, v, v.type, 0);
    }
  }
  for (const Tensor& t : tensors_) {
    PutString(&out, t.name);
    PutU32(&out, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) {
      PutU64(&out, static_cast<uint64_t>(*it));
    }
    PutU32(&out, static_cast<uint32_t>(t.type));
    PutU64(&out, t.offset);
  }
  out.resize(AlignUp(out.size(), kAlignment), '\0');
  return out;
}

namespace {

// Writes all of `data` to fd, retrying short writes.
absl::Status WriteAll(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return runtime::FileErrnoStatus("write", path, errno);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GgufWriter::WriteFile(const std::string& path, const GgufTensorValues& values) const {
  const std::string tmp = path + ".partial";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return runtime::FileErrnoStatus("create", tmp, errno);
  absl::Status st = [&]() -> absl::Status {
    const std::string header = HeaderBytes();
    RETURN_IF_ERROR(WriteAll(fd, header.data(), header.size(), tmp));
    uint64_t written = 0;  // bytes of the data section so far
    std::vector<float> v;
    std::string bytes;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const Tensor& t = tensors_[i];
      v.clear();
      absl::Status got = values(i, &v);
      if (!got.ok()) {
        return absl::Status(got.code(), absl::StrCat("tensor '", t.name, "': ", got.message()));
      }
      int64_t numel = 1;
      for (int64_t d : t.shape) numel *= d;
      if (static_cast<int64_t>(v.size()) != numel) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", v.size(),
                                                       " values given for ", numel, " elements"));
      }
      bytes.assign(t.offset - written, '\0');  // alignment padding before this tensor
      const size_t pad = bytes.size();
      bytes.resize(pad + t.nbytes);
      const int64_t row = t.shape.back();
      ASSIGN_OR_RETURN(uint64_t row_bytes, GgmlRowBytes(t.type, row));
      for (int64_t r = 0; r < numel / row; ++r) {
        RETURN_IF_ERROR(EncodeRow(t.type, v.data() + r * row, row,
                                  reinterpret_cast<uint8_t*>(bytes.data()) + pad + r * row_bytes,
                                  row_bytes));
      }
      RETURN_IF_ERROR(WriteAll(fd, bytes.data(), bytes.size(), tmp));
      written = t.offset + t.nbytes;
    }
    if (::fsync(fd) != 0) return runtime::FileErrnoStatus("fsync", tmp, errno);
    return absl::OkStatus();
  }();
  if (::close(fd) != 0 && st.ok()) st = runtime::FileErrnoStatus("close", tmp, errno);
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    st = runtime::FileErrnoStatus("rename", tmp + " -> " + path, errno);
  }
  if (!st.ok()) {
    std::remove(tmp.c_str());
    return st;
  }
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return runtime::FsyncDir(parent.empty() ? "." : parent);
}

}  // namespace lspo::model
