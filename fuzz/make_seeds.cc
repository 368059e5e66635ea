// make_seeds: writes the seed corpora of the fuzz targets from real inputs.
//   make_seeds MODEL.gguf EXAMPLES_DIR OUT_DIR
// MODEL.gguf is the real SmolLM2 checkpoint (scripts/setup fetches it); EXAMPLES_DIR holds the
// job specs (examples/). Writes, under OUT_DIR (the committed fuzz/corpus/, ~75 KB):
//   gguf/smollm2_header.gguf          the first 8 KiB of the model (a truncated file)
//   gguf/tiny_v3.gguf, tiny_v2.gguf   the model's non-tokenizer metadata + one row of one
//                                     tensor of each type it stores, and synthetic rows of the
//                                     other dequantisable types
//   tokenizer_gguf/smollm2_vocab_small.gguf   tokenizer metadata cut down to the byte symbols,
//                                     the special tokens and the tokens of the first merges
//   tokenizer/*.txt                   short texts (ASCII, digits, Unicode, ChatML, bad UTF-8)
//   tokenizer_hf/*.bin                the test tokenizer.json files of
//                                     tests/oracle/data/hf_tokenizers/ (read from the working
//                                     directory, the repository root) cut down to their first
//                                     300 ids + added tokens, then \0, tokenizer_config.json, \0,
//                                     a short text (the tokenizer_hf harness's input format)
//   safetensors/*.safetensors         small files written by WriteSafetensors (every dtype)
//   job_spec/*                        the example specs as YAML and as JSON (JobSpecToJson)
// Deterministic: the same model gives the same bytes.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "model/dequant.h"
#include "runtime/float16.h"
#include "model/gguf.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"
#include "spec/job_spec.h"

namespace fs = std::filesystem;
using lspo::model::GgmlType;
using lspo::model::GgufFile;
using lspo::model::GgufValue;
using lspo::model::GgufValueType;

namespace {

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "make_seeds: %s\n", msg.c_str());
  std::exit(1);
}

void WriteFile(const fs::path& path, const void* data, size_t n) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!out) Die(absl::StrCat("cannot write ", path.string()));
  std::printf("  %-50s %6zu bytes\n", path.string().c_str(), n);
}
void WriteFile(const fs::path& path, const std::string& s) { WriteFile(path, s.data(), s.size()); }

// Little-endian GGUF byte writer (docs/formats.md §1).
struct Writer {
  std::string b;
  template <typename T>
  void Put(T v) {
    b.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void Str(const std::string& s) {
    Put<uint64_t>(s.size());
    b += s;
  }
  // One element of type `t`, element i of `v`.
  void Elem(GgufValueType t, const GgufValue& v, size_t i) {
    switch (t) {
      case GgufValueType::kUint8: Put<uint8_t>(static_cast<uint8_t>(v.ints[i])); break;
      case GgufValueType::kInt8: Put<int8_t>(static_cast<int8_t>(v.ints[i])); break;
      case GgufValueType::kUint16: Put<uint16_t>(static_cast<uint16_t>(v.ints[i])); break;
      case GgufValueType::kInt16: Put<int16_t>(static_cast<int16_t>(v.ints[i])); break;
      case GgufValueType::kUint32: Put<uint32_t>(static_cast<uint32_t>(v.ints[i])); break;
      case GgufValueType::kInt32: Put<int32_t>(static_cast<int32_t>(v.ints[i])); break;
      case GgufValueType::kUint64: Put<uint64_t>(static_cast<uint64_t>(v.ints[i])); break;
      case GgufValueType::kInt64: Put<int64_t>(v.ints[i]); break;
      case GgufValueType::kFloat32: Put<float>(static_cast<float>(v.floats[i])); break;
      case GgufValueType::kFloat64: Put<double>(v.floats[i]); break;
      case GgufValueType::kBool: Put<uint8_t>(v.bools[i]); break;
      case GgufValueType::kString: Str(v.strings[i]); break;
      default: Die("unexpected value type");
    }
  }
  void Kv(const std::string& key, const GgufValue& v) {
    Str(key);
    Put<uint32_t>(static_cast<uint32_t>(v.type));
    if (v.is_array()) {
      Put<uint32_t>(static_cast<uint32_t>(v.array_type));
      Put<uint64_t>(v.size());
    }
    for (size_t i = 0; i < v.size(); ++i) Elem(v.elem_type(), v, i);
  }
};

GgufValue Scalar(GgufValueType t) {
  GgufValue v;
  v.type = t;
  return v;
}
GgufValue Array(GgufValueType elem) {
  GgufValue v;
  v.type = GgufValueType::kArray;
  v.array_type = elem;
  return v;
}
GgufValue StringValue(const std::string& s) {
  GgufValue v;
  v.type = GgufValueType::kString;
  v.strings = {s};
  return v;
}
GgufValue ScalarInt(GgufValueType t, int64_t x) {
  GgufValue v;
  v.type = t;
  v.ints = {x};
  return v;
}

struct Tensor {
  std::string name;
  std::vector<int64_t> ne;
  GgmlType type;
  std::string bytes;
};

// A GGUF file: version, the kv pairs in order, tensors (alignment 32).
std::string BuildGguf(uint32_t version, const std::vector<std::pair<std::string, GgufValue>>& kvs,
                      const std::vector<Tensor>& tensors) {
  Writer w;
  w.b = "GGUF";
  w.Put<uint32_t>(version);
  w.Put<uint64_t>(tensors.size());
  w.Put<uint64_t>(kvs.size());
  for (const auto& [k, v] : kvs) w.Kv(k, v);
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const Tensor& t : tensors) {
    w.Str(t.name);
    w.Put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) w.Put<uint64_t>(static_cast<uint64_t>(d));
    w.Put<uint32_t>(static_cast<uint32_t>(t.type));
    w.Put<uint64_t>(offset);
    offsets.push_back(offset);
    offset += (t.bytes.size() + 31) / 32 * 32;
  }
  w.b.resize((w.b.size() + 31) / 32 * 32, '\0');
  const size_t data_start = w.b.size();
  for (size_t i = 0; i < tensors.size(); ++i) {
    w.b.resize(data_start + offsets[i], '\0');
    w.b += tensors[i].bytes;
  }
  return w.b;
}

void MakeGgufSeeds(const GgufFile& model, const std::string& model_path, const fs::path& out) {
  // A truncated copy of the real header.
  {
    std::ifstream in(model_path, std::ios::binary);
    std::string head(8192, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    WriteFile(out / "gguf/smollm2_header.gguf", head);
  }
  // The model's metadata minus the (large) tokenizer arrays, plus a few values of the types
  // the model does not use.
  std::vector<std::pair<std::string, GgufValue>> kvs;
  for (const std::string& key : model.keys()) {
    if (absl::StartsWith(key, "tokenizer.")) continue;
    kvs.emplace_back(key, *model.FindKey(key));
  }
  kvs.emplace_back("fuzz.i8", ScalarInt(GgufValueType::kInt8, -7));
  kvs.emplace_back("fuzz.u16", ScalarInt(GgufValueType::kUint16, 65535));
  kvs.emplace_back("fuzz.i16", ScalarInt(GgufValueType::kInt16, -300));
  kvs.emplace_back("fuzz.i64", ScalarInt(GgufValueType::kInt64, -(int64_t{1} << 40)));
  kvs.emplace_back("fuzz.u64_big", ScalarInt(GgufValueType::kUint64, -1));  // 2^64 - 1
  {
    GgufValue f64 = Scalar(GgufValueType::kFloat64), b = Scalar(GgufValueType::kBool);
    f64.floats = {0.1};
    b.bools = {1};
    GgufValue f32s = Array(GgufValueType::kFloat32), strs = Array(GgufValueType::kString),
              i32s = Array(GgufValueType::kInt32);
    f32s.floats = {1.5, -2.0, 0.25};
    strs.strings = {"a", "", "\xc3\xa9"};
    i32s.ints = {1, -1, 3};
    for (auto& [k, v] : {std::pair<const char*, GgufValue*>{"fuzz.f64", &f64},
                         {"fuzz.bool", &b}, {"fuzz.f32_array", &f32s},
                         {"fuzz.str_array", &strs}, {"fuzz.i32_array", &i32s}}) {
      kvs.emplace_back(k, *v);
    }
  }
  // One row of the first tensor of each type in the model (real bytes) ...
  std::vector<Tensor> tensors;
  std::set<GgmlType> have;
  for (const auto& t : model.tensors()) {
    if (have.count(t.type) != 0) continue;
    have.insert(t.type);
    auto row = lspo::model::GgmlRowBytes(t.type, t.row_length());
    if (!row.ok()) Die(std::string(row.status().message()));
    const auto data = model.TensorData(t);
    const int64_t ne0 = std::min<int64_t>(t.row_length(), 256);
    const uint64_t nbytes = *lspo::model::GgmlRowBytes(t.type, ne0);
    tensors.push_back({t.name, {ne0, 1}, t.type,
                       std::string(reinterpret_cast<const char*>(data.data()), nbytes)});
  }
  // ... and synthetic rows (fixed pseudo-random bytes) of the other dequantisable types.
  std::mt19937 rng(5);
  for (GgmlType type :
       {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ4_0, GgmlType::kQ4_1,
        GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0, GgmlType::kQ2_K, GgmlType::kQ3_K,
        GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K}) {
    if (have.count(type) != 0) continue;
    const int64_t ne0 = lspo::model::GgmlBlockSize(type) == 1 ? 8 : 256;
    auto nbytes = lspo::model::GgmlRowBytes(type, ne0);
    if (!nbytes.ok()) Die(std::string(nbytes.status().message()));
    std::string bytes(*nbytes, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() & 0x3f);  // small scales, no NaN/Inf
    tensors.push_back({absl::StrCat("fuzz.", lspo::model::GgmlTypeName(type)), {ne0, 1}, type,
                       bytes});
  }
  // A 0-d and an empty tensor.
  tensors.push_back({"fuzz.scalar", {}, GgmlType::kF32, std::string("\0\0\x80\x3f", 4)});
  tensors.push_back({"fuzz.empty", {4, 0}, GgmlType::kF32, ""});
  WriteFile(out / "gguf/tiny_v3.gguf", BuildGguf(3, kvs, tensors));
  // v2 (same layout) with two tensors and no extra keys.
  std::vector<std::pair<std::string, GgufValue>> kv2(kvs.begin(), kvs.begin() + 3);
  std::vector<Tensor> t2(tensors.begin(), tensors.begin() + 2);
  WriteFile(out / "gguf/tiny_v2.gguf", BuildGguf(2, kv2, t2));
}

void MakeTokenizerSeeds(const GgufFile& model, const fs::path& out) {
  auto tokens = model.GetStringArray("tokenizer.ggml.tokens");
  auto types = model.GetIntArray("tokenizer.ggml.token_type");
  auto merges = model.GetStringArray("tokenizer.ggml.merges");
  if (!tokens.ok() || !types.ok() || !merges.ok()) Die("the model has no tokenizer metadata");
  std::map<std::string, int64_t> id_of;
  for (size_t i = 0; i < tokens->size(); ++i) id_of.emplace((*tokens)[i], i);
  // Keep: single-code-point tokens (the byte symbols), specials, then the tokens made by the
  // first merges whose parts are kept.
  std::set<int64_t> keep;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const std::string& s = (*tokens)[i];
    const bool one_char =
        s.size() == 1 || (s.size() == 2 && (static_cast<uint8_t>(s[0]) & 0xE0) == 0xC0);
    if (one_char || (*types)[i] == 3 || (*types)[i] == 4) keep.insert(i);
  }
  std::vector<std::string> kept_merges;
  for (const std::string& m : *merges) {
    if (kept_merges.size() >= 500) break;
    const size_t sp = m.find(' ');
    if (sp == std::string::npos) continue;
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    auto ia = id_of.find(a), ib = id_of.find(b), iab = id_of.find(a + b);
    if (ia == id_of.end() || ib == id_of.end() || iab == id_of.end()) continue;
    if (keep.count(ia->second) == 0 || keep.count(ib->second) == 0) continue;
    keep.insert(iab->second);
    kept_merges.push_back(m);
  }
  std::map<int64_t, int64_t> new_id;
  GgufValue tok_v = Array(GgufValueType::kString), type_v = Array(GgufValueType::kInt32);
  for (int64_t id : keep) {
    new_id[id] = static_cast<int64_t>(tok_v.strings.size());
    tok_v.strings.push_back((*tokens)[id]);
    type_v.ints.push_back((*types)[id]);
  }
  GgufValue merge_v = Array(GgufValueType::kString);
  merge_v.strings = kept_merges;
  std::vector<std::pair<std::string, GgufValue>> kvs;
  kvs.emplace_back("general.architecture", StringValue("llama"));
  kvs.emplace_back("tokenizer.ggml.model", *model.FindKey("tokenizer.ggml.model"));
  kvs.emplace_back("tokenizer.ggml.pre", *model.FindKey("tokenizer.ggml.pre"));
  kvs.emplace_back("tokenizer.ggml.tokens", tok_v);
  kvs.emplace_back("tokenizer.ggml.token_type", type_v);
  kvs.emplace_back("tokenizer.ggml.merges", merge_v);
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id"}) {
    const GgufValue* v = model.FindKey(key);
    if (v == nullptr || v->ints.empty() || new_id.count(v->ints[0]) == 0) continue;
    GgufValue nv = *v;
    nv.ints[0] = new_id[v->ints[0]];
    kvs.emplace_back(key, nv);
  }
  if (const GgufValue* v = model.FindKey("tokenizer.chat_template")) {
    kvs.emplace_back("tokenizer.chat_template", *v);
  }
  WriteFile(out / "tokenizer_gguf/smollm2_vocab_small.gguf", BuildGguf(3, kvs, {}));

  const std::map<std::string, std::string> texts = {
      {"ascii.txt", "Hello world! It's a test, isn't it? I'll see you're they've we'd"},
      {"digits.txt", "Call 09061701461 now to claim \xc2\xa3" "900; ref 12345, 3.14 & 1e10"},
      {"unicode.txt", "caf\xc3\xa9 \xe2\x82\xac 5 \xd9\xa3 \xe4\xb8\xad\xe6\x96\x87 "
                      "\xf0\x9f\x98\x80 \xe2\x80\x83tab\there\r\n"},
      {"chatml.txt", "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n"
                     "<|im_start|>user\nIs this message spam or ham?<|im_end|>\n"
                     "<|im_start|>assistant\nham<|im_end|><|endoftext|>"},
      {"bad_utf8.txt", "ok \x80\xbf \xc0\xaf \xed\xa0\x80 \xf5\xff \xe2\x82 end"},
      {"spaces.txt", "   leading  and   trailing   \n\n\n  "},
  };
  for (const auto& [name, text] : texts) WriteFile(out / "tokenizer" / name, text);
}

// tokenizer.json cut down to ids < kKeep plus the added tokens (renumbered after them), the
// merges among the kept tokens, and the post-processor's ids renumbered likewise.
void MakeTokenizerHfSeeds(const fs::path& out) {
  using Json = nlohmann::json;
  constexpr int kKeep = 300;
  const fs::path src = "tests/oracle/data/hf_tokenizers";
  const char* kFamilies[] = {"llama3", "qwen2", "spm_legacy", "spm_metaspace", "spm_unk", "misc"};
  auto read = [](const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  for (const char* family : kFamilies) {
    const fs::path dir = src / family;
    Json tj = Json::parse(read(dir / "tokenizer.json"), nullptr, false);
    if (tj.is_discarded()) Die(absl::StrCat("cannot read ", (dir / "tokenizer.json").string()));
    Json& model = tj["model"];
    Json vocab = Json::object();
    for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
      if (it.value().get<int>() < kKeep) vocab[it.key()] = it.value();
    }
    std::map<int, int> renumber;
    Json added = Json::array();
    for (Json t : tj["added_tokens"]) {
      const int id = t["id"].get<int>();
      if (id >= kKeep) {
        const int fresh = kKeep + static_cast<int>(renumber.size());
        renumber[id] = fresh;
        t["id"] = fresh;
      }
      added.push_back(t);
    }
    Json merges = Json::array();
    for (const Json& m : model["merges"]) {
      std::string a, b;
      if (m.is_string()) {
        const std::string line = m.get<std::string>();
        a = line.substr(0, line.find(' '));
        b = line.substr(line.find(' ') + 1);
      } else {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      }
      if (vocab.contains(a) && vocab.contains(b) && vocab.contains(a + b)) merges.push_back(m);
    }
    model["vocab"] = vocab;
    model["merges"] = merges;
    tj["added_tokens"] = added;
    std::function<void(Json&)> fix_post = [&](Json& p) {
      if (!p.is_object()) return;
      if (p.contains("processors")) {
        for (Json& q : p["processors"]) fix_post(q);
      }
      if (p.contains("special_tokens")) {
        for (auto& [name, entry] : p["special_tokens"].items()) {
          for (Json& id : entry["ids"]) {
            auto it = renumber.find(id.get<int>());
            if (it != renumber.end()) id = it->second;
          }
        }
      }
    };
    fix_post(tj["post_processor"]);
    std::string seed = tj.dump();
    seed += '\0';
    if (fs::exists(dir / "tokenizer_config.json")) seed += read(dir / "tokenizer_config.json");
    seed += '\0';
    seed += "<|im_start|>user\nHi! It's 2024\xe2\x80\x94 caf\xc3\xa9 \xe4\xb8\xad <s>[INST] x [/INST]";
    WriteFile(out / "tokenizer_hf" / absl::StrCat(family, "_small.bin"), seed);
  }
}

void MakeSafetensorsSeeds(const GgufFile& model, const fs::path& out) {
  auto emb = model.ReadRowsF32("token_embd.weight", 0, 2);
  if (!emb.ok()) Die(std::string(emb.status().message()));
  std::vector<float> f32(emb->begin(), emb->begin() + 8);  // 2 x 4
  std::vector<uint16_t> bf16, f16;
  std::vector<double> f64;
  for (float x : f32) {
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    bf16.push_back(static_cast<uint16_t>(bits >> 16));
    f16.push_back(lspo::runtime::Fp32ToFp16(x));
    f64.push_back(x);
  }
  const int64_t i64[2] = {-1, 1LL << 40};
  const int32_t i32[2] = {7, -7};
  const int16_t i16[2] = {300, -300};
  const int8_t i8[2] = {-128, 127};
  const uint8_t u8[2] = {0, 255};
  const uint8_t b[3] = {1, 0, 1};
  const float one = 1.0f;
  using E = lspo::model::SafetensorsEntry;
  const std::vector<E> all = {
      {"model.embed_tokens.weight", "F32", {2, 4}, f32.data(), 32},
      {"a.bf16", "BF16", {2, 4}, bf16.data(), 16},
      {"a.f16", "F16", {8}, f16.data(), 16},
      {"a.f64", "F64", {4, 2}, f64.data(), 64},
      {"a.i64", "I64", {2}, i64, 16},
      {"a.i32", "I32", {2, 1}, i32, 8},
      {"a.i16", "I16", {2}, i16, 4},
      {"a.i8", "I8", {1, 2}, i8, 2},
      {"a.u8", "U8", {2}, u8, 2},
      {"a.bool", "BOOL", {3}, b, 3},
      {"a.scalar", "F32", {}, &one, 4},
      {"a.empty", "F32", {0, 3}, nullptr, 0},
  };
  const fs::path dir = out / "safetensors";
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::vector<E>& entries,
                   const std::map<std::string, std::string>& meta) {
    const fs::path p = dir / name;
    auto st = lspo::model::WriteSafetensors(p.string(), entries, meta);
    if (!st.ok()) Die(std::string(st.message()));
    std::printf("  %-50s %6zu bytes\n", p.string().c_str(),
                static_cast<size_t>(fs::file_size(p)));
  };
  write("all_dtypes.safetensors", all, {{"source", "SmolLM2-135M-Instruct token_embd rows 0-1"}});
  write("one_bf16.safetensors", {all[1]}, {});
}

void MakeJobSpecSeeds(const fs::path& examples, const fs::path& out) {
  std::vector<fs::path> specs;
  for (const auto& e : fs::directory_iterator(examples)) {
    const std::string ext = e.path().extension().string();
    if (ext == ".yaml" || ext == ".yml" || ext == ".json") specs.push_back(e.path());
  }
  std::sort(specs.begin(), specs.end());
  for (const fs::path& p : specs) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    WriteFile(out / "job_spec" / p.filename(), ss.str());
    auto spec = lspo::spec::LoadJobSpecFile(p.string());
    if (!spec.ok()) Die(std::string(spec.status().message()));
    WriteFile(out / "job_spec" / (p.stem().string() + ".json"),
              lspo::spec::JobSpecToJson(*spec));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) Die("usage: make_seeds MODEL.gguf EXAMPLES_DIR OUT_DIR");
  auto model = GgufFile::Open(argv[1]);
  if (!model.ok()) Die(std::string(model.status().message()));
  const fs::path out = argv[3];
  MakeGgufSeeds(*model, argv[1], out);
  MakeTokenizerSeeds(*model, out);
  MakeTokenizerHfSeeds(out);
  MakeSafetensorsSeeds(*model, out);
  MakeJobSpecSeeds(argv[2], out);
  return 0;
}
