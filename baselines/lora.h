// LoRA adapters on a LlamaModel's linears (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large
// Language Models", eq. 3), with Hugging Face PEFT's conventions so that an adapter this
// project trains loads in PEFT and an adapter PEFT wrote loads here (docs/baselines.md).
//
// Per target linear W (m, n) (HF layout, y = x W^T), adapters A (r, n) and B (m, r):
//   y = x W^T + scaling · (x A^T) B^T,   scaling = alpha / r   (rsLoRA: alpha / sqrt(r))
// which is PEFT's LoraLayer forward `result + lora_B(lora_A(dropout(x))) * scaling` with
// dropout 0. The merged weight is W + scaling · B A (PEFT's merge_and_unload).
// Initialisation as PEFT's `init_lora_weights=True`: A ~ U(-1/sqrt(n), 1/sqrt(n)) (torch's
// kaiming_uniform_ with a = sqrt(5), fan_in n), B = 0, so a new adapter changes nothing.
//
// The PEFT adapter folder (peft/utils/save_and_load.py, peft/config.py):
//   adapter_config.json        {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r", "lora_alpha",
//                               "target_modules", "use_rslora", "lora_dropout": 0.0,
//                               "bias": "none", "fan_in_fan_out": false, "use_dora": false, ...}
//   adapter_model.safetensors  "base_model.model.<module>.lora_A.weight" (r, n) and
//                              ".lora_B.weight" (m, r), F32, e.g. <module> =
//                              model.layers.0.self_attn.q_proj
//
// The settings and adapter_config.json itself: baselines/peft_config.h (torch-free).
//
// Shapes: N tokens, m out features, n in features of W; r here is the LoRA rank (settings.r),
// not lsp's non-zeros per projector row.
//
// Thread-safety: as LlamaModel's (one thread at a time; Forward also from autograd).
#ifndef LSPO_BASELINES_LORA_H_
#define LSPO_BASELINES_LORA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baselines/peft_config.h"
#include "model/linear_impl.h"
#include "model/llama.h"

namespace lspo::baselines {

// The adapters of one model (see the file comment): a model::LinearImpl that computes every
// target linear as W plus its low-rank update, with and without grad mode.
class LoraAdapter final : public model::LinearImpl,
                          public std::enable_shared_from_this<LoraAdapter> {
 public:
  // New adapters for `model`'s target linears with PEFT's initialisation, on the model's
  // device, fp32, requires_grad; deterministic in `seed` (own CPU generator).
  // Errors: kInvalidArgument when r < 1, alpha is not finite and > 0, a target name is not in
  // kLoraModuleNames (or named twice), or r exceeds the smaller side of a target matrix (the
  // message names the matrix and its shape).
  static absl::StatusOr<std::shared_ptr<LoraAdapter>> Create(const model::LlamaModel& model,
                                                             LoraSettings settings, uint64_t seed);

  // Makes `model` compute through the adapters: target linears kCustom, the others kFrozen,
  // model->SetLinearImpl(this). The base weights get no gradient. `model` must be the one the
  // adapter was made for (same shapes).
  void Attach(model::LlamaModel* model);

  // y = x2d W^T + scaling (x2d A^T) B^T for a target linear, x2d W^T otherwise.
  // x2d (N, n) fp32, w (m, n) as stored (fp32, or bf16 / fp16 for 16-bit weights; upcast per
  // product, model/linear_impl.h) -> (N, m) fp32.
  at::Tensor Forward(const at::Tensor& x2d, const at::Tensor& w, int64_t linear_index) override;
  bool AppliesWithoutGrad() const override { return true; }
  absl::Status To(const at::Device& device) override;

  const LoraSettings& settings() const { return settings_; }
  double scaling() const { return scaling_; }
  int64_t num_linears() const { return static_cast<int64_t>(a_.size()); }
  // Whether linear i has an adapter.
  bool targets(int64_t i) const { return a_[static_cast<size_t>(i)].defined(); }
  // Linear i's adapters: A (r, n), B (m, r) fp32, leaf tensors with requires_grad (undefined
  // for a linear that is not a target). In-place updates change the adapter.
  at::Tensor& A(int64_t i) { return a_[static_cast<size_t>(i)]; }
  at::Tensor& B(int64_t i) { return b_[static_cast<size_t>(i)]; }
  const at::Tensor& A(int64_t i) const { return a_[static_cast<size_t>(i)]; }
  const at::Tensor& B(int64_t i) const { return b_[static_cast<size_t>(i)]; }
  // Every A (r, n) and B (m, r), fp32, in linear order (A before B): what an optimizer trains.
  std::vector<at::Tensor> Parameters() const;
  // Number of trainable numbers: sum over targets of r (m + n).
  int64_t NumParameters() const;

  // Linear i's merged weight W + scaling · B A: (m, n) fp32 on w's device, a new tensor.
  // `w` (m, n) any floating dtype. A non-target returns w as fp32.
  at::Tensor MergedWeight(int64_t i, const at::Tensor& w) const;

  // The model's tensors (LlamaModel::NamedTensors order and names) with every target
  // linear's weight merged (MergedWeight); the other tensors alias the model's.
  std::vector<std::pair<std::string, at::Tensor>> MergedTensors(
      const model::LlamaModel& model) const;

  // PEFT's state-dict key of a linear's adapter: "base_model.model." + the HF name without
  // ".weight" + ".lora_A.weight" (which = 'A') or ".lora_B.weight" (which = 'B').
  static std::string PeftKey(const std::string& hf_weight_name, char which);

 private:
  LoraAdapter() = default;

  LoraSettings settings_;
  double scaling_ = 1;
  // Per linear of the model: A (r, n) and B (m, r) fp32 on the model's device; undefined = not a
  // target.
  std::vector<at::Tensor> a_, b_;
};

// Writes the PEFT adapter folder of `adapter` (made for `model`) into `dir` (created with its
// parents): adapter_config.json (base_model_name_or_path = `base_model`) and
// adapter_model.safetensors (F32: lora_A (r, n), lora_B (m, r)). Each file is replaced atomically.
// Returns their paths. Errors: kPermissionDenied / kNotFound / kInternal from the file system,
// naming the path.
absl::StatusOr<std::vector<std::string>> WritePeftAdapter(const LoraAdapter& adapter,
                                                          const model::LlamaModel& model,
                                                          const std::string& base_model,
                                                          const std::string& dir);

// Reads a PEFT LoRA adapter folder written for `model`'s architecture (by PEFT or by
// WritePeftAdapter) into new adapters on the model's device (not attached).
// Accepted: peft_type LORA, target_modules a list of names from kLoraModuleNames or
// "all-linear", bias "none", fan_in_fan_out false, no DoRA, no rank_pattern / alpha_pattern /
// layers_to_transform; tensors F32 / BF16 / F16 (converted to fp32). A target linear whose
// tensors are absent is an error, and so is a tensor that belongs to no target.
// Errors: kNotFound (a missing file), kInvalidArgument (a malformed or unsupported config
// field, a missing or unexpected tensor, a shape that does not fit the model; each names the
// file and the field or tensor), kUnimplemented (a PEFT feature this reader does not
// implement, named), kDataLoss (a non-finite adapter value).
absl::StatusOr<std::shared_ptr<LoraAdapter>> ReadPeftAdapter(const std::string& dir,
                                                             const model::LlamaModel& model);

}  // namespace lspo::baselines

#endif  // LSPO_BASELINES_LORA_H_
