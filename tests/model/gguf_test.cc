// Tests of model/gguf.h and model/hf_names.h: a synthetic GGUF written by a small writer
// below (docs/formats.md §1), one corrupt-file test per failure mode, the real SmolLM2 file
// (docs/formats.md §5) and oracle values from tests/oracle/make_gguf_oracle.py (gguf-py +
// transformers).
#include "model/gguf.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/hf_names.h"
#include "nlohmann/json.hpp"

namespace lspo::model {
namespace {

using ::testing::HasSubstr;

constexpr char kModelPath[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
constexpr char kOraclePath[] = "tests/oracle/data/gguf_oracle.json";

// ---------------------------------------------------------------------------------------
// A minimal GGUF writer (docs/formats.md §1), independent of the reader.

struct Bytes {
  std::vector<uint8_t> b;
  template <typename T>
  Bytes& Put(T v) {
    const size_t n = b.size();
    b.resize(n + sizeof(T));
    std::memcpy(b.data() + n, &v, sizeof(T));
    return *this;
  }
  Bytes& Str(const std::string& s) {
    Put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& Append(const Bytes& o) {
    b.insert(b.end(), o.b.begin(), o.b.end());
    return *this;
  }
};

// Value type ids.
enum : uint32_t { U8 = 0, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 };

// One encoded key/value pair.
Bytes Kv(const std::string& key, uint32_t type, const Bytes& value) {
  Bytes b;
  b.Str(key).Put<uint32_t>(type).Append(value);
  return b;
}
template <typename T>
Bytes Val(T v) {
  Bytes b;
  b.Put<T>(v);
  return b;
}
Bytes StrVal(const std::string& s) {
  Bytes b;
  b.Str(s);
  return b;
}
Bytes ArrHeader(uint32_t elem_type, uint64_t count) {
  Bytes b;
  b.Put<uint32_t>(elem_type).Put<uint64_t>(count);
  return b;
}

struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;
  uint32_t type = 0;
  std::vector<uint8_t> data;
  std::optional<uint64_t> offset;  // default: running sum aligned to the alignment
};

struct FileSpec {
  std::string magic = "GGUF";
  uint32_t version = 3;
  uint32_t alignment = 32;           // layout alignment
  bool write_alignment_key = false;  // store general.alignment (u32) as the first key
  std::vector<Bytes> kvs;
  std::vector<TensorSpec> tensors;
  std::optional<uint64_t> n_tensors, n_kv;  // header count overrides
};

struct Built {
  std::vector<uint8_t> bytes;
  size_t header_end = 0, kv_end = 0, infos_end = 0, data_start = 0;
  std::vector<uint64_t> offsets;
};

uint64_t AlignTo(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

Built Build(const FileSpec& spec) {
  Built out;
  Bytes f;
  f.b.insert(f.b.end(), spec.magic.begin(), spec.magic.end());
  f.Put<uint32_t>(spec.version);
  f.Put<uint64_t>(spec.n_tensors.value_or(spec.tensors.size()));
  f.Put<uint64_t>(spec.n_kv.value_or(spec.kvs.size() + (spec.write_alignment_key ? 1 : 0)));
  out.header_end = f.b.size();
  if (spec.write_alignment_key)
    f.Append(Kv("general.alignment", U32, Val<uint32_t>(spec.alignment)));
  for (const Bytes& kv : spec.kvs) f.Append(kv);
  out.kv_end = f.b.size();
  uint64_t running = 0;
  for (const TensorSpec& t : spec.tensors) {
    const uint64_t off = t.offset.value_or(AlignTo(running, spec.alignment));
    out.offsets.push_back(off);
    running = off + t.data.size();
    f.Str(t.name).Put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) f.Put<int64_t>(d);
    f.Put<uint32_t>(t.type).Put<uint64_t>(off);
  }
  out.infos_end = f.b.size();
  out.data_start = AlignTo(out.infos_end, spec.alignment);
  f.b.resize(out.data_start, 0);
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const auto& d = spec.tensors[i].data;
    const size_t at = out.data_start + out.offsets[i];
    if (f.b.size() < at + d.size()) f.b.resize(at + d.size(), 0);
    std::copy(d.begin(), d.end(), f.b.begin() + at);
  }
  out.bytes = std::move(f.b);
  return out;
}

// ---- float64 references for the synthetic tensors ----

double HalfValue(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int e = (h >> 10) & 31, m = h & 1023;
  if (e == 0) return sign * std::ldexp(static_cast<double>(m), -24);
  return sign * std::ldexp(1.0 + m / 1024.0, e - 15);
}

// Q4_1 element e of a 20-byte block: lo/hi nibble of qs[e % 16] * d + m.
double RefQ4_1(const uint8_t* b, int e) {
  const double d = HalfValue(static_cast<uint16_t>(b[0] | (b[1] << 8)));
  const double m = HalfValue(static_cast<uint16_t>(b[2] | (b[3] << 8)));
  const uint8_t q = b[4 + e % 16];
  return (e < 16 ? q % 16 : q / 16) * d + m;
}

std::vector<uint8_t> FloatBytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Random Q4_1 blocks with finite normal f16 d and m.
std::vector<uint8_t> RandomQ4_1(int nblocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255), e(8, 17), m(0, 1023), s(0, 1);
  std::vector<uint8_t> v(20 * nblocks);
  for (auto& x : v) x = static_cast<uint8_t>(byte(rng));
  for (int blk = 0; blk < nblocks; ++blk) {
    for (int k = 0; k < 2; ++k) {
      const uint16_t h = static_cast<uint16_t>((s(rng) << 15) | (e(rng) << 10) | m(rng));
      v[20 * blk + 2 * k] = static_cast<uint8_t>(h & 0xff);
      v[20 * blk + 2 * k + 1] = static_cast<uint8_t>(h >> 8);
    }
  }
  return v;
}

std::vector<float> F32Values() {  // 15 values of the (3, 5) F32 tensor
  std::vector<float> v;
  for (int i = 0; i < 15; ++i) v.push_back(static_cast<float>(i) * 0.25f - 1.0f);
  return v;
}

// The standard synthetic file: metadata of every type and two tensors (F32 ne [5,3] and
// Q4_1 ne [64,2]).
FileSpec StandardSpec(uint32_t alignment = 32, bool write_alignment_key = false) {
  FileSpec s;
  s.alignment = alignment;
  s.write_alignment_key = write_alignment_key;
  s.kvs.push_back(Kv("t.u8", U8, Val<uint8_t>(200)));
  s.kvs.push_back(Kv("t.i8", I8, Val<int8_t>(-100)));
  s.kvs.push_back(Kv("t.u16", U16, Val<uint16_t>(60000)));
  s.kvs.push_back(Kv("t.i16", I16, Val<int16_t>(-30000)));
  s.kvs.push_back(Kv("t.u32", U32, Val<uint32_t>(4000000000u)));
  s.kvs.push_back(Kv("t.i32", I32, Val<int32_t>(-2000000000)));
  s.kvs.push_back(Kv("t.f32", F32, Val<float>(1.5f)));
  s.kvs.push_back(Kv("t.bool", BOOL, Val<uint8_t>(1)));
  s.kvs.push_back(Kv("t.str", STR, StrVal("h\xc3\xa9llo w\xc3\xb6rld")));
  s.kvs.push_back(Kv("t.u64", U64, Val<uint64_t>((uint64_t{1} << 40) + 3)));
  s.kvs.push_back(Kv("t.i64", I64, Val<int64_t>(-(int64_t{1} << 40) - 5)));
  s.kvs.push_back(Kv("t.f64", F64, Val<double>(0.1)));
  s.kvs.push_back(Kv("t.u64max", U64, Val<uint64_t>(std::numeric_limits<uint64_t>::max())));
  s.kvs.push_back(
      Kv("t.arr.i32", ARR, ArrHeader(I32, 3).Put<int32_t>(1).Put<int32_t>(-2).Put<int32_t>(3)));
  s.kvs.push_back(Kv("t.arr.str", ARR, ArrHeader(STR, 3).Str("a").Str("").Str("ccc")));
  s.kvs.push_back(Kv("t.arr.f32", ARR, ArrHeader(F32, 2).Put<float>(0.5f).Put<float>(-2.25f)));
  s.kvs.push_back(Kv("t.arr.f64", ARR, ArrHeader(F64, 1).Put<double>(1e300)));
  s.kvs.push_back(
      Kv("t.arr.bool", ARR, ArrHeader(BOOL, 3).Put<uint8_t>(1).Put<uint8_t>(0).Put<uint8_t>(1)));
  s.kvs.push_back(Kv("t.arr.u8", ARR, ArrHeader(U8, 2).Put<uint8_t>(0).Put<uint8_t>(255)));
  s.kvs.push_back(Kv("t.arr.u64", ARR, ArrHeader(U64, 1).Put<uint64_t>(~uint64_t{0})));
  s.kvs.push_back(Kv("t.arr.empty", ARR, ArrHeader(U32, 0)));
  s.tensors.push_back({"t.weight.f32", {5, 3}, 0, FloatBytes(F32Values()), std::nullopt});
  s.tensors.push_back({"t.weight.q41", {64, 2}, 3, RandomQ4_1(4, 42), std::nullopt});
  return s;
}

// Writes `bytes` to a fresh temp file and returns its path.
std::string WriteTemp(const std::vector<uint8_t>& bytes, const std::string& tag) {
  static int counter = 0;
  const std::string path = ::testing::TempDir() + "/gguf_test_" + std::to_string(::getpid()) + "_" +
                           std::to_string(counter++) + "_" + tag + ".gguf";
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

absl::StatusOr<GgufFile> OpenBytes(const std::vector<uint8_t>& bytes, const std::string& tag) {
  const std::string path = WriteTemp(bytes, tag);
  absl::StatusOr<GgufFile> f = GgufFile::Open(path);
  std::remove(path.c_str());
  return f;
}

absl::Status OpenStatus(const FileSpec& spec, const std::string& tag) {
  return OpenBytes(Build(spec).bytes, tag).status();
}

// ---------------------------------------------------------------------------------------
// Synthetic file read back exactly.

class GgufSyntheticTest : public ::testing::TestWithParam<std::pair<uint32_t, bool>> {};

TEST_P(GgufSyntheticTest, ReadsBackEveryTypeAndTensor) {
  const auto [alignment, write_key] = GetParam();
  const FileSpec spec = StandardSpec(alignment, write_key);
  const Built built = Build(spec);
  absl::StatusOr<GgufFile> or_f = OpenBytes(built.bytes, "synthetic");
  ASSERT_TRUE(or_f.ok()) << or_f.status();
  const GgufFile& f = *or_f;

  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), alignment);
  EXPECT_EQ(f.data_start(), built.data_start);
  EXPECT_EQ(f.data_start() % alignment, 0u);
  ASSERT_EQ(f.keys().size(), spec.kvs.size() + (write_key ? 1 : 0));
  EXPECT_EQ(f.keys()[write_key ? 1 : 0], "t.u8");
  EXPECT_EQ(f.keys().back(), "t.arr.empty");
  if (write_key) EXPECT_EQ(*f.GetInt("general.alignment"), alignment);

  // Scalars of every type.
  EXPECT_EQ(*f.GetInt("t.u8"), 200);
  EXPECT_EQ(*f.GetInt("t.i8"), -100);
  EXPECT_EQ(*f.GetInt("t.u16"), 60000);
  EXPECT_EQ(*f.GetInt("t.i16"), -30000);
  EXPECT_EQ(*f.GetInt("t.u32"), 4000000000LL);
  EXPECT_EQ(*f.GetInt("t.i32"), -2000000000LL);
  EXPECT_EQ(*f.GetFloat("t.f32"), 1.5);
  EXPECT_EQ(*f.GetBool("t.bool"), true);
  EXPECT_EQ(*f.GetString("t.str"), "h\xc3\xa9llo w\xc3\xb6rld");
  EXPECT_EQ(*f.GetInt("t.u64"), (int64_t{1} << 40) + 3);
  EXPECT_EQ(*f.GetInt("t.i64"), -(int64_t{1} << 40) - 5);
  EXPECT_EQ(*f.GetFloat("t.f64"), 0.1);
  EXPECT_EQ(f.FindKey("t.u64max")->type, GgufValueType::kUint64);
  EXPECT_EQ(static_cast<uint64_t>(f.FindKey("t.u64max")->ints[0]),
            std::numeric_limits<uint64_t>::max());
  // Arrays.
  EXPECT_EQ(*f.GetIntArray("t.arr.i32"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f.GetStringArray("t.arr.str"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(*f.GetFloatArray("t.arr.f32"), (std::vector<double>{0.5, -2.25}));
  EXPECT_EQ(*f.GetFloatArray("t.arr.f64"), (std::vector<double>{1e300}));
  EXPECT_EQ(f.FindKey("t.arr.bool")->bools, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(f.FindKey("t.arr.bool")->size(), 3u);
  EXPECT_EQ(*f.GetIntArray("t.arr.u8"), (std::vector<int64_t>{0, 255}));
  EXPECT_TRUE(f.GetIntArray("t.arr.empty")->empty());
  EXPECT_EQ(f.FindKey("t.arr.empty")->array_type, GgufValueType::kUint32);

  // Missing keys and type mismatches.
  EXPECT_FALSE(f.HasKey("nope"));
  EXPECT_EQ(f.GetInt("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.GetString("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(f.GetInt("t.f32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetInt("t.arr.i32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetFloat("t.i32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetString("t.arr.str").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetBool("t.u8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetStringArray("t.arr.i32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetIntArray("t.arr.f32").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetIntArray("t.u8").status().code(), absl::StatusCode::kInvalidArgument);
  const absl::Status big = f.GetInt("t.u64max").status();
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(big.message()), HasSubstr("18446744073709551615"));
  EXPECT_EQ(f.GetIntArray("t.arr.u64").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(f.GetInt("t.f32").status().message()), HasSubstr("FLOAT32"));

  // Tensor infos.
  ASSERT_EQ(f.tensors().size(), 2u);
  const GgufTensorInfo* tf = f.FindTensor("t.weight.f32");
  const GgufTensorInfo* tq = f.FindTensor("t.weight.q41");
  ASSERT_NE(tf, nullptr);
  ASSERT_NE(tq, nullptr);
  EXPECT_EQ(f.FindTensor("missing"), nullptr);
  EXPECT_EQ(tf->ne, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(tf->TorchShape(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(tf->type, GgmlType::kF32);
  EXPECT_EQ(tf->offset, 0u);
  EXPECT_EQ(tf->nbytes, 60u);
  EXPECT_EQ(tf->numel(), 15);
  EXPECT_EQ(tq->ne, (std::vector<int64_t>{64, 2}));
  EXPECT_EQ(tq->TorchShape(), (std::vector<int64_t>{2, 64}));
  EXPECT_EQ(tq->type, GgmlType::kQ4_1);
  EXPECT_EQ(tq->offset, AlignTo(60, alignment));
  EXPECT_EQ(tq->nbytes, 80u);  // 4 blocks * 20 bytes
  EXPECT_EQ(tq->num_rows(), 2);

  // Raw bytes and values.
  const absl::Span<const uint8_t> raw = f.TensorData(*tq);
  EXPECT_EQ(std::vector<uint8_t>(raw.begin(), raw.end()), spec.tensors[1].data);
  absl::StatusOr<std::vector<float>> vf = f.ReadTensorF32("t.weight.f32");
  ASSERT_TRUE(vf.ok()) << vf.status();
  EXPECT_EQ(*vf, F32Values());
  absl::StatusOr<std::vector<float>> vq = f.ReadTensorF32("t.weight.q41");
  ASSERT_TRUE(vq.ok()) << vq.status();
  ASSERT_EQ(vq->size(), 128u);
  for (int i = 0; i < 128; ++i) {
    const double want = RefQ4_1(spec.tensors[1].data.data() + 20 * (i / 32), i % 32);
    EXPECT_NEAR((*vq)[i], want, 1e-6 * (1 + std::abs(want))) << i;
  }
  absl::StatusOr<std::vector<float>> row1 = f.ReadRowsF32("t.weight.q41", 1, 1);
  ASSERT_TRUE(row1.ok());
  EXPECT_EQ(*row1, std::vector<float>(vq->begin() + 64, vq->end()));
  EXPECT_EQ(f.ReadRowsF32("t.weight.q41", 1, 2).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(f.ReadRowsF32("t.weight.q41", -1, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(f.ReadTensorF32("missing").status().code(), absl::StatusCode::kNotFound);

  // FromBytes parses the same bytes identically.
  absl::StatusOr<GgufFile> m = GgufFile::FromBytes(built.bytes);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(*m->ReadTensorF32("t.weight.q41"), *vq);
  // Moving keeps the mapping valid.
  GgufFile moved = std::move(*or_f);
  EXPECT_EQ(*moved.ReadTensorF32("t.weight.f32"), F32Values());
}

INSTANTIATE_TEST_SUITE_P(Alignments, GgufSyntheticTest,
                         ::testing::Values(std::make_pair(32u, false), std::make_pair(32u, true),
                                           std::make_pair(8u, true), std::make_pair(128u, true)),
                         [](const auto& info) {
                           return "A" + std::to_string(info.param.first) +
                                  (info.param.second ? "_key" : "_default");
                         });

TEST(GgufTest, Version2AndEmptyFileWithoutTensors) {
  FileSpec s = StandardSpec();
  s.version = 2;
  absl::StatusOr<GgufFile> f = OpenBytes(Build(s).bytes, "v2");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 2u);
  FileSpec e;
  e.kvs.push_back(Kv("k", U8, Val<uint8_t>(1)));
  // No tensors: the file may end right after the metadata (no padding).
  Built eb = Build(e);
  eb.bytes.resize(eb.infos_end);
  absl::StatusOr<GgufFile> g = OpenBytes(eb.bytes, "empty");
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->tensors().empty());
}

TEST(GgufTest, ZeroDimAndTwoDimF16Tensor) {
  FileSpec s;
  std::vector<uint8_t> h = {0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0x01, 0x00};  // 1, -2, .5, 2^-24
  s.tensors.push_back({"scalar", {}, 0, FloatBytes({7.5f}), std::nullopt});
  s.tensors.push_back({"half", {2, 2}, 1, h, std::nullopt});
  absl::StatusOr<GgufFile> f = OpenBytes(Build(s).bytes, "f16");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->FindTensor("scalar")->numel(), 1);
  EXPECT_TRUE(f->FindTensor("scalar")->TorchShape().empty());
  EXPECT_EQ(*f->ReadTensorF32("scalar"), std::vector<float>{7.5f});
  EXPECT_EQ(*f->ReadTensorF32("half"),
            (std::vector<float>{1.f, -2.f, .5f, static_cast<float>(std::ldexp(1.0, -24))}));
}

TEST(GgufTest, MissingFileIsNotFound) {
  EXPECT_EQ(GgufFile::Open("/nonexistent/dir/model.gguf").status().code(),
            absl::StatusCode::kNotFound);
}

// ---------------------------------------------------------------------------------------
// Corrupt files: one test per failure mode.

TEST(GgufCorruptTest, TruncatedAtEveryStage) {
  const Built built = Build(StandardSpec(64, true));
  const size_t size = built.bytes.size();
  const std::vector<std::pair<size_t, std::string>> cuts = {
      {0, "empty"},
      {3, "magic"},
      {6, "version"},
      {16, "counts"},
      {built.header_end + 5, "first key length"},
      {built.header_end + 12, "first key"},
      {built.kv_end - 1, "last value"},
      {built.kv_end + 10, "tensor infos"},
      {built.infos_end - 3, "last offset"},
      {built.infos_end, "before padding"},
      {built.data_start + 10, "data"},
      {size - 1, "last byte"},
  };
  for (const auto& [cut, stage] : cuts) {
    ASSERT_LT(cut, size);
    std::vector<uint8_t> b(built.bytes.begin(), built.bytes.begin() + cut);
    const absl::Status s = OpenBytes(b, "trunc").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << stage << ": " << s;
    // Messages state the actual size; truncations inside fixed-size fields and inside the data
    // also state the expected size.
    EXPECT_THAT(std::string(s.message()), HasSubstr(std::to_string(cut))) << stage << ": " << s;
    if (cut >= built.data_start) {
      EXPECT_THAT(std::string(s.message()),
                  HasSubstr("should be at least " + std::to_string(size) + " bytes"))
          << s;
    }
  }
  const absl::Status s16 = OpenBytes({built.bytes.begin(), built.bytes.begin() + 16}, "t").status();
  EXPECT_THAT(std::string(s16.message()), HasSubstr("should be at least 24 bytes, but it is 16"));
}

TEST(GgufCorruptTest, BadMagic) {
  FileSpec s = StandardSpec();
  s.magic = "GGML";
  const absl::Status st = OpenStatus(s, "magic");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("47 47 4d 4c"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("not a GGUF file"));
}

TEST(GgufCorruptTest, BadVersion) {
  for (uint32_t v : {0u + 1u, 4u, 0xffffu}) {
    FileSpec s = StandardSpec();
    s.version = v;
    const absl::Status st = OpenStatus(s, "version");
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << v;
    EXPECT_THAT(std::string(st.message()), HasSubstr("version " + std::to_string(v)));
  }
}

TEST(GgufCorruptTest, BigEndianVersion) {
  FileSpec s = StandardSpec();
  s.version = 0x03000000u;  // version 3 written big-endian
  const absl::Status st = OpenStatus(s, "bigendian");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("big-endian"));
}

TEST(GgufCorruptTest, UnknownTensorType) {
  FileSpec s = StandardSpec();
  s.tensors[1].type = 99;
  const absl::Status st = OpenStatus(s, "type");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), HasSubstr("'t.weight.q41'"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("type id 99"));
}

TEST(GgufCorruptTest, Ne0NotMultipleOfBlock) {
  FileSpec s = StandardSpec();
  s.tensors[1].ne = {48, 2};  // Q4_1 blocks hold 32 elements
  const absl::Status st = OpenStatus(s, "ne0");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("ne[0] = 48"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("block size 32"));
}

TEST(GgufCorruptTest, AbsurdTensorCount) {
  FileSpec s = StandardSpec();
  s.n_tensors = uint64_t{1} << 60;
  const absl::Status st = OpenStatus(s, "ntensors");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("tensor count 1152921504606846976"));
}

TEST(GgufCorruptTest, AbsurdKvCount) {
  FileSpec s = StandardSpec();
  s.n_kv = ~uint64_t{0};
  const absl::Status st = OpenStatus(s, "nkv");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("metadata count"));
}

TEST(GgufCorruptTest, AbsurdStringLength) {
  FileSpec s = StandardSpec();
  Bytes bad;
  bad.Put<uint64_t>(uint64_t{1} << 62);  // key length far beyond the file
  s.kvs.insert(s.kvs.begin(), bad);
  const absl::Status st = OpenStatus(s, "strlen");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("has length 4611686018427387904"));
}

TEST(GgufCorruptTest, AbsurdStringValueLength) {
  FileSpec s = StandardSpec();
  s.kvs[8] = Kv("t.str", STR, Val<uint64_t>(~uint64_t{0} - 3));
  const absl::Status st = OpenStatus(s, "strval");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("value of metadata key 't.str'"));
}

TEST(GgufCorruptTest, AbsurdArrayLength) {
  FileSpec s = StandardSpec();
  s.kvs.push_back(Kv("t.arr.huge", ARR, ArrHeader(I32, uint64_t{1} << 61)));
  const absl::Status st = OpenStatus(s, "arrlen");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("'t.arr.huge' claims 2305843009213693952"));
}

TEST(GgufCorruptTest, AbsurdStringArrayLength) {
  FileSpec s = StandardSpec();
  s.kvs.push_back(Kv("t.arr.strs", ARR, ArrHeader(STR, uint64_t{1} << 59)));
  EXPECT_EQ(OpenStatus(s, "strarr").code(), absl::StatusCode::kDataLoss);
}

TEST(GgufCorruptTest, UnknownValueType) {
  FileSpec s = StandardSpec();
  s.kvs.push_back(Kv("t.bad", 13, Val<uint32_t>(0)));
  const absl::Status st = OpenStatus(s, "valtype");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("value type 13"));
}

TEST(GgufCorruptTest, NestedArray) {
  FileSpec s = StandardSpec();
  s.kvs.push_back(Kv("t.nested", ARR, ArrHeader(ARR, 1).Append(ArrHeader(U8, 0))));
  const absl::Status st = OpenStatus(s, "nested");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("nested"));
}

TEST(GgufCorruptTest, DuplicateKey) {
  FileSpec s = StandardSpec();
  s.kvs.push_back(Kv("t.u8", U8, Val<uint8_t>(1)));
  const absl::Status st = OpenStatus(s, "dupkey");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("duplicate metadata key 't.u8'"));
}

TEST(GgufCorruptTest, DuplicateTensorName) {
  FileSpec s = StandardSpec();
  s.tensors[1].name = "t.weight.f32";
  const absl::Status st = OpenStatus(s, "dupname");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("duplicate tensor name 't.weight.f32'"));
}

TEST(GgufCorruptTest, TensorNameTooLong) {
  FileSpec s = StandardSpec();
  s.tensors[0].name = std::string(64, 'x');
  const absl::Status st = OpenStatus(s, "longname");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("64 bytes"));
  s.tensors[0].name = std::string(63, 'x');
  EXPECT_TRUE(OpenStatus(s, "name63").ok());
}

TEST(GgufCorruptTest, TooManyDims) {
  FileSpec s = StandardSpec();
  s.tensors[0].ne = {5, 3, 1, 1, 1};
  const absl::Status st = OpenStatus(s, "ndims");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("n_dims 5"));
}

TEST(GgufCorruptTest, NegativeNe) {
  FileSpec s = StandardSpec();
  s.tensors[0].ne = {5, -3};
  const absl::Status st = OpenStatus(s, "negne");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("ne[1] = -3"));
}

TEST(GgufCorruptTest, NeProductOverflows) {
  FileSpec s = StandardSpec();
  s.tensors[0].ne = {int64_t{1} << 32, int64_t{1} << 32};
  const absl::Status st = OpenStatus(s, "overflow");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("overflow"));
}

TEST(GgufCorruptTest, MisalignedOffset) {
  FileSpec s = StandardSpec();
  s.tensors[1].offset = 70;
  const absl::Status st = OpenStatus(s, "misaligned");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("not a multiple of the alignment 32"));
}

TEST(GgufCorruptTest, OverlappingTensors) {
  FileSpec s = StandardSpec();
  s.tensors[1].offset = 32;  // the F32 tensor occupies bytes 0..60
  const absl::Status st = OpenStatus(s, "overlap");
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()), HasSubstr("overlaps"));
}

TEST(GgufCorruptTest, TensorDataPastEndOfFile) {
  FileSpec s = StandardSpec();
  const Built ok = Build(s);
  std::vector<uint8_t> b = ok.bytes;
  // Rewrite the Q4_1 offset (the last 8 bytes of the tensor infos) to point far away.
  const uint64_t far = uint64_t{1} << 40;
  std::memcpy(b.data() + ok.infos_end - 8, &far, 8);
  const absl::Status st = OpenBytes(b, "far").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("should be at least " + std::to_string(ok.data_start + far + 80)));
}

TEST(GgufCorruptTest, BadAlignmentValue) {
  for (uint32_t a : {0u, 3u, 48u}) {
    FileSpec s = StandardSpec(32, false);
    s.kvs.insert(s.kvs.begin(), Kv("general.alignment", U32, Val<uint32_t>(a)));
    const absl::Status st = OpenStatus(s, "align");
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << a;
    EXPECT_THAT(std::string(st.message()), HasSubstr("power of two")) << a;
  }
  FileSpec s = StandardSpec(32, false);
  s.kvs.insert(s.kvs.begin(), Kv("general.alignment", U64, Val<uint64_t>(32)));
  EXPECT_EQ(OpenStatus(s, "align64").code(), absl::StatusCode::kDataLoss);
}

// Dequantising a type without a dequantiser is kUnimplemented (the file itself parses).
TEST(GgufTest, UndequantizableTypeParsesButReadIsUnimplemented) {
  FileSpec s;
  s.tensors.push_back({"q2k", {256}, 10, std::vector<uint8_t>(84, 0), std::nullopt});
  absl::StatusOr<GgufFile> f = OpenBytes(Build(s).bytes, "q2k");
  ASSERT_TRUE(f.ok()) << f.status();
  const absl::Status st = f->ReadTensorF32("q2k").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), HasSubstr("Q2_K"));
}

// ---------------------------------------------------------------------------------------
// HF names and Q/K un-permutation.

TEST(HfNamesTest, MapsEveryLlamaNameBothWays) {
  const std::vector<std::string> names = LlamaHfTensorNames(30);
  ASSERT_EQ(names.size(), 272u);
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_EQ(names[1], "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(names.back(), "model.norm.weight");
  std::set<std::string> gguf;
  for (const std::string& hf : names) {
    absl::StatusOr<std::string> g = HfToGgufName(hf);
    ASSERT_TRUE(g.ok()) << hf << ": " << g.status();
    EXPECT_EQ(*GgufToHfName(*g), hf);
    gguf.insert(*g);
  }
  EXPECT_EQ(gguf.size(), 272u);
  // docs/formats.md §3 table.
  const std::map<std::string, std::string> table = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.layers.12.input_layernorm.weight", "blk.12.attn_norm.weight"},
      {"model.layers.12.post_attention_layernorm.weight", "blk.12.ffn_norm.weight"},
      {"model.layers.12.self_attn.q_proj.weight", "blk.12.attn_q.weight"},
      {"model.layers.12.self_attn.k_proj.weight", "blk.12.attn_k.weight"},
      {"model.layers.12.self_attn.v_proj.weight", "blk.12.attn_v.weight"},
      {"model.layers.12.self_attn.o_proj.weight", "blk.12.attn_output.weight"},
      {"model.layers.12.mlp.gate_proj.weight", "blk.12.ffn_gate.weight"},
      {"model.layers.12.mlp.up_proj.weight", "blk.12.ffn_up.weight"},
      {"model.layers.12.mlp.down_proj.weight", "blk.12.ffn_down.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
      {"model.layers.3.self_attn.q_proj.bias", "blk.3.attn_q.bias"},
  };
  for (const auto& [hf, g] : table) {
    EXPECT_EQ(*HfToGgufName(hf), g);
    EXPECT_EQ(*GgufToHfName(g), hf);
  }
  for (const char* bad :
       {"", "foo", "model.layers.x.self_attn.q_proj.weight",
        "model.layers.01.self_attn.q_proj.weight", "model.layers.1.foo.weight",
        "model.layers..self_attn.q_proj.weight", "model.norm", "blk.0.attn_q.weight"}) {
    EXPECT_EQ(HfToGgufName(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(GgufToHfName("model.norm.weight").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(LlamaHfTensorNames(-1).empty());
  EXPECT_EQ(LlamaHfTensorNames(0).size(), 2u);
}

// HF row of GGUF-ordered row data, from the reshape definition of llama.cpp's permute
// (S5): HF w.reshape(n_head, 2, hd/2, cols).swapaxes(1, 2) gives GGUF order, i.e. GGUF
// index (h, i, j) holds HF index (h, j, i). Returns the GGUF row stored at HF row r.
int64_t GgufRowOfHfRow(int64_t r, int64_t hd) {
  const int64_t h = r / hd, j = (r % hd) / (hd / 2), i = (r % hd) % (hd / 2);
  return h * hd + i * 2 + j;
}

TEST(HfNamesTest, UnpermutesSyntheticQAndK) {
  // q: 3 heads of hd 8 (24 rows), k: 1 kv head (8 rows); cols 5. Value = 100*row + col in
  // GGUF order (exact in f32).
  const int64_t n_head = 3, n_kv = 1, hd = 8, cols = 5;
  auto make = [&](int64_t rows) {
    std::vector<float> v;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) v.push_back(static_cast<float>(100 * r + c));
    return v;
  };
  FileSpec s;
  s.tensors.push_back(
      {"blk.0.attn_q.weight", {cols, n_head * hd}, 0, FloatBytes(make(24)), std::nullopt});
  s.tensors.push_back(
      {"blk.0.attn_k.weight", {cols, n_kv * hd}, 0, FloatBytes(make(8)), std::nullopt});
  s.tensors.push_back(
      {"blk.0.attn_v.weight", {cols, n_kv * hd}, 0, FloatBytes(make(8)), std::nullopt});
  absl::StatusOr<GgufFile> f = OpenBytes(Build(s).bytes, "perm");
  ASSERT_TRUE(f.ok()) << f.status();
  for (const auto& [name, rows] : std::vector<std::pair<std::string, int64_t>>{
           {"model.layers.0.self_attn.q_proj.weight", 24},
           {"model.layers.0.self_attn.k_proj.weight", 8}}) {
    std::vector<int64_t> shape;
    absl::StatusOr<std::vector<float>> w = LoadHfTensor(*f, name, n_head, n_kv, &shape);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(shape, (std::vector<int64_t>{rows, cols}));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const double want = 100.0 * GgufRowOfHfRow(r, hd) + c;
        ASSERT_EQ(static_cast<double>((*w)[r * cols + c]), want) << name << " " << r << "," << c;
      }
    }
    // Permute is the exact inverse.
    std::vector<float> back;
    ASSERT_TRUE(PermuteQkRows(*w, rows, cols, rows / hd, &back).ok());
    EXPECT_EQ(back, make(rows));
  }
  // v is returned as stored.
  EXPECT_EQ(*LoadHfTensor(*f, "model.layers.0.self_attn.v_proj.weight", n_head, n_kv, nullptr),
            make(8));
  // Head counts that do not split the rows into even heads.
  EXPECT_EQ(
      LoadHfTensor(*f, "model.layers.0.self_attn.q_proj.weight", 5, n_kv, nullptr).status().code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadHfTensor(*f, "model.layers.0.self_attn.k_proj.weight", n_head, 8, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);  // hd = 1 is odd
  EXPECT_EQ(LoadHfTensor(*f, "model.layers.0.self_attn.k_proj.weight", n_head, 0, nullptr)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      LoadHfTensor(*f, "model.layers.1.self_attn.q_proj.weight", 3, 1, nullptr).status().code(),
      absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadHfTensor(*f, "lm_head.weight", 3, 1, nullptr).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadHfTensor(*f, "bogus", 3, 1, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> dst;
  EXPECT_EQ(UnpermuteQkRows(make(24), 24, 4, 3, &dst).code(),
            absl::StatusCode::kInvalidArgument);  // size mismatch
}

// Quantised rows move whole (docs/formats.md §3): un-permuting the dequantised Q4_1 tensor equals
// dequantising the rows in un-permuted order.
TEST(HfNamesTest, UnpermutesQuantizedRows) {
  const int64_t n_head = 2, hd = 4, cols = 64;  // 8 rows of 2 Q4_1 blocks
  FileSpec s;
  s.tensors.push_back(
      {"blk.5.attn_q.weight", {cols, n_head * hd}, 3, RandomQ4_1(16, 7), std::nullopt});
  const std::vector<uint8_t> raw = s.tensors[0].data;
  absl::StatusOr<GgufFile> f = OpenBytes(Build(s).bytes, "permq");
  ASSERT_TRUE(f.ok()) << f.status();
  absl::StatusOr<std::vector<float>> w =
      LoadHfTensor(*f, "model.layers.5.self_attn.q_proj.weight", n_head, 1, nullptr);
  ASSERT_TRUE(w.ok()) << w.status();
  for (int64_t r = 0; r < 8; ++r) {
    const uint8_t* row = raw.data() + 40 * GgufRowOfHfRow(r, hd);
    for (int64_t c = 0; c < cols; ++c) {
      const double want = RefQ4_1(row + 20 * (c / 32), static_cast<int>(c % 32));
      EXPECT_NEAR((*w)[r * cols + c], want, 1e-6 * (1 + std::abs(want)));
    }
  }
}

// ---------------------------------------------------------------------------------------
// The real SmolLM2-135M-Instruct Q4_1 file.

class RealModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::access(kModelPath, R_OK) != 0) return;
    absl::StatusOr<GgufFile> f = GgufFile::Open(kModelPath);
    if (f.ok())
      file_ = new GgufFile(std::move(*f));
    else
      open_status_ = new absl::Status(f.status());
  }
  static void TearDownTestSuite() {
    delete file_;
    delete open_status_;
    file_ = nullptr;
    open_status_ = nullptr;
  }
  void SetUp() override {
    if (file_ == nullptr && open_status_ == nullptr) {
      GTEST_SKIP() << kModelPath << " is absent; download SmolLM2-135M-Instruct.Q4_1.gguf";
    }
    ASSERT_EQ(open_status_, nullptr) << *open_status_;
  }
  static nlohmann::json Oracle() {
    std::ifstream in(kOraclePath);
    EXPECT_TRUE(in.good()) << kOraclePath << " missing; run tests/oracle/make_gguf_oracle.py";
    return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  }
  static GgufFile* file_;
  static absl::Status* open_status_;
};
GgufFile* RealModelTest::file_ = nullptr;
absl::Status* RealModelTest::open_status_ = nullptr;

TEST_F(RealModelTest, StructureAndMetadata) {
  const GgufFile& f = *file_;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.tensors().size(), 272u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(*f.GetInt("llama.block_count"), 30);
  EXPECT_EQ(*f.GetInt("llama.context_length"), 8192);
  EXPECT_EQ(*f.GetInt("llama.embedding_length"), 576);
  EXPECT_EQ(*f.GetInt("llama.feed_forward_length"), 1536);
  EXPECT_EQ(*f.GetInt("llama.attention.head_count"), 9);
  EXPECT_EQ(*f.GetInt("llama.attention.head_count_kv"), 3);
  EXPECT_EQ(*f.GetInt("llama.vocab_size"), 49152);
  EXPECT_EQ(*f.GetInt("llama.rope.dimension_count"), 64);
  EXPECT_EQ(*f.GetFloat("llama.rope.freq_base"), 100000.0);
  EXPECT_NEAR(*f.GetFloat("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_EQ(*f.GetInt("general.file_type"), 3);
  EXPECT_EQ(*f.GetInt("general.quantization_version"), 2);
  EXPECT_EQ(*f.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f.GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(f.GetStringArray("tokenizer.ggml.tokens")->size(), 49152u);
  EXPECT_EQ(f.GetIntArray("tokenizer.ggml.token_type")->size(), 49152u);
  EXPECT_EQ(f.GetStringArray("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_EQ(*f.GetInt("tokenizer.ggml.padding_token_id"), 2);
  EXPECT_EQ(*f.GetBool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(*f.GetBool("tokenizer.ggml.add_space_prefix"), false);
  EXPECT_THAT(*f.GetString("tokenizer.chat_template"),
              HasSubstr("You are a helpful AI assistant named SmolLM, trained by Hugging Face"));

  std::map<GgmlType, int> counts;
  int64_t params = 0;
  for (const GgufTensorInfo& t : f.tensors()) {
    ++counts[t.type];
    params += t.numel();
  }
  EXPECT_EQ(counts[GgmlType::kF32], 61);
  EXPECT_EQ(counts[GgmlType::kQ4_1], 210);
  EXPECT_EQ(counts[GgmlType::kQ8_0], 1);
  EXPECT_EQ(params, 134515008);  // docs/formats.md §5
  const GgufTensorInfo* emb = f.FindTensor("token_embd.weight");
  ASSERT_NE(emb, nullptr);
  EXPECT_EQ(emb->type, GgmlType::kQ8_0);
  EXPECT_EQ(emb->TorchShape(), (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(f.FindTensor("output.weight"), nullptr);
  EXPECT_EQ(f.FindTensor("blk.0.attn_k.weight")->TorchShape(), (std::vector<int64_t>{192, 576}));
  EXPECT_EQ(f.FindTensor("blk.0.ffn_down.weight")->TorchShape(), (std::vector<int64_t>{576, 1536}));
}

TEST_F(RealModelTest, MatchesOracleStructure) {
  const nlohmann::json o = Oracle();
  ASSERT_FALSE(o.is_discarded());
  EXPECT_EQ(file_->keys(), o["keys"].get<std::vector<std::string>>());
  std::vector<std::string> names;
  for (const GgufTensorInfo& t : file_->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, o["tensor_names"].get<std::vector<std::string>>());
  for (const auto& [type, count] : o["type_counts"].items()) {
    int n = 0;
    for (const GgufTensorInfo& t : file_->tensors()) n += GgmlTypeName(t.type) == type;
    EXPECT_EQ(n, count.get<int>()) << type;
  }
  const std::vector<std::string> tokens = *file_->GetStringArray("tokenizer.ggml.tokens");
  const std::vector<int64_t> types = *file_->GetIntArray("tokenizer.ggml.token_type");
  for (const auto& t : o["tokens_sample"]) {
    const int id = t["id"].get<int>();
    EXPECT_EQ(tokens[id], t["token"].get<std::string>()) << id;
    EXPECT_EQ(types[id], t["type"].get<int64_t>()) << id;
  }
}

void ExpectMatchesSummary(const std::vector<float>& got, const nlohmann::json& e,
                          const std::string& what) {
  ASSERT_EQ(static_cast<int64_t>(got.size()), e["numel"].get<int64_t>()) << what;
  const auto first = e["first16"].get<std::vector<double>>();
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_NEAR(got[i], first[i], 1e-6) << what << " [" << i << "]";
  }
  const auto idx = e["sample_index"].get<std::vector<int64_t>>();
  const auto val = e["sample_value"].get<std::vector<double>>();
  ASSERT_EQ(idx.size(), val.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    EXPECT_NEAR(got[idx[k]], val[k], 1e-6) << what << " [" << idx[k] << "]";
  }
  double sum_abs = 0;
  for (float v : got) sum_abs += std::abs(static_cast<double>(v));
  const double want = e["sum_abs"].get<double>();
  EXPECT_NEAR(sum_abs, want, 1e-9 * want + 1e-9) << what;
}

TEST_F(RealModelTest, DequantMatchesGgufPyOracle) {
  const nlohmann::json o = Oracle();
  ASSERT_FALSE(o.is_discarded());
  ASSERT_GE(o["plain"].size(), 5u);
  for (const auto& e : o["plain"]) {
    const std::string name = e["name"].get<std::string>();
    const GgufTensorInfo* t = file_->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(GgmlTypeName(t->type), e["type"].get<std::string>());
    EXPECT_EQ(t->TorchShape(), e["torch_shape"].get<std::vector<int64_t>>());
    absl::StatusOr<std::vector<float>> got =
        file_->ReadRowsF32(name, e["row_begin"].get<int64_t>(), e["row_count"].get<int64_t>());
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectMatchesSummary(*got, e, name);
  }
  // The whole-tensor path agrees with the row path.
  absl::StatusOr<std::vector<float>> all = file_->ReadTensorF32("token_embd.weight");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 49152u * 576u);
  absl::StatusOr<std::vector<float>> last = file_->ReadRowsF32("token_embd.weight", 49148, 4);
  EXPECT_EQ(*last, std::vector<float>(all->end() - 4 * 576, all->end()));
}

TEST_F(RealModelTest, HfLayoutMatchesTransformersOracle) {
  const nlohmann::json o = Oracle();
  ASSERT_FALSE(o.is_discarded());
  ASSERT_GE(o["hf"].size(), 2u);
  for (const auto& e : o["hf"]) {
    const std::string hf = e["hf_name"].get<std::string>();
    std::vector<int64_t> shape;
    absl::StatusOr<std::vector<float>> got = LoadHfTensor(*file_, hf, 9, 3, &shape);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(shape, e["torch_shape"].get<std::vector<int64_t>>());
    ExpectMatchesSummary(*got, e, hf);
  }
}

TEST_F(RealModelTest, EveryHfTensorLoadsWithItsShape) {
  const std::map<std::string, std::vector<int64_t>> shapes = {
      // docs/formats.md §3
      {"self_attn.q_proj.weight", {576, 576}},   {"self_attn.k_proj.weight", {192, 576}},
      {"self_attn.v_proj.weight", {192, 576}},   {"self_attn.o_proj.weight", {576, 576}},
      {"mlp.gate_proj.weight", {1536, 576}},     {"mlp.up_proj.weight", {1536, 576}},
      {"mlp.down_proj.weight", {576, 1536}},     {"input_layernorm.weight", {576}},
      {"post_attention_layernorm.weight", {576}}};
  std::set<std::string> gguf_names;
  for (const GgufTensorInfo& t : file_->tensors()) gguf_names.insert(t.name);
  std::set<std::string> mapped;
  for (const std::string& hf : LlamaHfTensorNames(30)) mapped.insert(*HfToGgufName(hf));
  EXPECT_EQ(mapped, gguf_names);
  // Load layer 0 and 29 fully (others are covered by the name check above).
  for (const std::string& hf : LlamaHfTensorNames(30)) {
    if (hf.find("layers.0.") == std::string::npos && hf.find("layers.29.") == std::string::npos &&
        hf.rfind("model.layers", 0) == 0) {
      continue;
    }
    std::vector<int64_t> shape;
    absl::StatusOr<std::vector<float>> w = LoadHfTensor(*file_, hf, 9, 3, &shape);
    ASSERT_TRUE(w.ok()) << hf << ": " << w.status();
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    EXPECT_EQ(static_cast<int64_t>(w->size()), n);
    for (const auto& [suffix, want] : shapes) {
      if (hf.size() > suffix.size() &&
          hf.compare(hf.size() - suffix.size(), suffix.size(), suffix) == 0) {
        EXPECT_EQ(shape, want) << hf;
      }
    }
  }
  const absl::Status lm = LoadHfTensor(*file_, "lm_head.weight", 9, 3, nullptr).status();
  EXPECT_EQ(lm.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(lm.message()), HasSubstr("tied"));
}

}  // namespace
}  // namespace lspo::model
