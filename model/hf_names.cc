#include "model/hf_names.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

struct NamePair {
  absl::string_view hf;
  absl::string_view gguf;
};

// Whole-model tensors (stem without ".weight"/".bias").
constexpr NamePair kGlobal[] = {
    {"model.embed_tokens", "token_embd"},
    {"model.norm", "output_norm"},
    {"lm_head", "output"},
};

// Per-layer tensors: "model.layers.N." + hf  <->  "blk.N." + gguf.
constexpr NamePair kLayer[] = {
    {"self_attn.q_proj", "attn_q"},
    {"self_attn.k_proj", "attn_k"},
    {"self_attn.v_proj", "attn_v"},
    {"self_attn.o_proj", "attn_output"},
    {"mlp.gate_proj", "ffn_gate"},
    {"mlp.up_proj", "ffn_up"},
    {"mlp.down_proj", "ffn_down"},
    {"input_layernorm", "attn_norm"},
    {"post_attention_layernorm", "ffn_norm"},
};

// Splits "stem.weight" / "stem.bias" into (stem, ".weight"/".bias"); false otherwise.
bool SplitParamSuffix(absl::string_view name, absl::string_view* stem, absl::string_view* suffix) {
  for (absl::string_view s : {absl::string_view(".weight"), absl::string_view(".bias")}) {
    if (absl::EndsWith(name, s)) {
      *stem = name.substr(0, name.size() - s.size());
      *suffix = s;
      return true;
    }
  }
  return false;
}

// Parses "<digits>." at the front of `rest`: the layer index and the remainder.
bool ParseLayer(absl::string_view rest, int64_t* layer, absl::string_view* tail) {
  const size_t dot = rest.find('.');
  if (dot == absl::string_view::npos || dot == 0 || dot > 9) return false;
  absl::string_view digits = rest.substr(0, dot);
  for (char c : digits) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  if (digits.size() > 1 && digits[0] == '0') return false;  // canonical decimal only
  if (!absl::SimpleAtoi(digits, layer)) return false;
  *tail = rest.substr(dot + 1);
  return true;
}

absl::StatusOr<std::string> MapName(absl::string_view name, bool hf_to_gguf) {
  const absl::string_view layer_prefix = hf_to_gguf ? "model.layers." : "blk.";
  absl::string_view stem, suffix;
  if (SplitParamSuffix(name, &stem, &suffix)) {
    for (const NamePair& p : kGlobal) {
      if (stem == (hf_to_gguf ? p.hf : p.gguf)) {
        return absl::StrCat(hf_to_gguf ? p.gguf : p.hf, suffix);
      }
    }
    int64_t layer = 0;
    absl::string_view tail;
    if (absl::StartsWith(stem, layer_prefix) &&
        ParseLayer(stem.substr(layer_prefix.size()), &layer, &tail)) {
      for (const NamePair& p : kLayer) {
        if (tail == (hf_to_gguf ? p.hf : p.gguf)) {
          return hf_to_gguf ? absl::StrCat("blk.", layer, ".", p.gguf, suffix)
                            : absl::StrCat("model.layers.", layer, ".", p.hf, suffix);
        }
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", name, "' is not a Llama ", hf_to_gguf ? "Hugging Face" : "GGUF",
      " tensor name; expected e.g. ",
      hf_to_gguf ? "'model.layers.0.self_attn.q_proj.weight'" : "'blk.0.attn_q.weight'"));
}

absl::Status CheckQkArgs(size_t src_size, int64_t rows, int64_t cols, int64_t n_heads,
                         absl::string_view fn) {
  if (n_heads <= 0 || rows < 0 || cols < 0 || rows % n_heads != 0 || (rows / n_heads) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": cannot split ", rows, " rows into ", n_heads,
        " heads of even size; pass the model's head count (num_attention_heads for q_proj, "
        "num_key_value_heads for k_proj)"));
  }
  if (cols != 0 && rows > static_cast<int64_t>(src_size) / cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": input has ", src_size, " elements, expected rows*cols = ", rows, "*", cols));
  }
  if (static_cast<int64_t>(src_size) != rows * cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        fn, ": input has ", src_size, " elements, expected rows*cols = ", rows * cols));
  }
  return absl::OkStatus();
}

// Moves whole rows: out row (HF) h*hd + half*j + i <-> in row (GGUF) h*hd + 2i + j.
void MoveRows(const std::vector<float>& src, int64_t rows, int64_t cols, int64_t n_heads,
              bool gguf_to_hf, std::vector<float>* dst) {
  dst->resize(src.size());
  const int64_t hd = rows / n_heads;
  const int64_t half = hd / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const int64_t gguf_row = h * hd + 2 * i + j;
        const int64_t hf_row = h * hd + half * j + i;
        const int64_t from = gguf_to_hf ? gguf_row : hf_row;
        const int64_t to = gguf_to_hf ? hf_row : gguf_row;
        std::copy(src.begin() + from * cols, src.begin() + (from + 1) * cols,
                  dst->begin() + to * cols);
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::string> HfToGgufName(absl::string_view hf_name) {
  return MapName(hf_name, /*hf_to_gguf=*/true);
}

absl::StatusOr<std::string> GgufToHfName(absl::string_view gguf_name) {
  return MapName(gguf_name, /*hf_to_gguf=*/false);
}

std::vector<std::string> LlamaHfTensorNames(int64_t n_layers) {
  std::vector<std::string> names;
  if (n_layers < 0) return names;
  names.reserve(static_cast<size_t>(2 + 9 * n_layers));
  names.push_back("model.embed_tokens.weight");
  for (int64_t l = 0; l < n_layers; ++l) {
    for (const NamePair& p : kLayer) {
      names.push_back(absl::StrCat("model.layers.", l, ".", p.hf, ".weight"));
    }
  }
  names.push_back("model.norm.weight");
  return names;
}

absl::Status UnpermuteQkRows(const std::vector<float>& src, int64_t rows, int64_t cols,
                             int64_t n_heads, std::vector<float>* dst) {
  RETURN_IF_ERROR(CheckQkArgs(src.size(), rows, cols, n_heads, "UnpermuteQkRows"));
  MoveRows(src, rows, cols, n_heads, /*gguf_to_hf=*/true, dst);
  return absl::OkStatus();
}

absl::Status PermuteQkRows(const std::vector<float>& src, int64_t rows, int64_t cols,
                           int64_t n_heads, std::vector<float>* dst) {
  RETURN_IF_ERROR(CheckQkArgs(src.size(), rows, cols, n_heads, "PermuteQkRows"));
  MoveRows(src, rows, cols, n_heads, /*gguf_to_hf=*/false, dst);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> LoadHfTensor(const GgufFile& f, const std::string& hf_name,
                                                int64_t n_head, int64_t n_head_kv,
                                                std::vector<int64_t>* torch_shape) {
  ASSIGN_OR_RETURN(const std::string gguf_name, HfToGgufName(hf_name));
  const GgufTensorInfo* info = f.FindTensor(gguf_name);
  if (info == nullptr) {
    if (hf_name == "lm_head.weight") {
      return absl::NotFoundError(
          "lm_head.weight: the GGUF has no output.weight, so the embeddings are tied; use "
          "model.embed_tokens.weight as the output projection");
    }
    return absl::NotFoundError(
        absl::StrCat("HF tensor '", hf_name, "' (GGUF '", gguf_name, "') is not in the GGUF file"));
  }
  ASSIGN_OR_RETURN(std::vector<float> data, f.ReadTensorF32(gguf_name));
  std::vector<int64_t> shape = info->TorchShape();
  const bool is_q = absl::StrContains(hf_name, ".self_attn.q_proj.");
  const bool is_k = absl::StrContains(hf_name, ".self_attn.k_proj.");
  if (is_q || is_k) {
    const int64_t heads = is_q ? n_head : n_head_kv;
    const int64_t rows = shape.empty() ? 1 : shape[0];
    const int64_t cols = rows == 0 ? 0 : info->numel() / rows;
    std::vector<float> hf;
    absl::Status s = UnpermuteQkRows(data, rows, cols, heads, &hf);
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("LoadHfTensor('", hf_name, "'): ", s.message()));
    }
    data = std::move(hf);
  }
  if (torch_shape != nullptr) *torch_shape = std::move(shape);
  return data;
}

}  // namespace lspo::model
