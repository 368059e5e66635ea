// TFRecord framing (the container of TensorFlow / TensorBoard event files) and the CRC-32C it
// checks with. A record is
//   uint64 length (little-endian) | uint32 masked_crc32c(the 8 length bytes) (LE) |
//   length bytes of data          | uint32 masked_crc32c(data) (LE)
// with masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32), crc = CRC-32C.
// CRC-32C is the Castagnoli CRC (iSCSI, RFC 3720 section 12.1): reflected polynomial
// 0x82F63B78, initial value and final xor 0xFFFFFFFF; CRC-32C("123456789") = 0xE3069283.
// Computed here with a 256-entry table (Debian 12 packages no crc32c library and its Abseil
// 20220623 has no absl/crc); a few kilobytes per training step, so speed does not matter.
//
// Thread-safety: pure functions.
#ifndef LSPO_RUNTIME_TFRECORD_H_
#define LSPO_RUNTIME_TFRECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lspo::runtime {

// CRC-32C of `data`.
uint32_t Crc32c(absl::string_view data);
// Continues a CRC-32C: Crc32cExtend(Crc32c(a), b) == Crc32c(a + b); Crc32cExtend(0, b) ==
// Crc32c(b).
uint32_t Crc32cExtend(uint32_t crc, absl::string_view data);

// The masking TFRecord applies to stored CRCs (a CRC of data that holds CRCs stays useful),
// and its inverse: UnmaskCrc32c(MaskCrc32c(c)) == c.
uint32_t MaskCrc32c(uint32_t crc);
uint32_t UnmaskCrc32c(uint32_t masked);

// Appends the framed record of `data` (data.size() + 16 bytes) to `*out`.
void AppendTfRecord(absl::string_view data, std::string* out);

// The data of every record of a TFRecord stream (a whole events file), both CRCs checked.
// `what` names the stream in errors (a file path). Errors: kDataLoss naming `what`, the byte
// offset and the cause (a truncated header or record, a length or data CRC mismatch).
absl::StatusOr<std::vector<std::string>> ParseTfRecords(absl::string_view bytes,
                                                        absl::string_view what);

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_TFRECORD_H_
