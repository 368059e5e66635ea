// ggml tensor element types and their dequantisation to f32 (torch-free).
//
// Source: docs/formats.md §2 (block structs from ggml-common.h, dequant formulas from ggml-quants.c
// and gguf-py quants.py). A quantised tensor row of `n` elements is n/B consecutive blocks of
// `type_size` bytes; blocks never cross a row. Legend: B = elements per block, d/m/dmin = f16
// scales, lo(b) = b & 15, hi(b) = b >> 4.
//
//   type  B    bytes  value
//   F32   1    4      y = x
//   F16   1    2      y = half(x)
//   BF16  1    2      y = f32 with bits x<<16
//   Q4_0  32   18     d, qs[16]:        y[j] = (lo(qs[j]) - 8) d,  y[j+16] = (hi(qs[j]) - 8) d
//   Q4_1  32   20     d, m, qs[16]:     y[j] = lo(qs[j]) d + m,    y[j+16] = hi(qs[j]) d + m
//   Q5_0  32   22     d, qh[4], qs[16]: 5th bit from u32 qh; y = (q - 16) d
//   Q5_1  32   24     d, m, qh[4], qs[16]: y = q d + m
//   Q8_0  32   34     d, i8 qs[32]:     y = qs d
//   Q4_K  256  144    d, dmin, scales[12], qs[128]          (6-bit packed sub-block scales/mins)
//   Q5_K  256  176    d, dmin, scales[12], qh[32], qs[128]
//   Q6_K  256  210    ql[128], qh[64], i8 scales[16], d
//   Q2_K, Q3_K, Q8_K: sizes known (a GGUF holding them parses) but not dequantised.
//
// Thread-safety: all functions are pure.
#ifndef LSPO_MODEL_DEQUANT_H_
#define LSPO_MODEL_DEQUANT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lspo::model {

// ggml_type ids as stored in GGUF tensor infos (u32). Values are fixed by the file format.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kBF16 = 30,
};

// True if `id` is one of the GgmlType values above (other ggml ids, e.g. IQ types, are not).
bool IsKnownGgmlType(uint32_t id);

// "F32", "Q4_1", ... (ggml spelling); "UNKNOWN" for ids outside GgmlType.
absl::string_view GgmlTypeName(GgmlType type);

// Elements per block B (1 for F32/F16/BF16, 32 for Q*_0/Q*_1, 256 for K types); 0 if unknown.
int64_t GgmlBlockSize(GgmlType type);

// Bytes per block (e.g. Q4_1: 20); 0 if unknown.
int64_t GgmlTypeSize(GgmlType type);

// True if DequantizeRow supports `type` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
// Q5_K, Q6_K).
bool CanDequantize(GgmlType type);

// Bytes of one row of `ne0` elements: ne0 / B * type_size.
// kInvalidArgument: unknown type, ne0 < 0, or ne0 % B != 0.
absl::StatusOr<uint64_t> GgmlRowBytes(GgmlType type, int64_t ne0);

// Dequantises `n` elements (a whole number of blocks) from `src` (`src_bytes` readable bytes,
// ggml block layout, little-endian) into `dst` (n f32 values, caller-owned, must not alias src).
// Formulas: docs/formats.md §2 / the table at the top of this file.
// Errors: kInvalidArgument if n < 0, n % B != 0 or src_bytes < n / B * type_size;
// kUnimplemented for Q2_K, Q3_K, Q8_K and unknown types.
absl::Status DequantizeRow(GgmlType type, const uint8_t* src, size_t src_bytes, int64_t n,
                           float* dst);

}  // namespace lspo::model

#endif  // LSPO_MODEL_DEQUANT_H_
