#include "offload/gguf_export.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/gguf_writer.h"
#include "model/hf_checkpoint.h"
#include "model/hf_names.h"
#include "model/llama.h"
#include "model/llama_config.h"
#include "nlohmann/json.hpp"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"
#include "text/tokenizer.h"

namespace lspo::offload {
namespace {

using model::GgmlType;
using nlohmann::json;

bool IsType(const json& j, absl::string_view type) {
  return j.is_object() && j.contains("type") && j["type"].is_string() &&
         j["type"].get<std::string>() == type;
}
bool BoolField(const json& j, const char* key, bool fallback) {
  return j.contains(key) && j[key].is_boolean() ? j[key].get<bool>() : fallback;
}
// A ByteLevel pre-tokenizer without a prefix space, with or without its own GPT-2 regex.
bool IsByteLevel(const json& j, bool use_regex) {
  return IsType(j, "ByteLevel") && !BoolField(j, "add_prefix_space", true) &&
         BoolField(j, "use_regex", true) == use_regex;
}

// llama.cpp's tokenizer.ggml.pre name of a tokenizer.json pre_tokenizer (see the header), or
// kUnimplemented naming what was found.
absl::StatusOr<std::string> PreTokenizerName(const json& pre, const std::string& source) {
  if (IsByteLevel(pre, /*use_regex=*/true)) return std::string("gpt2");
  if (IsType(pre, "Sequence") && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
      pre["pretokenizers"].size() == 2) {
    const json& a = pre["pretokenizers"][0];
    const json& b = pre["pretokenizers"][1];
    if (IsType(a, "Digits") && BoolField(a, "individual_digits", false) &&
        IsByteLevel(b, /*use_regex=*/true)) {
      return std::string("smollm");
    }
    if (IsType(a, "Split") && IsByteLevel(b, /*use_regex=*/false) && a.contains("pattern") &&
        a["pattern"].is_object() && a["pattern"].contains("Regex") &&
        a["pattern"]["Regex"].is_string()) {
      const std::string re = a["pattern"]["Regex"].get<std::string>();
      for (const char* name : {"llama-bpe", "qwen2"}) {
        if (re == model::GgufPreTokenizerRegex(name)) return std::string(name);
      }
    }
  }
  return absl::UnimplementedError(absl::StrCat(
      source, ": the pre_tokenizer ", pre.dump().substr(0, 200),
      " has no llama.cpp name known here; GGUF export writes byte-level BPE tokenizers whose "
      "pre-tokenizer is SmolLM2's (Digits + ByteLevel), GPT-2's (ByteLevel) or the Llama 3 / "
      "Qwen2 split regex (use llama.cpp's convert_hf_to_gguf.py for others)"));
}

struct GgufVocab {
  std::string pre;
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;
};

// The tokenizer.ggml.* vocabulary of the folder's tokenizer.json, padded to `vocab_size` rows.
absl::StatusOr<GgufVocab> VocabOf(const std::string& dir, const model::BpeTokenizer& tok,
                                  int64_t vocab_size) {
  const std::string path = dir + "/tokenizer.json";
  ASSIGN_OR_RETURN(std::string text, runtime::ReadFileToString(path, "tokenizer.json"));
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    return absl::DataLossError(absl::StrCat(path, " is not a tokenizer.json object with a model"));
  }
  const json& m = j["model"];
  if (!IsType(m, "BPE") || BoolField(m, "byte_fallback", false) ||
      !(j.contains("decoder") && IsType(j["decoder"], "ByteLevel"))) {
    return absl::UnimplementedError(absl::StrCat(
        path,
        ": GGUF export writes byte-level BPE tokenizers (model BPE without byte_fallback, "
        "a ByteLevel decoder: SmolLM2, GPT-2, Llama 3, Qwen2); this one is SentencePiece-style "
        "(Metaspace / byte_fallback, e.g. Llama 2's and Mistral's), which is not written yet: use "
        "llama.cpp's convert_hf_to_gguf.py"));
  }
  GgufVocab v;
  ASSIGN_OR_RETURN(
      v.pre, PreTokenizerName(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json(), path));
  // llama.cpp fixes these by the pre name (Llama 3 ignores merges for whole-vocabulary words,
  // Qwen2 normalizes NFC); a tokenizer.json that says otherwise would tokenize differently there.
  const bool ignore_merges = BoolField(m, "ignore_merges", false);
  const json normalizer = j.contains("normalizer") ? j["normalizer"] : json();
  const bool nfc = IsType(normalizer, "NFC");
  if (ignore_merges != model::GgufPreIgnoresMerges(v.pre) ||
      !(normalizer.is_null() || (nfc && model::GgufPreUsesNfc(v.pre)))) {
    return absl::UnimplementedError(
        absl::StrCat(path, ": model.ignore_merges ", ignore_merges ? "true" : "false",
                     " and normalizer ", normalizer.dump().substr(0, 80),
                     " differ from what llama.cpp assumes for the pre-tokenizer '", v.pre,
                     "' (ignore_merges ", model::GgufPreIgnoresMerges(v.pre) ? "true" : "false",
                     model::GgufPreUsesNfc(v.pre) ? ", NFC" : ", no normalizer",
                     "): the GGUF would tokenize differently; not written"));
  }
  absl::flat_hash_set<int32_t> added_plain;  // added tokens that are not special
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      if (a.is_object() && a.contains("id") && a["id"].is_number_integer() &&
          !BoolField(a, "special", false)) {
        added_plain.insert(a["id"].get<int32_t>());
      }
    }
  }
  const int32_t n = tok.vocab_size();
  for (int32_t id = 0; id < n; ++id) {
    v.tokens.push_back(tok.IdToToken(id));
    v.types.push_back(tok.IsSpecial(id)          ? model::kTokenControl
                      : added_plain.contains(id) ? model::kTokenUserDefined
                                                 : model::kTokenNormal);
  }
  for (int64_t id = n; id < vocab_size; ++id) {  // llama.cpp's converter pads the same way
    v.tokens.push_back(absl::StrCat("[PAD", id, "]"));
    v.types.push_back(model::kTokenUnused);
  }
  if (m.contains("merges") && m["merges"].is_array()) {
    for (const json& e : m["merges"]) {
      if (e.is_string()) {
        v.merges.push_back(e.get<std::string>());
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        v.merges.push_back(absl::StrCat(e[0].get<std::string>(), " ", e[1].get<std::string>()));
      } else {
        return absl::DataLossError(absl::StrCat(path,
                                                ": a model.merges entry is neither \"A B\" "
                                                "nor [\"A\", \"B\"]"));
      }
    }
  }
  return v;
}

// llama_ftype of the matrix type (llama.h: ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7,
// MOSTLY_BF16 32).
uint32_t FileType(GgmlType t) {
  switch (t) {
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

struct Source {
  std::string hf_name;  // tensor in the folder; empty for rope_freqs
  int64_t permute = 0;  // > 0: q/k rows permuted into llama.cpp order with this many heads
};

// The matrices' element type: the choice, or for kAuto BF16 when config.json's torch_dtype (or
// dtype) is "bfloat16", else F16.
GgmlType MatrixType(const json& config, GgufOutType type) {
  switch (type) {
    case GgufOutType::kF32:
      return GgmlType::kF32;
    case GgufOutType::kF16:
      return GgmlType::kF16;
    case GgufOutType::kBF16:
      return GgmlType::kBF16;
    case GgufOutType::kQ8_0:
      return GgmlType::kQ8_0;
    case GgufOutType::kAuto:
      break;
  }
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (config.contains(key) && config[key].is_string()) {
      return config[key].get<std::string>() == "bfloat16" ? GgmlType::kBF16 : GgmlType::kF16;
    }
  }
  return GgmlType::kF16;
}

// general.*, llama.* and tokenizer.* metadata of the file (the header's list).
void SetMetadata(const model::LlamaConfig& c, const model::BpeTokenizer& tok, GgufVocab vocab,
                 const std::string& name, GgmlType matrix_type, model::GgufWriter* w) {
  w->SetString("general.architecture", "llama");
  w->SetString("general.type", "model");
  w->SetString("general.name", name);
  w->SetUint32("general.quantization_version", 2);
  w->SetUint32("general.file_type", FileType(matrix_type));
  w->SetUint32("llama.context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w->SetUint32("llama.embedding_length", static_cast<uint32_t>(c.hidden_size));
  w->SetUint32("llama.block_count", static_cast<uint32_t>(c.num_layers));
  w->SetUint32("llama.feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w->SetUint32("llama.rope.dimension_count", static_cast<uint32_t>(c.head_dim));
  w->SetUint32("llama.attention.head_count", static_cast<uint32_t>(c.num_heads));
  w->SetUint32("llama.attention.head_count_kv", static_cast<uint32_t>(c.num_kv_heads));
  if (c.head_dim * c.num_heads != c.hidden_size) {
    w->SetUint32("llama.attention.key_length", static_cast<uint32_t>(c.head_dim));
    w->SetUint32("llama.attention.value_length", static_cast<uint32_t>(c.head_dim));
  }
  w->SetFloat32("llama.rope.freq_base", static_cast<float>(c.rope_theta));
  w->SetFloat32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w->SetUint32("llama.vocab_size", static_cast<uint32_t>(c.vocab_size));
  if (c.rope_scaling.type == model::RopeScaling::Type::kLinear) {
    w->SetString("llama.rope.scaling.type", "linear");
    w->SetFloat32("llama.rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
  }
  w->SetString("tokenizer.ggml.model", "gpt2");
  w->SetString("tokenizer.ggml.pre", vocab.pre);
  w->SetStringArray("tokenizer.ggml.tokens", std::move(vocab.tokens));
  w->SetInt32Array("tokenizer.ggml.token_type", std::move(vocab.types));
  w->SetStringArray("tokenizer.ggml.merges", std::move(vocab.merges));
  if (tok.bos_id() >= 0) w->SetUint32("tokenizer.ggml.bos_token_id", tok.bos_id());
  if (tok.eos_id() >= 0) w->SetUint32("tokenizer.ggml.eos_token_id", tok.eos_id());
  if (tok.unk_id() >= 0) w->SetUint32("tokenizer.ggml.unknown_token_id", tok.unk_id());
  if (tok.pad_id() >= 0) w->SetUint32("tokenizer.ggml.padding_token_id", tok.pad_id());
  w->SetBool("tokenizer.ggml.add_bos_token", tok.adds_bos());
  w->SetBool("tokenizer.ggml.add_eos_token", tok.adds_eos());
  if (!tok.chat_template().empty()) w->SetString("tokenizer.chat_template", tok.chat_template());
}

// Declares every tensor of the file in llama.cpp's order (token_embd, per layer attn_norm,
// attn_q/k/v (+ biases), attn_output, ffn_norm, ffn_gate/up/down, then output_norm, output,
// rope_freqs), recording where each one's values come from in `sources` and the llama3 RoPE
// divisors in `rope_freqs`. Errors: a tensor the config implies is missing (kInvalidArgument);
// AddTensor's.
absl::Status DeclareTensors(const model::HfCheckpoint& ckpt, const model::LlamaConfig& c,
                            const std::string& model_dir, GgufExportResult* result,
                            model::GgufWriter* w, std::vector<Source>* sources,
                            std::vector<float>* rope_freqs) {
  auto add = [&](const std::string& hf_name, int64_t permute) -> absl::Status {
    const model::SafetensorsTensorInfo* info = ckpt.Find(hf_name);
    if (info == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("HF model folder '", model_dir,
                                                     "' lacks tensor '", hf_name, "', which ",
                                                     model_dir, "/config.json implies"));
    }
    ASSIGN_OR_RETURN(std::string gguf_name, model::HfToGgufName(hf_name));
    GgmlType t = info->shape.size() >= 2 ? result->matrix_type : GgmlType::kF32;
    if (t == GgmlType::kQ8_0 && info->shape.back() % 32 != 0) {
      t = GgmlType::kF16;
      result->notes.push_back(absl::StrCat(gguf_name, ": rows of ", info->shape.back(),
                                           " elements are not whole Q8_0 blocks; written F16"));
    }
    RETURN_IF_ERROR(w->AddTensor(gguf_name, info->shape, t));
    sources->push_back({hf_name, permute});
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(add("model.embed_tokens.weight", 0));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    RETURN_IF_ERROR(add(p + "input_layernorm.weight", 0));
    for (const char* suffix : {".weight", ".bias"}) {
      const bool bias = suffix[1] == 'b';
      if (bias && !c.qkv_bias) continue;
      RETURN_IF_ERROR(add(p + "self_attn.q_proj" + suffix, c.num_heads));
      RETURN_IF_ERROR(add(p + "self_attn.k_proj" + suffix, c.num_kv_heads));
      RETURN_IF_ERROR(add(p + "self_attn.v_proj" + suffix, 0));
    }
    RETURN_IF_ERROR(add(p + "self_attn.o_proj.weight", 0));
    if (c.o_bias) RETURN_IF_ERROR(add(p + "self_attn.o_proj.bias", 0));
    RETURN_IF_ERROR(add(p + "post_attention_layernorm.weight", 0));
    RETURN_IF_ERROR(add(p + "mlp.gate_proj.weight", 0));
    RETURN_IF_ERROR(add(p + "mlp.up_proj.weight", 0));
    RETURN_IF_ERROR(add(p + "mlp.down_proj.weight", 0));
  }
  RETURN_IF_ERROR(add("model.norm.weight", 0));
  if (!c.tie_word_embeddings) RETURN_IF_ERROR(add("lm_head.weight", 0));
  if (c.rope_scaling.type == model::RopeScaling::Type::kLlama3) {
    // llama.cpp divides each inverse frequency by rope_freqs[i]: the unscaled frequency over
    // the llama3-scaled one (model/llama_config.h RopeScaling), as its converter computes.
    model::LlamaConfig plain = c;
    plain.rope_scaling = model::RopeScaling{};
    const at::Tensor base = model::RopeInverseFrequencies(plain, at::kCPU);
    const at::Tensor scaled = model::RopeInverseFrequencies(c, at::kCPU);
    const at::Tensor f = (base / scaled).contiguous();
    rope_freqs->assign(f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
    RETURN_IF_ERROR(w->AddTensor("rope_freqs.weight", {f.numel()}, GgmlType::kF32));
    sources->push_back({"", 0});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GgufOutType> ParseGgufOutType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "auto") return GgufOutType::kAuto;
  if (n == "f32") return GgufOutType::kF32;
  if (n == "f16") return GgufOutType::kF16;
  if (n == "bf16") return GgufOutType::kBF16;
  if (n == "q8_0") return GgufOutType::kQ8_0;
  return absl::InvalidArgumentError(absl::StrCat(
      "--outtype='", name, "' is not a GGUF type written here; use auto, f32, f16, bf16 or q8_0"));
}

absl::StatusOr<GgufExportResult> ExportGguf(const std::string& model_dir,
                                            const std::string& out_path, GgufOutType type) {
  if (!model::IsHfModelFolder(model_dir)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--model '", model_dir,
        "' is not a Hugging Face model folder (config.json + safetensors); export reads one, "
        "e.g. a job's output_dir"));
  }
  ASSIGN_OR_RETURN(model::HfCheckpoint ckpt, model::HfCheckpoint::Open(model_dir));
  const std::string config_path = model_dir + "/config.json";
  ASSIGN_OR_RETURN(model::LlamaConfig c, model::LlamaConfigFromHfJson(ckpt.config(), config_path));
  if (c.family != model::ModelFamily::kLlama && c.family != model::ModelFamily::kMistral) {
    return absl::UnimplementedError(
        absl::StrCat(config_path, " is a ", model::HfArchitecture(c.family),
                     "; GGUF export writes llama.cpp's \"llama\" architecture (LlamaForCausalLM, "
                     "MistralForCausalLM) and not yet its \"",
                     model::HfModelType(c.family),
                     "\" one: use llama.cpp's convert_hf_to_gguf.py on this folder"));
  }
  ASSIGN_OR_RETURN(model::BpeTokenizer tok, model::BpeTokenizer::FromHfFolder(model_dir));
  if (tok.vocab_size() > c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(model_dir, ": the tokenizer has ",
                                                   tok.vocab_size(),
                                                   " ids but config.json's "
                                                   "vocab_size is ",
                                                   c.vocab_size));
  }
  ASSIGN_OR_RETURN(GgufVocab vocab, VocabOf(model_dir, tok, c.vocab_size));

  GgufExportResult result;
  result.tokenizer_pre = vocab.pre;
  result.matrix_type = MatrixType(ckpt.config(), type);
  if (c.family == model::ModelFamily::kMistral && c.sliding_window > 0 &&
      c.sliding_window < c.max_position_embeddings) {
    result.notes.push_back(absl::StrCat(
        "sliding_window ", c.sliding_window,
        " is not representable in llama.cpp's llama architecture: sequences longer than ",
        c.sliding_window, " tokens attend to every earlier token there"));
  }

  std::string name = std::filesystem::path(model_dir).lexically_normal().filename().string();
  if (name.empty() || name == ".") {
    name = std::filesystem::path(model_dir).lexically_normal().parent_path().filename().string();
  }
  // llama.cpp's default name, in the current folder (never inside the model folder, which may
  // be a shared Hugging Face cache snapshot).
  result.path = out_path.empty()
                    ? absl::StrCat(name, "-", model::GgmlTypeName(result.matrix_type), ".gguf")
                    : out_path;
  struct stat st;
  if (::lstat(result.path.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("--outfile '", result.path,
                                                 "' exists; export never overwrites a file "
                                                 "(remove it or choose another name)"));
  }
  const std::string parent = std::filesystem::path(result.path).parent_path().string();
  if (!parent.empty() && !runtime::IsDirectory(parent)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--outfile '", result.path, "': the folder '", parent, "' does not exist"));
  }

  model::GgufWriter w;
  SetMetadata(c, tok, std::move(vocab), name, result.matrix_type, &w);

  std::vector<Source> sources;
  std::vector<float> rope_freqs;
  RETURN_IF_ERROR(DeclareTensors(ckpt, c, model_dir, &result, &w, &sources, &rope_freqs));
  result.num_tensors = static_cast<int64_t>(sources.size());

  std::vector<float> buffer;
  absl::Status written =
      w.WriteFile(result.path, [&](size_t i, std::vector<float>* v) -> absl::Status {
        const Source& s = sources[i];
        if (s.hf_name.empty()) {
          *v = rope_freqs;
          return absl::OkStatus();
        }
        const model::SafetensorsTensorInfo* info = ckpt.Find(s.hf_name);
        int64_t numel = 1;
        for (int64_t d : info->shape) numel *= d;
        if (s.permute == 0) {
          v->resize(static_cast<size_t>(numel));
          return ckpt.ReadF32Into(s.hf_name, absl::MakeSpan(*v));
        }
        buffer.resize(static_cast<size_t>(numel));
        RETURN_IF_ERROR(ckpt.ReadF32Into(s.hf_name, absl::MakeSpan(buffer)));
        const int64_t rows = info->shape[0];
        const int64_t cols = info->shape.size() >= 2 ? info->shape[1] : 1;
        return model::PermuteQkRows(buffer, rows, cols, s.permute, v);
      });
  RETURN_IF_ERROR(written);
  std::error_code ec;
  result.file_bytes = std::filesystem::file_size(result.path, ec);
  return result;
}

}  // namespace lspo::offload
