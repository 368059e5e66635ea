#include "model/dequant.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/float16.h"

namespace lspo::model {
namespace {

struct TypeTraits {
  int64_t block_size;  // elements per block
  int64_t type_size;   // bytes per block
  absl::string_view name;
};

// Returns nullptr for ids outside GgmlType.
const TypeTraits* Traits(uint32_t id) {
  static const TypeTraits kF32{1, 4, "F32"}, kF16{1, 2, "F16"}, kBF16{1, 2, "BF16"},
      kQ4_0{32, 18, "Q4_0"}, kQ4_1{32, 20, "Q4_1"}, kQ5_0{32, 22, "Q5_0"}, kQ5_1{32, 24, "Q5_1"},
      kQ8_0{32, 34, "Q8_0"}, kQ2_K{256, 84, "Q2_K"}, kQ3_K{256, 110, "Q3_K"},
      kQ4_K{256, 144, "Q4_K"}, kQ5_K{256, 176, "Q5_K"}, kQ6_K{256, 210, "Q6_K"},
      kQ8_K{256, 292, "Q8_K"};
  switch (id) {
    case 0:
      return &kF32;
    case 1:
      return &kF16;
    case 2:
      return &kQ4_0;
    case 3:
      return &kQ4_1;
    case 6:
      return &kQ5_0;
    case 7:
      return &kQ5_1;
    case 8:
      return &kQ8_0;
    case 10:
      return &kQ2_K;
    case 11:
      return &kQ3_K;
    case 12:
      return &kQ4_K;
    case 13:
      return &kQ5_K;
    case 14:
      return &kQ6_K;
    case 15:
      return &kQ8_K;
    case 30:
      return &kBF16;
    default:
      return nullptr;
  }
}

inline uint16_t LoadU16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}
inline float LoadF16(const uint8_t* p) { return runtime::Fp16ToFp32(LoadU16(p)); }
inline uint32_t LoadU32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// ---- 32-element block types. Each takes one block and writes 32 floats. ----

void DequantQ4_0(const uint8_t* b, float* y) {  // d | qs[16]
  const float d = LoadF16(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void DequantQ4_1(const uint8_t* b, float* y) {  // d | m | qs[16]
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

void DequantQ5_0(const uint8_t* b, float* y) {  // d | qh[4] | qs[16]
  const float d = LoadF16(b);
  const uint32_t h = LoadU32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((h >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((h >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

void DequantQ5_1(const uint8_t* b, float* y) {  // d | m | qh[4] | qs[16]
  const float d = LoadF16(b);
  const float m = LoadF16(b + 2);
  const uint32_t h = LoadU32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 0x0f) | static_cast<int>(((h >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((h >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

void DequantQ8_0(const uint8_t* b, float* y) {  // d | i8 qs[32]
  const float d = LoadF16(b);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// ---- 256-element K block types. ----

// 6-bit scale / min of sub-block j (0..7) from the 12 packed bytes (docs/formats.md §2).
inline void ScaleMinK4(int j, const uint8_t* s, int* sc, int* mn) {
  if (j < 4) {
    *sc = s[j] & 63;
    *mn = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

void DequantQ4_K(const uint8_t* b, float* y) {  // d | dmin | scales[12] | qs[128]
  const float d = LoadF16(b);
  const float dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c) {
    int sc0, mn0, sc1, mn1;
    ScaleMinK4(2 * c, scales, &sc0, &mn0);
    ScaleMinK4(2 * c + 1, scales, &sc1, &mn1);
    const float d0 = d * static_cast<float>(sc0), m0 = dmin * static_cast<float>(mn0);
    const float d1 = d * static_cast<float>(sc1), m1 = dmin * static_cast<float>(mn1);
    const uint8_t* q = qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      y[64 * c + l] = d0 * static_cast<float>(q[l] & 0x0f) - m0;
      y[64 * c + 32 + l] = d1 * static_cast<float>(q[l] >> 4) - m1;
    }
  }
}

void DequantQ5_K(const uint8_t* b, float* y) {  // d | dmin | scales[12] | qh[32] | qs[128]
  const float d = LoadF16(b);
  const float dmin = LoadF16(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int c = 0; c < 4; ++c) {
    int sc0, mn0, sc1, mn1;
    ScaleMinK4(2 * c, scales, &sc0, &mn0);
    ScaleMinK4(2 * c + 1, scales, &sc1, &mn1);
    const float d0 = d * static_cast<float>(sc0), m0 = dmin * static_cast<float>(mn0);
    const float d1 = d * static_cast<float>(sc1), m1 = dmin * static_cast<float>(mn1);
    const uint8_t* q = qs + 32 * c;
    for (int l = 0; l < 32; ++l) {
      const int lo = (q[l] & 0x0f) + (((qh[l] >> (2 * c)) & 1) << 4);
      const int hi = (q[l] >> 4) + (((qh[l] >> (2 * c + 1)) & 1) << 4);
      y[64 * c + l] = d0 * static_cast<float>(lo) - m0;
      y[64 * c + 32 + l] = d1 * static_cast<float>(hi) - m1;
    }
  }
}

void DequantQ6_K(const uint8_t* b, float* y) {  // ql[128] | qh[64] | i8 scales[16] | d
  const float d = LoadF16(b + 208);
  for (int n = 0; n < 2; ++n) {
    const uint8_t* ql = b + 64 * n;
    const uint8_t* qh = b + 128 + 32 * n;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * n);
    float* yy = y + 128 * n;
    for (int l = 0; l < 32; ++l) {
      const int i = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      yy[l] = d * static_cast<float>(sc[i]) * static_cast<float>(q1);
      yy[l + 32] = d * static_cast<float>(sc[i + 2]) * static_cast<float>(q2);
      yy[l + 64] = d * static_cast<float>(sc[i + 4]) * static_cast<float>(q3);
      yy[l + 96] = d * static_cast<float>(sc[i + 6]) * static_cast<float>(q4);
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn BlockDequantizer(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return DequantQ4_0;
    case GgmlType::kQ4_1:
      return DequantQ4_1;
    case GgmlType::kQ5_0:
      return DequantQ5_0;
    case GgmlType::kQ5_1:
      return DequantQ5_1;
    case GgmlType::kQ8_0:
      return DequantQ8_0;
    case GgmlType::kQ4_K:
      return DequantQ4_K;
    case GgmlType::kQ5_K:
      return DequantQ5_K;
    case GgmlType::kQ6_K:
      return DequantQ6_K;
    default:
      return nullptr;
  }
}

}  // namespace

bool IsKnownGgmlType(uint32_t id) { return Traits(id) != nullptr; }

absl::string_view GgmlTypeName(GgmlType type) {
  const TypeTraits* t = Traits(static_cast<uint32_t>(type));
  return t != nullptr ? t->name : absl::string_view("UNKNOWN");
}

int64_t GgmlBlockSize(GgmlType type) {
  const TypeTraits* t = Traits(static_cast<uint32_t>(type));
  return t != nullptr ? t->block_size : 0;
}

int64_t GgmlTypeSize(GgmlType type) {
  const TypeTraits* t = Traits(static_cast<uint32_t>(type));
  return t != nullptr ? t->type_size : 0;
}

bool CanDequantize(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16 ||
         BlockDequantizer(type) != nullptr;
}

absl::StatusOr<uint64_t> GgmlRowBytes(GgmlType type, int64_t ne0) {
  const TypeTraits* t = Traits(static_cast<uint32_t>(type));
  if (t == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("GgmlRowBytes: unknown ggml type id ",
                                                   static_cast<uint32_t>(type),
                                                   "; expected one of the GgmlType values"));
  }
  if (ne0 < 0 || ne0 % t->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("GgmlRowBytes: row length ", ne0,
                                                   " is not a non-negative multiple of the ",
                                                   t->name, " block size ", t->block_size));
  }
  return static_cast<uint64_t>(ne0 / t->block_size) * static_cast<uint64_t>(t->type_size);
}

absl::Status DequantizeRow(GgmlType type, const uint8_t* src, size_t src_bytes, int64_t n,
                           float* dst) {
  const TypeTraits* t = Traits(static_cast<uint32_t>(type));
  if (t == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("DequantizeRow: unknown ggml type id ", static_cast<uint32_t>(type)));
  }
  if (!CanDequantize(type)) {
    return absl::UnimplementedError(absl::StrCat(
        "DequantizeRow: dequantisation of ggml type ", t->name,
        " is not implemented; supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, "
        "Q5_K, Q6_K (requantise the model to one of them)"));
  }
  if (n < 0 || n % t->block_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeRow: element count ", n,
                                                   " is not a non-negative multiple of the ",
                                                   t->name, " block size ", t->block_size));
  }
  const uint64_t nblocks = static_cast<uint64_t>(n / t->block_size);
  const uint64_t need = nblocks * static_cast<uint64_t>(t->type_size);
  if (src_bytes < need) {
    return absl::InvalidArgumentError(absl::StrCat("DequantizeRow: ", n, " ", t->name,
                                                   " elements need ", need, " source bytes, got ",
                                                   src_bytes));
  }
  if (n > 0 && (src == nullptr || dst == nullptr)) {
    return absl::InvalidArgumentError("DequantizeRow: null src or dst");
  }
  switch (type) {
    case GgmlType::kF32:
      std::memcpy(dst, src, need);
      return absl::OkStatus();
    case GgmlType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = LoadF16(src + 2 * i);
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = runtime::Bf16ToFp32(LoadU16(src + 2 * i));
      return absl::OkStatus();
    default:
      break;
  }
  const BlockFn fn = BlockDequantizer(type);
  for (uint64_t blk = 0; blk < nblocks; ++blk) {
    fn(src + blk * static_cast<uint64_t>(t->type_size), dst + blk * t->block_size);
  }
  return absl::OkStatus();
}

}  // namespace lspo::model
