// CRC-32C, its TFRecord masking and the record framing (runtime/tfrecord.h) against known
// values: RFC 3720's CRC-32C test vectors (section B.4), and masked CRCs and a framed record
// computed by the tensorboard 2.21.0 package (tensorboard.compat.tensorflow_stub.
// pywrap_tensorflow.masked_crc32c, tensorboard.summary.writer.record_writer.RecordWriter).
#include "runtime/tfrecord.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lspo::runtime {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Bytes(std::initializer_list<int> v) {
  std::string s;
  for (int b : v) s.push_back(static_cast<char>(b));
  return s;
}

std::string Iota(int n, bool down) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(down ? n - 1 - i : i));
  return s;
}

TEST(Crc32cTest, KnownValues) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);  // The CRC catalogue's check value.
  EXPECT_EQ(Crc32c(""), 0u);
  // RFC 3720 B.4.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(Iota(32, false)), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(Iota(32, true)), 0x113FDB5Cu);
}

TEST(Crc32cTest, ExtendContinuesACrc) {
  const std::string a = "The quick brown fox ", b = "jumps over the lazy dog";
  EXPECT_EQ(Crc32cExtend(Crc32c(a), b), Crc32c(a + b));
  EXPECT_EQ(Crc32cExtend(0, a), Crc32c(a));
  EXPECT_EQ(Crc32cExtend(Crc32c(a), ""), Crc32c(a));
}

TEST(Crc32cTest, MaskingMatchesTensorBoardAndInverts) {
  EXPECT_EQ(MaskCrc32c(Crc32c("")), 0xa282ead8u);
  EXPECT_EQ(MaskCrc32c(Crc32c("123456789")), 0xc78ab0e5u);
  EXPECT_EQ(MaskCrc32c(Crc32c(std::string(32, '\0'))), 0x0fd7fffau);
  EXPECT_EQ(MaskCrc32c(Crc32c(std::string(32, '\xff'))), 0xf909b029u);
  EXPECT_EQ(MaskCrc32c(Crc32c(Iota(32, false))), 0x951f7892u);
  // ((crc >> 15) | (crc << 17)) + 0xa282ead8, with the addition wrapping mod 2^32.
  EXPECT_EQ(MaskCrc32c(0xffffffffu), 0xa282ead7u);
  for (uint32_t c : {0u, 1u, 0xE3069283u, 0x80000000u, 0xffffffffu, 0x5d7e8a1bu}) {
    EXPECT_EQ(UnmaskCrc32c(MaskCrc32c(c)), c) << c;
  }
}

TEST(TfRecordTest, FramingMatchesTensorBoardsRecordWriter) {
  std::string out;
  AppendTfRecord("hello", &out);
  EXPECT_EQ(out, Bytes({0x05, 0, 0, 0, 0, 0, 0, 0, 0xea, 0xb2, 0x04, 0x3e}) + "hello" +
                     Bytes({0xbb, 0x1f, 0x1c, 0x19}));
  // Appends: a second record follows the first; an empty record is 16 bytes.
  AppendTfRecord("", &out);
  ASSERT_EQ(out.size(), 21u + 16u);
  EXPECT_EQ(out.substr(21, 8), std::string(8, '\0'));
}

TEST(TfRecordTest, ParseReturnsEveryRecord) {
  std::string stream;
  const std::string big(70000, 'x');  // Length above 16 bits.
  for (const std::string& r : {std::string("a"), std::string(), big}) AppendTfRecord(r, &stream);
  auto records = ParseTfRecords(stream, "mem");
  ASSERT_TRUE(records.ok()) << records.status();
  EXPECT_THAT(*records, ElementsAre("a", "", big));
  auto none = ParseTfRecords("", "empty");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(TfRecordTest, ParseNamesTheStreamAndTheDamage) {
  std::string stream;
  AppendTfRecord("first", &stream);
  AppendTfRecord("second", &stream);
  const size_t second = 5 + 16;
  struct Case {
    std::string bytes;
    std::string cause;
  };
  std::string bad_data = stream;
  bad_data[second + 12] ^= 1;
  std::string bad_length = stream;
  bad_length[second] ^= 1;
  std::vector<Case> cases = {
      {stream.substr(0, stream.size() - 1), "truncated record"},
      {stream.substr(0, second + 7), "truncated record header"},
      {bad_data, "data CRC mismatch"},
      {bad_length, "length CRC mismatch"},
  };
  for (const Case& c : cases) {
    auto r = ParseTfRecords(c.bytes, "/tmp/x.tfevents");
    ASSERT_FALSE(r.ok()) << c.cause;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(r.status().message(), HasSubstr("/tmp/x.tfevents"));
    EXPECT_THAT(r.status().message(), HasSubstr(c.cause));
    EXPECT_THAT(r.status().message(), HasSubstr("at byte 21 (record 1)"));
  }
}

}  // namespace
}  // namespace lspo::runtime
