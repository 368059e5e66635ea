#include "runtime/tfrecord.h"

#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace lspo::runtime {
namespace {

constexpr uint32_t kCastagnoliReflected = 0x82F63B78u;
constexpr uint32_t kMaskDelta = 0xa282ead8u;
constexpr size_t kHeaderBytes = 12;  // uint64 length + uint32 masked CRC of the length.
constexpr size_t kFooterBytes = 4;   // uint32 masked CRC of the data.

// table[b] = the CRC register after shifting the byte b through it (reflected, LSB first).
constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t r = b;
    for (int bit = 0; bit < 8; ++bit) r = (r >> 1) ^ ((r & 1u) ? kCastagnoliReflected : 0u);
    table[b] = r;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

void PutLittleEndian(uint64_t v, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xffu));
}

uint64_t GetLittleEndian(absl::string_view p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

}  // namespace

uint32_t Crc32cExtend(uint32_t crc, absl::string_view data) {
  uint32_t r = ~crc;
  for (char c : data) r = kTable[(r ^ static_cast<uint8_t>(c)) & 0xffu] ^ (r >> 8);
  return ~r;
}

uint32_t Crc32c(absl::string_view data) { return Crc32cExtend(0, data); }

uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

uint32_t UnmaskCrc32c(uint32_t masked) {
  const uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

void AppendTfRecord(absl::string_view data, std::string* out) {
  const size_t start = out->size();
  PutLittleEndian(data.size(), 8, out);
  const uint32_t length_crc = MaskCrc32c(Crc32c(absl::string_view(*out).substr(start, 8)));
  PutLittleEndian(length_crc, 4, out);
  out->append(data.data(), data.size());
  PutLittleEndian(MaskCrc32c(Crc32c(data)), 4, out);
}

absl::StatusOr<std::vector<std::string>> ParseTfRecords(absl::string_view bytes,
                                                        absl::string_view what) {
  std::vector<std::string> records;
  size_t pos = 0;
  auto error = [&](absl::string_view cause) {
    return absl::DataLossError(absl::StrCat("TFRecord stream '", what, "': ", cause, " at byte ",
                                            pos, " (record ", records.size(), ")"));
  };
  while (pos < bytes.size()) {
    if (bytes.size() - pos < kHeaderBytes) return error("truncated record header");
    const absl::string_view header = bytes.substr(pos, kHeaderBytes);
    const uint64_t length = GetLittleEndian(header, 8);
    if (static_cast<uint32_t>(GetLittleEndian(header.substr(8), 4)) !=
        MaskCrc32c(Crc32c(header.substr(0, 8)))) {
      return error("length CRC mismatch");
    }
    if (length > bytes.size() - pos - kHeaderBytes ||
        bytes.size() - pos - kHeaderBytes - length < kFooterBytes) {
      return error(absl::StrCat("truncated record (", length, " data bytes announced)"));
    }
    const absl::string_view data = bytes.substr(pos + kHeaderBytes, length);
    const uint32_t data_crc =
        static_cast<uint32_t>(GetLittleEndian(bytes.substr(pos + kHeaderBytes + length), 4));
    if (data_crc != MaskCrc32c(Crc32c(data))) return error("data CRC mismatch");
    records.emplace_back(data);
    pos += kHeaderBytes + length + kFooterBytes;
  }
  return records;
}

}  // namespace lspo::runtime
