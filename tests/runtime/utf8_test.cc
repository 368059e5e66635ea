// runtime/utf8.h: validation and the lossy repair, against the Unicode standard's examples and
// what Python's bytes.decode("utf-8", "replace") gives for the same bytes (computed once with
// CPython 3.11 and written here as known values).
#include "runtime/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace lspo::runtime {
namespace {

std::string Bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}
const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Test, ValidTextIsKeptAndIllFormedTextIsFound) {
  const std::string text = "ham, \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E, \xF0\x9F\x98\x80";
  EXPECT_TRUE(IsValidUtf8(text));
  EXPECT_EQ(Utf8Lossy(text), text);
  size_t at = 0;
  EXPECT_FALSE(IsValidUtf8("ab\xE6\x97", &at));  // a character cut after two of three bytes
  EXPECT_EQ(at, 2u);
}

TEST(Utf8Test, LossyRepairReplacesMaximalSubparts) {
  // Unicode 15.0, section 3.9, Table 3-11: <61 F1 80 80 E1 80 C2 62 80 63 80 BF 64> ->
  // a FFFD FFFD FFFD b FFFD c FFFD FFFD d (truncated sequences count once, stray bytes each).
  EXPECT_EQ(Utf8Lossy(Bytes({0x61, 0xF1, 0x80, 0x80, 0xE1, 0x80, 0xC2, 0x62, 0x80, 0x63, 0x80,
                             0xBF, 0x64})),
            "a" + kFffd + kFffd + kFffd + "b" + kFffd + "c" + kFffd + kFffd + "d");
  // Python: overlong C0 AF -> 2 x FFFD; E0 80 AF -> 3; a surrogate ED A0 80 -> 3; above
  // U+10FFFF F4 90 80 80 -> 4; a cut E2 82 -> 1; a cut emoji F0 9F 98 -> 1; FF 41 -> FFFD A.
  EXPECT_EQ(Utf8Lossy(Bytes({0xC0, 0xAF})), kFffd + kFffd);
  EXPECT_EQ(Utf8Lossy(Bytes({0xE0, 0x80, 0xAF})), kFffd + kFffd + kFffd);
  EXPECT_EQ(Utf8Lossy(Bytes({0xED, 0xA0, 0x80})), kFffd + kFffd + kFffd);
  EXPECT_EQ(Utf8Lossy(Bytes({0xF4, 0x90, 0x80, 0x80})), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(Utf8Lossy(Bytes({0xE2, 0x82})), kFffd);
  EXPECT_EQ(Utf8Lossy(Bytes({0xF0, 0x9F, 0x98})), kFffd);
  EXPECT_EQ(Utf8Lossy(Bytes({0xFF, 0x41})), kFffd + "A");
  // A generation cut inside its last character: the whole characters stay.
  EXPECT_EQ(Utf8Lossy("\xE6\x97\xA5\xE6\x9C"), "\xE6\x97\xA5" + kFffd);
  for (const std::string& s : {Bytes({0xC0, 0xAF}), Bytes({0xF0, 0x9F, 0x98, 0x41}),
                               std::string("\xE6\x97\xA5\xE6\x9C")}) {
    EXPECT_TRUE(IsValidUtf8(Utf8Lossy(s)));
  }
}

}  // namespace
}  // namespace lspo::runtime
