#include "model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/float16.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

using OrderedJson = nlohmann::ordered_json;

// numel of `shape` into *numel; false if a dim is negative or the product overflows.
bool ShapeNumel(const std::vector<int64_t>& shape, int64_t* numel) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return false;
    n *= d;
  }
  *numel = n;
  return true;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// Writes all of [p, p+n) to fd, retrying on EINTR / short writes.
absl::Status WriteAll(int fd, const void* p, size_t n, const std::string& path) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      return absl::ErrnoToStatus(err, absl::StrCat("writing '", path, "' failed"));
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open directory '", dir, "' to fsync"));
  }
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return absl::ErrnoToStatus(err, absl::StrCat("fsync of '", dir, "' failed"));
  return absl::OkStatus();
}

absl::Status Corrupt(const std::string& file, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("safetensors file '", file, "': ", what,
                                          "; the file is corrupt or truncated, rewrite it"));
}

}  // namespace

int64_t SafetensorsDtypeSize(absl::string_view dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated at Open
  return n;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<SafetensorsEntry>& entries,
                              const std::map<std::string, std::string>& metadata) {
  // ---- validate and build the header ----
  OrderedJson header = OrderedJson::object();
  OrderedJson meta = OrderedJson::object();
  for (const auto& [k, v] : metadata) {
    if (k == "format" && v != "pt") {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteSafetensors('", path, "'): metadata format='", v,
                       "', expected 'pt' (transformers rejects other values); drop the key"));
    }
    meta[k] = v;
  }
  meta["format"] = "pt";
  header["__metadata__"] = std::move(meta);
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const SafetensorsEntry& e : entries) {
    const std::string where = absl::StrCat("WriteSafetensors('", path, "'): tensor '", e.name, "'");
    if (e.name.empty() || e.name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": invalid name; use a parameter name"));
    }
    if (!seen.insert(e.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": duplicate name"));
    }
    const int64_t esize = SafetensorsDtypeSize(e.dtype);
    if (esize == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": unsupported dtype '", e.dtype,
                       "', expected one of F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL"));
    }
    int64_t numel = 0;
    if (!ShapeNumel(e.shape, &numel) ||
        (numel != 0 && static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / 2 /
                                                          static_cast<uint64_t>(esize))) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": invalid shape ", ShapeString(e.shape), " (negative or overflowing)"));
    }
    const uint64_t nbytes = static_cast<uint64_t>(numel) * static_cast<uint64_t>(esize);
    if (nbytes != e.nbytes) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": shape ", ShapeString(e.shape),
                                                     " of ", e.dtype, " needs ", nbytes,
                                                     " bytes, but nbytes = ", e.nbytes));
    }
    if (nbytes > 0 && e.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": data is null"));
    }
    OrderedJson t = OrderedJson::object();
    t["dtype"] = e.dtype;
    t["shape"] = e.shape;
    t["data_offsets"] = {offset, offset + nbytes};
    header[e.name] = std::move(t);
    offset += nbytes;
  }
  std::string json;
  try {
    json = header.dump();
  } catch (const nlohmann::json::exception& ex) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteSafetensors('", path, "'): header is not valid UTF-8: ", ex.what()));
  }
  json.append((8 - json.size() % 8) % 8, ' ');
  const uint64_t n = json.size();
  uint8_t len_le[8];
  for (int i = 0; i < 8; ++i) len_le[i] = static_cast<uint8_t>(n >> (8 * i));

  // ---- write tmp, fsync, rename, fsync dir ----
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot create '", tmp,
                                                 "'; check that the directory exists and is "
                                                 "writable"));
  }
  absl::Status s = WriteAll(fd, len_le, 8, tmp);
  if (s.ok()) s = WriteAll(fd, json.data(), json.size(), tmp);
  for (size_t i = 0; s.ok() && i < entries.size(); ++i) {
    s = WriteAll(fd, entries[i].data, entries[i].nbytes, tmp);
  }
  if (s.ok() && ::fsync(fd) != 0) {
    const int err = errno;
    s = absl::ErrnoToStatus(err, absl::StrCat("fsync of '", tmp, "' failed"));
  }
  if (::close(fd) != 0 && s.ok()) {
    const int err = errno;
    s = absl::ErrnoToStatus(err, absl::StrCat("close of '", tmp, "' failed"));
  }
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    s = absl::ErrnoToStatus(err, absl::StrCat("cannot rename '", tmp, "' to '", path, "'"));
  }
  if (!s.ok()) {
    ::unlink(tmp.c_str());
    return s;
  }
  return FsyncDir(path);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::Open(path));
  return Parse(std::move(mapped), path);
}

// One tensor's header entry `v` (named `key`) of safetensors file `name` (`size` bytes, its
// data section from byte `data_start`, `data_size` bytes long): dtype, shape and data offsets,
// checked against each other and the data section. Errors: kDataLoss (Corrupt) naming the
// tensor and the field; kUnimplemented for a dtype this reader does not support.
static absl::StatusOr<SafetensorsTensorInfo> ParseTensorEntry(const std::string& name,
                                                              const std::string& key,
                                                              const nlohmann::json& v,
                                                              uint64_t data_size,
                                                              uint64_t data_start, uint64_t size) {
  const std::string where = absl::StrCat("tensor '", key, "'");
  if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") ||
      !v.contains("data_offsets")) {
    return Corrupt(name, absl::StrCat(where,
                                      " needs an object with dtype, shape and "
                                      "data_offsets"));
  }
  SafetensorsTensorInfo t;
  t.name = key;
  const nlohmann::json& dt = v["dtype"];
  if (!dt.is_string()) return Corrupt(name, absl::StrCat(where, ": dtype is not a string"));
  t.dtype = dt.get<std::string>();
  const int64_t esize = SafetensorsDtypeSize(t.dtype);
  if (esize == 0) {
    return absl::UnimplementedError(absl::StrCat(
        "safetensors file '", name, "': ", where, " has dtype '", t.dtype,
        "', which this reader does not support (F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL); "
        "convert the checkpoint"));
  }
  const nlohmann::json& sh = v["shape"];
  if (!sh.is_array()) return Corrupt(name, absl::StrCat(where, ": shape is not an array"));
  for (const nlohmann::json& d : sh) {
    if (!d.is_number_unsigned() ||
        d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return Corrupt(name, absl::StrCat(where, ": shape ", sh.dump(),
                                        " has an entry that is not a non-negative integer"));
    }
    t.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  const nlohmann::json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned()) {
    return Corrupt(name, absl::StrCat(where, ": data_offsets ", off.dump(),
                                      " is not [begin, end] of non-negative integers"));
  }
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  int64_t numel = 0;
  if (!ShapeNumel(t.shape, &numel) ||
      (numel != 0 && static_cast<uint64_t>(numel) >
                         std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(esize))) {
    return Corrupt(name, absl::StrCat(where, ": shape ", ShapeString(t.shape), " overflows"));
  }
  const uint64_t nbytes = static_cast<uint64_t>(numel) * static_cast<uint64_t>(esize);
  if (t.begin > t.end || t.end - t.begin != nbytes) {
    return Corrupt(
        name, absl::StrCat(where, ": data_offsets [", t.begin, ", ", t.end, "] do not span ",
                           nbytes, " bytes (shape ", ShapeString(t.shape), " of ", t.dtype, ")"));
  }
  if (t.end > data_size) {
    return Corrupt(name, absl::StrCat(where, ": data ends at byte ", t.end,
                                      " of the data section, which has only ", data_size,
                                      " bytes (file should be at least ", data_start + t.end,
                                      " bytes, is ", size, ")"));
  }
  return t;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(std::vector<uint8_t> bytes,
                                                           const std::string& name) {
  return Parse(MappedFile::FromBytes(std::move(bytes)), name);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(MappedFile file, const std::string& name) {
  SafetensorsFile f;
  f.file_ = std::move(file);
  f.name_ = name;
  const uint64_t size = f.file_.size();
  const uint8_t* p = f.file_.data();
  if (size < 8) {
    return Corrupt(
        name, absl::StrCat("file is ", size, " bytes, expected at least 8 (the header length)"));
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(p[i]) << (8 * i);
  if (n > kSafetensorsMaxHeaderBytes) {
    return Corrupt(name, absl::StrCat("header length ", n, " exceeds the limit of ",
                                      kSafetensorsMaxHeaderBytes, " bytes"));
  }
  if (n > size - 8) {
    return Corrupt(name, absl::StrCat("header length ", n, " needs a file of at least ", 8 + n,
                                      " bytes, but it is ", size, " bytes"));
  }
  f.data_start_ = 8 + n;
  const uint64_t data_size = size - f.data_start_;

  // Parse, rejecting duplicate top-level keys (nlohmann would keep the last silently).
  std::set<std::string> top_keys;
  std::string duplicate;
  const nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!top_keys.insert(parsed.get<std::string>()).second && duplicate.empty()) {
        duplicate = parsed.get<std::string>();
      }
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(p + 8, p + 8 + n, cb, /*allow_exceptions=*/false);
  } catch (const nlohmann::json::exception& ex) {
    return Corrupt(name, absl::StrCat("header is not valid JSON: ", ex.what()));
  }
  if (header.is_discarded()) return Corrupt(name, "header is not valid JSON");
  if (!header.is_object()) return Corrupt(name, "header JSON is not an object");
  if (!duplicate.empty()) {
    return Corrupt(name, absl::StrCat("header lists '", duplicate, "' twice"));
  }

  std::vector<const SafetensorsTensorInfo*> order;
  try {
    for (auto it = header.begin(); it != header.end(); ++it) {
      const std::string& key = it.key();
      const nlohmann::json& v = it.value();
      if (key == "__metadata__") {
        if (!v.is_object()) return Corrupt(name, "__metadata__ is not an object");
        for (auto m = v.begin(); m != v.end(); ++m) {
          if (!m.value().is_string()) {
            return Corrupt(name,
                           absl::StrCat("__metadata__ value of '", m.key(), "' is not a string"));
          }
          f.metadata_[m.key()] = m.value().get<std::string>();
        }
        continue;
      }
      ASSIGN_OR_RETURN(SafetensorsTensorInfo t,
                       ParseTensorEntry(name, key, v, data_size, f.data_start_, size));
      auto [slot, inserted] = f.tensors_.emplace(key, std::move(t));
      if (!inserted) return Corrupt(name, absl::StrCat("header lists '", key, "' twice"));
    }
  } catch (const nlohmann::json::exception& ex) {
    return Corrupt(name, absl::StrCat("malformed header: ", ex.what()));
  }

  // Tensors must tile the data section: sorted by offset, each begins where the last ended.
  for (const auto& [k, t] : f.tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(),
            [](const SafetensorsTensorInfo* a, const SafetensorsTensorInfo* b) {
              return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
            });
  uint64_t expected = 0;
  for (const SafetensorsTensorInfo* t : order) {
    if (t->begin != expected) {
      return Corrupt(name, absl::StrCat("tensor '", t->name, "' starts at byte ", t->begin,
                                        " of the data section, expected ", expected,
                                        t->begin < expected ? " (overlap)" : " (gap)"));
    }
    expected = t->end;
    f.names_.push_back(t->name);
  }
  if (expected != data_size) {
    return Corrupt(
        name, absl::StrCat("tensors cover ", expected, " bytes of the data section, but it has ",
                           data_size, " bytes"));
  }
  return f;
}

const SafetensorsTensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

namespace {
absl::Status MissingTensor(const std::string& file, absl::string_view name) {
  return absl::NotFoundError(
      absl::StrCat("safetensors file '", file, "' has no tensor '", name, "'"));
}
}  // namespace

absl::StatusOr<std::vector<int64_t>> SafetensorsFile::shape(absl::string_view name) const {
  const SafetensorsTensorInfo* t = Find(name);
  if (t == nullptr) return MissingTensor(name_, name);
  return t->shape;
}

absl::StatusOr<std::string> SafetensorsFile::dtype(absl::string_view name) const {
  const SafetensorsTensorInfo* t = Find(name);
  if (t == nullptr) return MissingTensor(name_, name);
  return t->dtype;
}

absl::StatusOr<absl::Span<const uint8_t>> SafetensorsFile::RawData(absl::string_view name) const {
  const SafetensorsTensorInfo* t = Find(name);
  if (t == nullptr) return MissingTensor(name_, name);
  return absl::Span<const uint8_t>(file_.data() + data_start_ + t->begin,
                                   static_cast<size_t>(t->end - t->begin));
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadF32(absl::string_view name) const {
  const SafetensorsTensorInfo* t = Find(name);
  if (t == nullptr) return MissingTensor(name_, name);
  std::vector<float> out(static_cast<size_t>(t->numel()));
  RETURN_IF_ERROR(ReadF32Into(name, absl::MakeSpan(out)));
  return out;
}

absl::Status SafetensorsFile::ReadF32Into(absl::string_view name, absl::Span<float> dst) const {
  const SafetensorsTensorInfo* t = Find(name);
  if (t == nullptr) return MissingTensor(name_, name);
  const uint8_t* src = file_.data() + data_start_ + t->begin;
  const size_t n = static_cast<size_t>(t->numel());
  if (dst.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors tensor '", name, "' in ", name_,
                                                   " has ", n, " elements; the destination has ",
                                                   dst.size()));
  }
  float* out = dst.data();
  if (t->dtype == "F32") {
    if (n > 0) std::memcpy(out, src, n * 4);
  } else if (t->dtype == "BF16" || t->dtype == "F16") {
    const bool bf = t->dtype == "BF16";
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
      out[i] = bf ? runtime::Bf16ToFp32(h) : runtime::Fp16ToFp32(h);
    }
  } else if (t->dtype == "F64") {
    for (size_t i = 0; i < n; ++i) {
      double d;
      std::memcpy(&d, src + 8 * i, 8);
      out[i] = static_cast<float>(d);
    }
  } else {
    return absl::UnimplementedError(absl::StrCat("safetensors tensor '", name, "' has dtype ",
                                                 t->dtype,
                                                 "; ReadF32 converts F32, F16, BF16, F64 only; "
                                                 "use RawData"));
  }
  return absl::OkStatus();
}

void SafetensorsFile::ReleasePages(absl::string_view name) const {
  const SafetensorsTensorInfo* t = Find(name);
  if (t == nullptr) return;
  file_.Release(static_cast<size_t>(data_start_ + t->begin),
                static_cast<size_t>(t->end - t->begin));
}

}  // namespace lspo::model
