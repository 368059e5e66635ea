// Tests of model/gguf_writer.h: the encoders against known bit patterns and against
// dequant.h's decoders, and whole files read back by model/gguf.h's reader.
#include "model/gguf_writer.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/dequant.h"
#include "model/gguf.h"

namespace lspo::model {
namespace {

std::string TempPath(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/gguf-writer-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

uint16_t U16At(const std::vector<uint8_t>& b, size_t i) {
  uint16_t v;
  std::memcpy(&v, b.data() + i, 2);
  return v;
}

// F16 and BF16 bit patterns of known values (IEEE 754 binary16; bf16 = the f32's high half,
// rounded to nearest even).
TEST(GgufEncodeTest, HalfAndBf16KnownBits) {
  const std::vector<float> x = {1.0f,
                                -2.0f,
                                65504.0f,
                                1e6f,
                                5.9604645e-8f /* 2^-24 */,
                                1.0009765625f /* 1 + 2^-10 */,
                                1.00048828125f /* tie -> 1 */};
  std::vector<uint8_t> h(x.size() * 2), b(x.size() * 2);
  ASSERT_TRUE(EncodeRow(GgmlType::kF16, x.data(), x.size(), h.data(), h.size()).ok());
  EXPECT_EQ(U16At(h, 0), 0x3C00);
  EXPECT_EQ(U16At(h, 2), 0xC000);
  EXPECT_EQ(U16At(h, 4), 0x7BFF);
  EXPECT_EQ(U16At(h, 6), 0x7C00);  // overflow -> inf
  EXPECT_EQ(U16At(h, 8), 0x0001);  // smallest subnormal
  EXPECT_EQ(U16At(h, 10), 0x3C01);
  EXPECT_EQ(U16At(h, 12), 0x3C00);  // halfway between 0x3C00 and 0x3C01: to even
  ASSERT_TRUE(EncodeRow(GgmlType::kBF16, x.data(), x.size(), b.data(), b.size()).ok());
  EXPECT_EQ(U16At(b, 0), 0x3F80);
  EXPECT_EQ(U16At(b, 2), 0xC000);
  EXPECT_EQ(U16At(b, 4), 0x4780);  // 65504 = 0x477FE000: low half 0xE000 > 0x8000 rounds up
}

// Q8_0 on a block with a known answer: x_j = j - 16 (max |x| = 16), d = 16/127 stored as f16,
// q_j = round((j - 16) * 127 / 16); a zero block has d = 0 and q = 0. The decoder gives each value
// back within half a step.
TEST(GgufEncodeTest, Q8_0BlocksMatchTheRuleAndDecodeWithinHalfAStep) {
  std::vector<float> x(64, 0.0f);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
  std::vector<uint8_t> q(68);
  ASSERT_TRUE(EncodeRow(GgmlType::kQ8_0, x.data(), 64, q.data(), q.size()).ok());
  const float d = 16.0f / 127.0f;
  uint16_t dh;
  std::memcpy(&dh, q.data(), 2);
  std::vector<float> back(64);
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ8_0, q.data(), q.size(), 64, back.data()).ok());
  const float d_stored = back[0] / static_cast<float>(static_cast<int8_t>(q[2]));
  EXPECT_NEAR(d_stored, d, d * 1e-3);
  for (int j = 0; j < 32; ++j) {
    EXPECT_EQ(static_cast<int8_t>(q[2 + j]),
              static_cast<int8_t>(std::round((j - 16) * 127.0 / 16.0)))
        << j;
    EXPECT_LE(std::fabs(back[j] - x[j]), d / 2 + 16.0f * 1e-3f) << j;
  }
  EXPECT_EQ(q[34], 0);
  EXPECT_EQ(q[35], 0);  // zero block: d = 0
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[36 + j], 0);

  // Random rows: every value within half a step of its block's scale.
  std::mt19937 rng(7);
  std::normal_distribution<float> n(0.0f, 3.0f);
  std::vector<float> r(32 * 50);
  for (float& v : r) v = n(rng);
  std::vector<uint8_t> rq(34 * 50);
  ASSERT_TRUE(EncodeRow(GgmlType::kQ8_0, r.data(), r.size(), rq.data(), rq.size()).ok());
  std::vector<float> rb(r.size());
  ASSERT_TRUE(DequantizeRow(GgmlType::kQ8_0, rq.data(), rq.size(), r.size(), rb.data()).ok());
  for (size_t blk = 0; blk < 50; ++blk) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(r[blk * 32 + j]));
    const float step = amax / 127.0f;
    for (int j = 0; j < 32; ++j) {
      EXPECT_LE(std::fabs(rb[blk * 32 + j] - r[blk * 32 + j]), step * (0.5f + 0.07f))
          << blk << " " << j;
    }
  }
}

TEST(GgufEncodeTest, RefusesWhatItCannotWrite) {
  std::vector<float> x(40, 1.0f);
  std::vector<uint8_t> out(200);
  EXPECT_EQ(EncodeRow(GgmlType::kQ8_0, x.data(), 40, out.data(), out.size()).code(),
            absl::StatusCode::kInvalidArgument);  // not whole blocks
  EXPECT_EQ(EncodeRow(GgmlType::kQ4_1, x.data(), 32, out.data(), out.size()).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(EncodeRow(GgmlType::kF32, x.data(), 40, out.data(), 100).code(),
            absl::StatusCode::kInvalidArgument);  // 160 bytes needed
}

// A file with every metadata type the writer sets and one tensor of each type, read back by the
// reader: same keys in the same order, same values, tensors at aligned offsets decoding to the
// written values (exact for F32, the encoder's rounding otherwise).
TEST(GgufWriterTest, AFileReadsBackThroughTheReader) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetUint32("llama.block_count", 3);
  w.SetInt32("test.negative", -5);
  w.SetFloat32("llama.rope.freq_base", 100000.0f);
  w.SetBool("tokenizer.ggml.add_bos_token", true);
  w.SetStringArray("tokenizer.ggml.tokens", {"a", "", "Ġb"});
  w.SetInt32Array("tokenizer.ggml.token_type", {1, 3, 4});
  w.SetFloat32Array("test.floats", {0.5f, -1.25f});
  w.SetUint32("llama.block_count", 4);  // a second set replaces the value, keeps the position
  ASSERT_TRUE(w.AddTensor("f32", {3, 5}, GgmlType::kF32).ok());
  ASSERT_TRUE(w.AddTensor("f16", {2, 3}, GgmlType::kF16).ok());
  ASSERT_TRUE(w.AddTensor("bf16", {7}, GgmlType::kBF16).ok());
  ASSERT_TRUE(w.AddTensor("q8", {2, 64}, GgmlType::kQ8_0).ok());
  EXPECT_EQ(w.AddTensor("f32", {1}, GgmlType::kF32).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("odd", {2, 40}, GgmlType::kQ8_0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("", {2}, GgmlType::kF32).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.AddTensor("zero", {0, 2}, GgmlType::kF32).code(), absl::StatusCode::kInvalidArgument);

  std::vector<std::vector<float>> values(4);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (size_t i = 0; i < 4; ++i) {
    const size_t n = std::vector<size_t>{15, 6, 7, 128}[i];
    for (size_t j = 0; j < n; ++j) values[i].push_back(u(rng));
  }
  const std::string path = TempPath("all.gguf");
  std::filesystem::remove(path);
  ASSERT_TRUE(w.WriteFile(path, [&](size_t i, std::vector<float>* v) {
                 *v = values[i];
                 return absl::OkStatus();
               }).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));

  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->keys(), (std::vector<std::string>{
                           "general.architecture", "llama.block_count", "test.negative",
                           "llama.rope.freq_base", "tokenizer.ggml.add_bos_token",
                           "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "test.floats"}));
  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetInt("llama.block_count"), 4);
  EXPECT_EQ(*f->GetInt("test.negative"), -5);
  EXPECT_EQ(*f->GetFloat("llama.rope.freq_base"), 100000.0);
  EXPECT_EQ(*f->GetBool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(*f->GetStringArray("tokenizer.ggml.tokens"), (std::vector<std::string>{"a", "", "Ġb"}));
  EXPECT_EQ(*f->GetIntArray("tokenizer.ggml.token_type"), (std::vector<int64_t>{1, 3, 4}));
  EXPECT_EQ(*f->GetFloatArray("test.floats"), (std::vector<double>{0.5, -1.25}));
  ASSERT_EQ(f->tensors().size(), 4u);
  EXPECT_EQ(f->tensors()[0].TorchShape(), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(f->tensors()[0].ne, (std::vector<int64_t>{5, 3}));
  EXPECT_EQ(f->tensors()[3].type, GgmlType::kQ8_0);
  for (const GgufTensorInfo& t : f->tensors()) EXPECT_EQ(t.offset % 32, 0u) << t.name;
  auto f32 = f->ReadTensorF32("f32");
  ASSERT_TRUE(f32.ok());
  EXPECT_EQ(*f32, values[0]);
  auto f16 = f->ReadTensorF32("f16");
  for (size_t j = 0; j < 6; ++j) EXPECT_NEAR((*f16)[j], values[1][j], 2.0 * std::ldexp(1.0, -11));
  auto bf16 = f->ReadTensorF32("bf16");
  for (size_t j = 0; j < 7; ++j) EXPECT_NEAR((*bf16)[j], values[2][j], 2.0 * std::ldexp(1.0, -8));
  auto q8 = f->ReadTensorF32("q8");
  for (size_t j = 0; j < 128; ++j) EXPECT_NEAR((*q8)[j], values[3][j], 2.0 / 127.0 * 0.55);
}

// A callback that fails, or gives the wrong number of values, leaves nothing at the path (and a
// file already there untouched).
TEST(GgufWriterTest, AFailedWriteLeavesNoFile) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  ASSERT_TRUE(w.AddTensor("a", {4}, GgmlType::kF32).ok());
  ASSERT_TRUE(w.AddTensor("b", {4}, GgmlType::kF32).ok());
  const std::string path = TempPath("failed.gguf");
  std::filesystem::remove(path);
  absl::Status st = w.WriteFile(path, [](size_t i, std::vector<float>* v) -> absl::Status {
    if (i == 1) return absl::DataLossError("disk said no");
    v->assign(4, 1.0f);
    return absl::OkStatus();
  });
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(st.message()).find("tensor 'b'"), std::string::npos) << st;
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));

  std::ofstream(path) << "keep";
  st = w.WriteFile(path, [](size_t, std::vector<float>* v) {
    v->assign(3, 1.0f);
    return absl::OkStatus();
  });
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("3 values given for 4 elements"), std::string::npos)
      << st;
  std::ifstream in(path);
  std::string kept;
  in >> kept;
  EXPECT_EQ(kept, "keep");

  EXPECT_EQ(w.WriteFile("/no/such/dir/x.gguf",
                        [](size_t, std::vector<float>* v) {
                          v->assign(4, 0.0f);
                          return absl::OkStatus();
                        })
                .code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lspo::model
