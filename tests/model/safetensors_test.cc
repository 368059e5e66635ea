// Tests of model/safetensors.h: round trips, the on-disk layout (docs/formats.md §6), a file
// written by the reference `safetensors` package (tests/oracle/make_safetensors_oracle.py),
// and one corrupt-header test per failure mode.
#include "model/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/float16.h"
#include "nlohmann/json.hpp"

namespace lspo::model {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& tag) {
  static int counter = 0;
  return ::testing::TempDir() + "/st_test_" + std::to_string(::getpid()) + "_" +
         std::to_string(counter++) + "_" + tag + ".safetensors";
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// bf16 value of bits b (sign, 8-bit exponent, 7-bit mantissa), in float64.
double Bf16Value(uint16_t b) {
  const int s = (b >> 15) ? -1 : 1, e = (b >> 7) & 255, m = b & 127;
  return e == 0 ? s * std::ldexp(m / 128.0, -126) : s * std::ldexp(1.0 + m / 128.0, e - 127);
}

struct Fixture {
  std::vector<float> a;      // F32 (2, 3)
  std::vector<uint16_t> b;   // BF16 (4,)
  std::vector<uint16_t> c;   // F16 (3, 1)
  std::vector<float> empty;  // F32 (0, 5)
  float scalar = 42.25f;     // F32 ()
  std::vector<SafetensorsEntry> Entries() const {
    return {{"a", "F32", {2, 3}, a.data(), a.size() * 4},
            {"b.weight", "BF16", {4}, b.data(), b.size() * 2},
            {"c", "F16", {3, 1}, c.data(), c.size() * 2},
            {"empty", "F32", {0, 5}, nullptr, 0},
            {"scalar", "F32", {}, &scalar, 4}};
  }
};

Fixture MakeFixture() {
  Fixture f;
  f.a = {1.f, -2.5f, 3.25f, 1e-30f, -0.f, 65504.f};
  for (float v : {1.f, -0.15625f, 3.0e38f, 1.0078125f}) f.b.push_back(runtime::Fp32ToBf16(v));
  f.c = {0x3c00, 0xc000, 0x0001};  // 1, -2, 2^-24
  return f;
}

TEST(SafetensorsTest, RoundTripF32Bf16F16) {
  const Fixture fx = MakeFixture();
  const std::string path = TempPath("rt");
  ASSERT_TRUE(WriteSafetensors(path, fx.Entries(), {{"step", "7"}}).ok());
  EXPECT_FALSE(Exists(path + ".tmp"));

  // On-disk layout, parsed independently: u64 N, N % 8 == 0, JSON padded with spaces.
  const std::vector<uint8_t> bytes = ReadAll(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + n);
  const nlohmann::json j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["__metadata__"]["step"], "7");
  EXPECT_EQ(j["a"]["dtype"], "F32");
  EXPECT_EQ(j["a"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(j["b.weight"]["data_offsets"], nlohmann::json({24, 32}));
  EXPECT_EQ(j["c"]["data_offsets"], nlohmann::json({32, 38}));
  EXPECT_EQ(j["empty"]["data_offsets"], nlohmann::json({38, 38}));
  EXPECT_EQ(j["scalar"]["shape"], nlohmann::json::array());
  EXPECT_EQ(j["scalar"]["data_offsets"], nlohmann::json({38, 42}));
  EXPECT_EQ(bytes.size(), 8 + n + 42);
  EXPECT_EQ(header.find_first_not_of(' ', header.rfind('}') + 1), std::string::npos);

  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->names(), (std::vector<std::string>{"a", "b.weight", "c", "empty", "scalar"}));
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("step"), "7");
  EXPECT_EQ(*f->shape("a"), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*f->shape("empty"), (std::vector<int64_t>{0, 5}));
  EXPECT_TRUE(f->shape("scalar")->empty());
  EXPECT_EQ(*f->dtype("b.weight"), "BF16");
  EXPECT_EQ(*f->ReadF32("a"), fx.a);
  const std::vector<float> b = *f->ReadF32("b.weight");
  ASSERT_EQ(b.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(static_cast<double>(b[i]), Bf16Value(fx.b[i])) << i;
  // Exactly representable values survive; 1.0078125 = 1 + 2^-7 is a bf16 value too.
  EXPECT_EQ(b[0], 1.f);
  EXPECT_EQ(b[1], -0.15625f);
  EXPECT_EQ(b[3], 1.0078125f);
  EXPECT_EQ(*f->ReadF32("c"), (std::vector<float>{1.f, -2.f, std::ldexp(1.f, -24)}));
  EXPECT_TRUE(f->ReadF32("empty")->empty());
  EXPECT_EQ(*f->ReadF32("scalar"), std::vector<float>{42.25f});
  absl::StatusOr<absl::Span<const uint8_t>> raw = f->RawData("b.weight");
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(raw->size(), 8u);
  EXPECT_EQ(std::memcmp(raw->data(), fx.b.data(), 8), 0);
  EXPECT_EQ(f->ReadF32("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f->shape("nope").status().code(), absl::StatusCode::kNotFound);
  std::remove(path.c_str());
}

TEST(SafetensorsTest, HeaderIsPaddedToEightBytesForAnyNameLength) {
  const float v = 1.f;
  for (int len = 1; len <= 9; ++len) {
    const std::string path = TempPath("pad");
    ASSERT_TRUE(WriteSafetensors(path, {{std::string(len, 'x'), "F32", {1}, &v, 4}}, {}).ok());
    const std::vector<uint8_t> bytes = ReadAll(path);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(bytes[i]) << (8 * i);
    EXPECT_EQ(n % 8, 0u) << len;
    EXPECT_EQ(bytes.size(), 8 + n + 4);
    EXPECT_EQ(*SafetensorsFile::Open(path)->ReadF32(std::string(len, 'x')),
              std::vector<float>{1.f});
    std::remove(path.c_str());
  }
}

TEST(SafetensorsTest, RewriteReplacesFileAtomically) {
  const std::string path = TempPath("rewrite");
  const std::vector<float> v1 = {1, 2, 3}, v2 = {4, 5};
  ASSERT_TRUE(WriteSafetensors(path, {{"w", "F32", {3}, v1.data(), 12}}, {}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {{"w", "F32", {2}, v2.data(), 8}}, {}).ok());
  EXPECT_EQ(*SafetensorsFile::Open(path)->ReadF32("w"), v2);
  EXPECT_FALSE(Exists(path + ".tmp"));
  std::remove(path.c_str());
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  const std::string path = TempPath("bad");
  const std::vector<float> v = {1, 2};
  const auto code = [&](const std::vector<SafetensorsEntry>& e,
                        const std::map<std::string, std::string>& m = {}) {
    return WriteSafetensors(path, e, m).code();
  };
  EXPECT_EQ(code({{"w", "F32", {2}, v.data(), 8}, {"w", "F32", {2}, v.data(), 8}}),
            absl::StatusCode::kInvalidArgument);  // duplicate
  EXPECT_EQ(code({{"", "F32", {2}, v.data(), 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"__metadata__", "F32", {2}, v.data(), 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"w", "F8_E4M3", {8}, v.data(), 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"w", "F32", {3}, v.data(), 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"w", "F32", {-2}, v.data(), 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"w", "F32", {2}, nullptr, 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"w", "F32", {2}, v.data(), 8}}, {{"format", "tf"}}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"w\xff", "F32", {2}, v.data(), 8}}), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Exists(path));
  EXPECT_FALSE(Exists(path + ".tmp"));
  // Missing directory: kNotFound, nothing left behind.
  const std::string missing = ::testing::TempDir() + "/no_such_dir_st/x.safetensors";
  EXPECT_EQ(WriteSafetensors(missing, {{"w", "F32", {2}, v.data(), 8}}, {}).code(),
            absl::StatusCode::kNotFound);
  // Explicit format=pt is accepted.
  EXPECT_TRUE(WriteSafetensors(path, {{"w", "F32", {2}, v.data(), 8}}, {{"format", "pt"}}).ok());
  std::remove(path.c_str());
}

TEST(SafetensorsTest, ReadsReferenceWriterOutput) {
  std::ifstream in("tests/oracle/data/tiny_safetensors.json");
  ASSERT_TRUE(in.good()) << "run tests/oracle/make_safetensors_oracle.py";
  const nlohmann::json o = nlohmann::json::parse(in);
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::Open(o["file"].get<std::string>());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->metadata().at("format"), "pt");
  EXPECT_EQ(f->metadata().at("note"), "oracle");
  EXPECT_EQ(f->names().size(), o["tensors"].size());
  for (const auto& [name, t] : o["tensors"].items()) {
    EXPECT_EQ(*f->dtype(name), t["dtype"].get<std::string>()) << name;
    EXPECT_EQ(*f->shape(name), t["shape"].get<std::vector<int64_t>>()) << name;
    const auto want = t["values"].get<std::vector<double>>();
    if (t["dtype"] == "I32") {
      EXPECT_EQ(f->ReadF32(name).status().code(), absl::StatusCode::kUnimplemented);
      absl::Span<const uint8_t> raw = *f->RawData(name);
      ASSERT_EQ(raw.size(), want.size() * 4);
      for (size_t i = 0; i < want.size(); ++i) {
        int32_t x;
        std::memcpy(&x, raw.data() + 4 * i, 4);
        EXPECT_EQ(x, want[i]);
      }
      continue;
    }
    absl::StatusOr<std::vector<float>> got = f->ReadF32(name);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(static_cast<double>((*got)[i]), want[i]);
  }
}

// ---------------------------------------------------------------------------------------
// Corrupt files.

// u64 N | header (padded with spaces to `pad_to` if > 0) | data.
std::vector<uint8_t> MakeFile(const std::string& header, size_t data_bytes,
                              std::optional<uint64_t> n_override = std::nullopt) {
  std::vector<uint8_t> b(8);
  const uint64_t n = n_override.value_or(header.size());
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(n >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  b.resize(b.size() + data_bytes, 0);
  return b;
}

absl::Status OpenStatus(const std::vector<uint8_t>& bytes) {
  return SafetensorsFile::FromBytes(bytes, "corrupt").status();
}

constexpr char kGood[] =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
    R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})";

TEST(SafetensorsCorruptTest, GoodBaselineParses) {
  absl::StatusOr<SafetensorsFile> f = SafetensorsFile::FromBytes(MakeFile(kGood, 16));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->names(), (std::vector<std::string>{"a", "b"}));
}

TEST(SafetensorsCorruptTest, ShorterThanLengthField) {
  for (size_t n : {0, 1, 7}) {
    const absl::Status s = OpenStatus(std::vector<uint8_t>(n, 0));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(s.message()), HasSubstr("expected at least 8"));
  }
}

TEST(SafetensorsCorruptTest, HeaderLengthOverLimit) {
  const absl::Status s = OpenStatus(MakeFile(kGood, 16, 100'000'001));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("exceeds the limit"));
}

TEST(SafetensorsCorruptTest, HeaderLengthPastEndOfFile) {
  const std::string h = kGood;
  const absl::Status s = OpenStatus(MakeFile(h, 0, h.size() + 100));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("at least " + std::to_string(8 + h.size() + 100) + " bytes, but it is " +
                        std::to_string(8 + h.size())));
}

TEST(SafetensorsCorruptTest, TruncatedData) {
  const absl::Status s = OpenStatus(MakeFile(kGood, 12));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("only 12 bytes"));
}

TEST(SafetensorsCorruptTest, InvalidJson) {
  EXPECT_EQ(OpenStatus(MakeFile(R"({"a":{"dtype":"F32",)", 0)).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(OpenStatus(MakeFile("\xff\xfe", 0)).code(), absl::StatusCode::kDataLoss);
}

TEST(SafetensorsCorruptTest, HeaderNotAnObject) {
  const absl::Status s = OpenStatus(MakeFile("[1,2,3]", 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not an object"));
}

TEST(SafetensorsCorruptTest, DuplicateKey) {
  const absl::Status s =
      OpenStatus(MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          8));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'a' twice"));
}

TEST(SafetensorsCorruptTest, MalformedEntries) {
  for (const char* h : {
           R"({"a":{"shape":[2],"data_offsets":[0,8]}})",                  // no dtype
           R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})",        // dtype not str
           R"({"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}})",      // shape not array
           R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",   // negative dim
           R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})",  // fractional dim
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})",      // one offset
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})",    // begin > end
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,"8"]}})",  // string offset
           R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})",    // size mismatch
           R"({"a":[1,2]})",                                               // not an object
           R"({"__metadata__":{"format":1}})",                             // non-string meta
           R"({"__metadata__":[]})",                                       // meta not object
           R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
       }) {
    const absl::Status s = OpenStatus(MakeFile(h, 8));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << h << " -> " << s;
  }
}

TEST(SafetensorsCorruptTest, UnknownDtype) {
  const absl::Status s =
      OpenStatus(MakeFile(R"({"a":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", 8));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(s.message()), HasSubstr("F8_E4M3"));
}

TEST(SafetensorsCorruptTest, OverlappingTensors) {
  const absl::Status s =
      OpenStatus(MakeFile(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          12));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("overlap"));
}

TEST(SafetensorsCorruptTest, GapBetweenTensors) {
  const absl::Status s =
      OpenStatus(MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                          12));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("gap"));
}

TEST(SafetensorsCorruptTest, TrailingUnindexedData) {
  const absl::Status s = OpenStatus(MakeFile(kGood, 20));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cover 16 bytes"));
}

TEST(SafetensorsCorruptTest, MissingFileIsNotFound) {
  EXPECT_EQ(SafetensorsFile::Open("/nonexistent/x.safetensors").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lspo::model
