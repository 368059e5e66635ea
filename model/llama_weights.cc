// LlamaModel's weights: the slots of a config's tensors (HF names, transformers' state_dict
// order), random initialisation, loading from GGUF and HF model folders, the linears' storage
// dtype and modes, the device, and access by name. Legend and contracts: llama.h.
#include "model/llama.h"

#include <ATen/CPUGeneratorImpl.h>
#include <glog/logging.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/gguf.h"
#include "model/hf_checkpoint.h"
#include "model/hf_names.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

constexpr const char* kLinearSuffix[kLinearsPerLayer] = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string LayerPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, "."); }

}  // namespace

LlamaModel LlamaModel::Allocate(const LlamaConfig& c) {
  LlamaModel model;
  model.config_ = c;
  const int64_t H = c.hidden_size, F = c.intermediate_size;
  const int64_t q_out = c.num_heads * c.head_dim, kv_out = c.num_kv_heads * c.head_dim;
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  auto add = [&model, &opts](std::string name, std::vector<int64_t> shape) {
    const int64_t slot = static_cast<int64_t>(model.tensors_.size());
    model.slot_of_[name] = slot;
    model.names_.push_back(std::move(name));
    model.tensors_.push_back(at::empty(shape, opts));
    return slot;
  };
  model.embed_slot_ = add("model.embed_tokens.weight", {c.vocab_size, H});
  const std::vector<int64_t> linear_shapes[kLinearsPerLayer] = {
      {q_out, H}, {kv_out, H}, {kv_out, H}, {H, q_out}, {F, H}, {F, H}, {H, F}};
  const bool has_bias[kLinearsPerLayer] = {c.qkv_bias, c.qkv_bias, c.qkv_bias, c.o_bias,
                                           false,      false,      false};
  // transformers' state_dict order: input_layernorm, q, k, v, o (each weight then bias),
  // q_norm, k_norm (Qwen3), post_attention_layernorm, gate, up, down.
  auto add_linear = [&](const std::string& prefix, int64_t k) {
    model.linear_slot_.push_back(
        add(absl::StrCat(prefix, kLinearSuffix[k], ".weight"), linear_shapes[k]));
    model.bias_slot_.push_back(
        has_bias[k] ? add(absl::StrCat(prefix, kLinearSuffix[k], ".bias"), {linear_shapes[k][0]})
                    : -1);
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string prefix = LayerPrefix(l);
    model.input_norm_slot_.push_back(add(prefix + "input_layernorm.weight", {H}));
    for (int64_t k = 0; k < 4; ++k) add_linear(prefix, k);
    if (c.qk_norm) {
      model.q_norm_slot_.push_back(add(prefix + "self_attn.q_norm.weight", {c.head_dim}));
      model.k_norm_slot_.push_back(add(prefix + "self_attn.k_norm.weight", {c.head_dim}));
    }
    model.post_norm_slot_.push_back(add(prefix + "post_attention_layernorm.weight", {H}));
    if (c.sandwich_norms) {
      model.pre_ff_norm_slot_.push_back(add(prefix + "pre_feedforward_layernorm.weight", {H}));
      model.post_ff_norm_slot_.push_back(add(prefix + "post_feedforward_layernorm.weight", {H}));
    }
    for (int64_t k = 4; k < kLinearsPerLayer; ++k) add_linear(prefix, k);
  }
  model.final_norm_slot_ = add("model.norm.weight", {H});
  model.lm_head_slot_ =
      c.tie_word_embeddings ? model.embed_slot_ : add("lm_head.weight", {c.vocab_size, H});
  model.modes_.assign(model.linear_slot_.size(), LinearMode::kFrozen);
  return model;
}

absl::StatusOr<LlamaModel> LlamaModel::RandomInit(const LlamaConfig& config, uint64_t seed) {
  RETURN_IF_ERROR(config.Validate());
  try {
    LlamaModel model = Allocate(config);
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    at::NoGradGuard no_grad;
    for (size_t slot = 0; slot < model.tensors_.size(); ++slot) {
      at::Tensor& t = model.tensors_[slot];
      if (absl::EndsWith(model.names_[slot], ".bias")) {
        t.zero_();
      } else if (t.dim() == 1) {
        t.fill_(config.norm_weight_offset ? 0.0 : 1.0);  // RMSNorm weights: the identity
      } else {
        t.normal_(0.0, 0.02, gen);
      }
    }
    return model;
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("LlamaModel::RandomInit: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<LlamaModel> LlamaModel::FromGguf(const GgufFile& gguf) {
  ASSIGN_OR_RETURN(LlamaConfig config, LlamaConfigFromGguf(gguf));
  try {
    LlamaModel model = Allocate(config);
    for (size_t slot = 0; slot < model.tensors_.size(); ++slot) {
      const std::string& name = model.names_[slot];
      std::vector<int64_t> shape;
      ASSIGN_OR_RETURN(std::vector<float> data,
                       LoadHfTensor(gguf, name, config.num_heads, config.num_kv_heads, &shape));
      at::Tensor& t = model.tensors_[slot];
      if (at::IntArrayRef(shape) != t.sizes() || static_cast<int64_t>(data.size()) != t.numel()) {
        return absl::InvalidArgumentError(
            absl::StrCat("GGUF tensor ", name, " has shape ", ShapeString(shape), " (", data.size(),
                         " values) but the llama.* hyperparameters imply ", ShapeString(t.sizes()),
                         "; the file's metadata and tensors disagree"));
      }
      std::copy(data.begin(), data.end(), t.data_ptr<float>());
    }
    return model;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("LlamaModel::FromGguf: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<LlamaModel> LlamaModel::FromHfCheckpoint(const HfCheckpoint& ckpt) {
  const std::string config_path = ckpt.dir() + "/config.json";
  ASSIGN_OR_RETURN(LlamaConfig config, LlamaConfigFromHfJson(ckpt.config(), config_path));
  try {
    LlamaModel model = Allocate(config);
    // Every stored tensor must be one the config implies (or a known leftover).
    for (const std::string& name : ckpt.TensorNames()) {
      if (model.slot_of_.contains(name)) continue;
      if (absl::EndsWith(name, "rotary_emb.inv_freq")) continue;  // old checkpoints' buffer
      if (name == "lm_head.weight" && config.tie_word_embeddings) continue;  // HF ties it
      return absl::InvalidArgumentError(
          absl::StrCat("'", ckpt.FileOf(name), "' holds tensor '", name, "', which ", config_path,
                       " does not imply (architecture ", HfArchitecture(config.family),
                       absl::EndsWith(name, ".bias") ? ", no bias on this projection" : "",
                       "): config.json contradicts the weights"));
    }
    at::NoGradGuard no_grad;
    for (size_t slot = 0; slot < model.tensors_.size(); ++slot) {
      const std::string& name = model.names_[slot];
      at::Tensor& t = model.tensors_[slot];
      const SafetensorsTensorInfo* info = ckpt.Find(name);
      if (info == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "HF model folder '", ckpt.dir(), "' lacks tensor '", name, "', which ", config_path,
            " implies",
            name == "lm_head.weight"
                ? " (tie_word_embeddings is false; set it to true if the head is the embedding)"
                : ""));
      }
      if (at::IntArrayRef(info->shape) != t.sizes()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", name, "' in '", ckpt.FileOf(name), "' has shape ",
                         ShapeString(info->shape), " but ", config_path, " implies ",
                         ShapeString(t.sizes()), "; config.json contradicts the weights"));
      }
      if (info->dtype != "F32" && info->dtype != "BF16" && info->dtype != "F16") {
        return absl::UnimplementedError(
            absl::StrCat("tensor '", name, "' in '", ckpt.FileOf(name), "' has dtype ", info->dtype,
                         "; expected F32, BF16 or F16 (quantised checkpoints are not supported)"));
      }
      RETURN_IF_ERROR(ckpt.ReadF32Into(
          name, absl::MakeSpan(t.data_ptr<float>(), static_cast<size_t>(t.numel()))));
    }
    return model;
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("LlamaModel::FromHfCheckpoint: ", e.what_without_backtrace()));
  }
}

absl::Status LlamaModel::SetLinearStorageDtype(at::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear weight storage dtype must be fp32 or bf16, got ",
                     std::string(c10::toString(dtype))));
  }
  for (int64_t i = 0; i < num_linears(); ++i) {
    at::Tensor& w = tensors_[static_cast<size_t>(linear_slot_[static_cast<size_t>(i)])];
    if (w.scalar_type() == dtype) continue;
    const bool rg = w.requires_grad();
    w = w.detach().to(dtype).requires_grad_(rg);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::SetFrozenStorageDtype(at::ScalarType dtype) {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat("frozen tensor storage dtype must be fp32 or bf16, got ",
                     std::string(c10::toString(dtype))));
  }
  std::vector<bool> keep(tensors_.size(), false);  // linears and biases keep theirs
  for (int64_t s : linear_slot_) keep[static_cast<size_t>(s)] = true;
  for (int64_t s : bias_slot_) {
    if (s >= 0) keep[static_cast<size_t>(s)] = true;
  }
  for (size_t s = 0; s < tensors_.size(); ++s) {
    at::Tensor& t = tensors_[s];
    if (keep[s] || t.requires_grad() || t.scalar_type() == dtype) continue;
    t = t.detach().to(dtype);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::To(const at::Device& device) {
  try {
    std::vector<at::Tensor> moved;
    moved.reserve(tensors_.size());
    for (const at::Tensor& t : tensors_) {
      // A tied lm_head shares embed's slot, so every tensor moves exactly once.
      moved.push_back(t.detach().to(device).requires_grad_(t.requires_grad()));
    }
    if (linear_impl_ != nullptr) RETURN_IF_ERROR(linear_impl_->To(device));
    tensors_ = std::move(moved);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot move the model to device '", device.str(), "': ", e.what_without_backtrace(),
        " (use device: cpu, or a LibTorch built with that device's support)"));
  }
  return absl::OkStatus();
}

at::Device LlamaModel::device() const { return tensors_.front().device(); }

std::string LlamaModel::LinearName(int64_t i) const {
  if (i < 0 || i >= num_linears()) return absl::StrCat("<linear ", i, " out of range>");
  return names_[static_cast<size_t>(linear_slot_[static_cast<size_t>(i)])];
}

at::Tensor& LlamaModel::LinearWeight(int64_t i) {
  CHECK(i >= 0 && i < num_linears())
      << "linear index " << i << " not in [0, " << num_linears() << ")";
  return tensors_[static_cast<size_t>(linear_slot_[static_cast<size_t>(i)])];
}

const at::Tensor& LlamaModel::LinearWeight(int64_t i) const {
  CHECK(i >= 0 && i < num_linears())
      << "linear index " << i << " not in [0, " << num_linears() << ")";
  return tensors_[static_cast<size_t>(linear_slot_[static_cast<size_t>(i)])];
}

void LlamaModel::SetLinearMode(LinearMode mode) {
  for (int64_t i = 0; i < num_linears(); ++i) SetLinearMode(i, mode);
}

void LlamaModel::SetLinearMode(int64_t i, LinearMode mode) {
  LinearWeight(i).requires_grad_(mode == LinearMode::kDense);
  modes_[static_cast<size_t>(i)] = mode;
}

void LlamaModel::ZeroLinearGrads() {
  for (int64_t i = 0; i < num_linears(); ++i) LinearWeight(i).mutable_grad() = at::Tensor();
}

std::vector<std::pair<std::string, at::Tensor>> LlamaModel::NamedTensors() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(tensors_.size());
  for (size_t s = 0; s < tensors_.size(); ++s) out.emplace_back(names_[s], tensors_[s]);
  return out;
}

absl::StatusOr<at::Tensor> LlamaModel::GetTensor(const std::string& hf_name) const {
  auto it = slot_of_.find(hf_name);
  if (it == slot_of_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no tensor named \"", hf_name, "\" in this Llama model",
        hf_name == "lm_head.weight" ? " (embeddings are tied: use model.embed_tokens.weight)"
                                    : ""));
  }
  return tensors_[static_cast<size_t>(it->second)];
}

absl::Status LlamaModel::SetTensor(const std::string& hf_name, const at::Tensor& value) {
  if (hf_name == "lm_head.weight" && config_.tie_word_embeddings) {
    return absl::InvalidArgumentError(
        "SetTensor(lm_head.weight): this model ties lm_head to the embedding; set "
        "model.embed_tokens.weight instead (or skip lm_head.weight when loading)");
  }
  auto it = slot_of_.find(hf_name);
  if (it == slot_of_.end()) {
    return absl::NotFoundError(
        absl::StrCat("SetTensor: no tensor named \"", hf_name, "\" in this Llama model"));
  }
  at::Tensor& dst = tensors_[static_cast<size_t>(it->second)];
  if (!value.defined() || !at::isFloatingType(value.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SetTensor(", hf_name, "): expected a floating tensor, got ",
        value.defined() ? std::string(c10::toString(value.scalar_type())) : "undefined"));
  }
  if (value.sizes() != dst.sizes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetTensor(", hf_name, "): shape ", ShapeString(value.sizes()),
                     " but the model expects ", ShapeString(dst.sizes())));
  }
  try {
    at::NoGradGuard no_grad;
    dst.copy_(value);
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("SetTensor(", hf_name, "): ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

}  // namespace lspo::model
