// Llama-family decoder (HF `LlamaForCausalLM` semantics) in LibTorch. How a trained linear
// layer computes its backward is a seam (model/linear_impl.h): the model knows no training
// method (LSP-Offload's compressed gradients are lsp/lsp_linear.h).
//
// Dimension legend (every tensor below carries one of these shape comments):
//   B batch rows, T sequence length, N = B·T tokens (or K selected tokens), V vocab,
//   H hidden size, F intermediate (SwiGLU) size, nh query heads, nkv key/value heads,
//   G = nh / nkv query heads per kv head, hd head dim,
//   m out-features and n in-features of a linear weight W (m, n) (HF layout: y = x W^T),
//   d subspace dimension of the projectors P (m, d), Q (n, d).
//
// Forward (HF modeling_llama.py; docs/formats.md §3/§5):
//   h0 = embed_tokens[ids]                                   (B, T, H)
//   per layer: a = RMSNorm(h) ; q,k,v = a Wq^T, a Wk^T, a Wv^T ; RoPE(q, k) ;
//              o = softmax(q k^T / sqrt(hd) + causal) v  (GQA: q head j uses kv head j / G) ;
//              h += o Wo^T ; a = RMSNorm(h) ; h += (silu(a Wg^T) * (a Wu^T)) Wd^T
//   out = RMSNorm_final(h) ; logits = out lm_head^T (lm_head = embed_tokens when tied).
//   RMSNorm(x) = w * x / sqrt(mean(x^2) + eps), computed in fp32.
//   Linears with a bias (Qwen2 q/k/v; Llama attention_bias q/k/v/o) add it: y = x W^T + b.
//   Qwen3 (config.qk_norm): q and k are RMSNorm-ed per head over hd (weights q_norm, k_norm)
//   before RoPE: q_h = RMSNorm(q_h) * q_norm (HF modeling_qwen3.py Qwen3Attention).
//   Gemma 3 (HF modeling_gemma3.py; llama_config.h): h0 = embed_tokens[ids] * sqrt(H);
//   per layer h += N_post(attention(N_in(h))); h += N_post_ff(mlp(N_pre_ff(h))) with
//   N(x) = x̂ (1 + w) (fp32 product), gelu-tanh GeGLU, q_norm / k_norm, scores scaled by
//   query_pre_attn_scalar^-1/2, and per layer either a sliding window with the local RoPE
//   base or full attention with rope_theta (config.LayerWindow / LayerUsesLocalRope).
//   RoPE: HF rotate_half convention on un-permuted q/k rows (pairs (i, i + hd/2)),
//   angle = pos · inv_freq_i (RopeInverseFrequencies: θ^(-2i/hd), scaled per
//   config.rope_scaling), positions 0..T-1 for every row.
//   Attention is causal; with config.sliding_window W > 0 a query at t sees keys in (t-W, t].
//   Softmax is computed in fp32.
// Padding: callers pad on the RIGHT; causal attention alone then gives the unpadded result
// for every real token, so no attention mask is taken. Left padding is NOT supported (the
// pads would shift RoPE positions and be attended to).
//
// Thread-safety: not thread-safe. One thread at a time may run forward/backward or mutate the
// model; distinct models are independent. Intra-op parallelism follows at::get_num_threads()
// (callers set it with at::set_num_threads). Hooks and a LinearImpl's backward run on the
// thread that calls backward.
#ifndef LSPO_MODEL_LLAMA_H_
#define LSPO_MODEL_LLAMA_H_

#include "third_party/torch/torch_api.h"

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "model/linear_impl.h"
#include "model/llama_config.h"

namespace lspo::model {

class GgufFile;
class HfCheckpoint;

// RoPE inverse frequencies of `config`: (head_dim / 2) fp32 on `device`, inv_freq_i =
// rope_theta^(-2i/head_dim), then the rope_scaling rule (llama_config.h RopeScaling;
// transformers modeling_rope_utils.py), computed in fp32 as transformers does.
// `local`: the inverse frequencies of the sliding layers of a config with sliding_layers
// (Gemma 3): base rope_local_theta, no scaling.
at::Tensor RopeInverseFrequencies(const LlamaConfig& config, const at::Device& device,
                                  bool local = false);

// The 7 linear weights of a decoder layer. Global linear index i = layer * 7 + kind.
enum class LinearKind : int64_t { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
inline constexpr int64_t kLinearsPerLayer = 7;
inline int64_t LinearIndex(int64_t layer, LinearKind kind) {
  return layer * kLinearsPerLayer + static_cast<int64_t>(kind);
}

// How a linear weight is trained.
enum class LinearMode {
  // W.requires_grad() == false: no weight gradient; dX still flows.
  kFrozen,
  // W.requires_grad() == true: autograd accumulates the full G (m, n) fp32 into W.grad()
  // (used for calibration gradients and the `zero`/`native` baselines).
  kDense,
  // The installed LinearImpl computes the linear with grad mode on (SetLinearImpl), e.g. the
  // LSP node (lsp/lsp_linear.h). W.requires_grad() == false. With no LinearImpl installed, or
  // under at::NoGradGuard with one whose AppliesWithoutGrad() is false, the linear computes
  // as kFrozen.
  kCustom,
};

// Keys and values of every decoder layer for the positions decoded so far (incremental
// decoding, LlamaModel::ForwardCached). k[l], v[l]: (B, nkv, L, hd) fp32 on the model's
// device, L = length. A fresh (default) cache is empty; one cache serves one batch of rows.
struct KvCache {
  std::vector<at::Tensor> k;
  std::vector<at::Tensor> v;
  int64_t length = 0;  // positions cached (tokens per row)
};

// Called with a decoder layer index (see LlamaModel::SetLayerHooks). A hook that fails
// returns a non-OK status: the model stops calling hooks for that pass, and the forward (or
// the end of the backward) reports the first such status through HookStatus().
using LayerHook = std::function<absl::Status(int64_t layer)>;

// Thrown out of a forward or backward when a layer hook returned kCancelled (see
// LlamaModel::SetLayerHooks): unwinds the rest of the pass. what() is the hook's message.
class LayerPassStopped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How the tokens of each batch row map to sequences. Default (both undefined): every row is
// one sequence from position 0, attended causally. A packed row (data/datasets.h
// PackExamples, data.packing) holds several sequences, which must not see each other:
//   positions   (B, T) int64 on the model's device: each token's position within its
//               sequence (the RoPE angle t · inv_freq uses it);
//   segment_ids (B, T) int64: token t attends to key k iff k <= t, their segment ids are
//               equal and (sliding window W) t - k < W.
// Each sequence then gets the hidden states, logits and loss it gets alone (within fp32
// rounding), as transformers' packed-sequence training (position_ids restarting at 0 with
// flash-attention's variable-length kernels) gives.
struct RowLayout {
  at::Tensor positions;
  at::Tensor segment_ids;
  bool packed() const { return positions.defined(); }
};

class LlamaModel {
 public:
  LlamaModel(LlamaModel&&) = default;
  LlamaModel& operator=(LlamaModel&&) = default;
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // Loads a GGUF Llama checkpoint: config from LlamaConfigFromGguf, every tensor dequantised
  // to fp32 on the CPU in HF names and layout (q/k un-permuted, docs/formats.md §3).
  // Errors: those of LlamaConfigFromGguf and LoadHfTensor (kUnimplemented architecture or
  // tensor type, kNotFound missing tensor, kDataLoss corrupt data); kInvalidArgument when a
  // tensor's shape differs from the config's.
  static absl::StatusOr<LlamaModel> FromGguf(const GgufFile& gguf);

  // Loads an HF model folder (model/hf_checkpoint.h) of a supported family: the config from
  // config.json (LlamaConfigFromHfJson), then every tensor converted one at a time from
  // F32 / BF16 / F16 to the model's fp32 tensor, the source pages released after each, so
  // peak memory stays near the size of the fp32 model. A tied model ignores a stored
  // lm_head.weight (as transformers' tie_weights does); rotary_emb.inv_freq buffers of old
  // checkpoints are skipped.
  // Errors (each names the file and tensor): those of LlamaConfigFromHfJson; kInvalidArgument
  // when a tensor the config implies is missing (e.g. lm_head.weight with
  // tie_word_embeddings false, or q_proj.bias of a Qwen2 config), when the folder has a
  // tensor the config does not imply (config.json contradicts the weights), or when a shape
  // differs from the config's; kUnimplemented for a dtype other than F32 / BF16 / F16.
  static absl::StatusOr<LlamaModel> FromHfCheckpoint(const HfCheckpoint& checkpoint);

  // A randomly initialised model (HF `_init_weights`): linear and embedding weights
  // ~ N(0, 0.02^2) fp32, RMSNorm weights 1, biases 0. Deterministic in `seed` (own CPU generator;
  // the global torch RNG is untouched). Errors: kInvalidArgument when config.Validate() fails.
  static absl::StatusOr<LlamaModel> RandomInit(const LlamaConfig& config, uint64_t seed);

  const LlamaConfig& config() const { return config_; }

  // Checks a batch before it reaches the tensor functions below (whose inputs are
  // preconditions): input_ids (B, T) int64 on the model's device, B >= 1, 1 <= T; every id in
  // [0, V). If `labels` is defined: (B, T) int64, each value -100 or in [0, V). If `positions`
  // is defined: (B) int64 with values in [0, T). Returns kInvalidArgument naming the tensor.
  absl::Status ValidateBatch(const at::Tensor& input_ids, const at::Tensor& labels = {},
                             const at::Tensor& positions = {}) const;

  // Checks a RowLayout for input_ids (already valid): undefined, or positions and
  // segment_ids both (B, T) int64 on the model's device, positions >= 0, segment ids
  // non-decreasing along each row. Returns kInvalidArgument naming the tensor.
  absl::Status ValidateLayout(const at::Tensor& input_ids, const RowLayout& layout) const;

  // Final-normed hidden states: input_ids (B, T) int64 -> (B, T, H) fp32. Differentiable.
  // `layout`: packed rows (RowLayout); default one sequence per row.
  at::Tensor Hidden(const at::Tensor& input_ids, const RowLayout& layout = {});

  // All logits: input_ids (B, T) int64 -> (B, T, V) fp32. Costs an N x H x V matmul; prefer
  // LogitsAt or CausalLmLoss when only some positions matter.
  at::Tensor Logits(const at::Tensor& input_ids, const RowLayout& layout = {});

  // Logits at one position per row: input_ids (B, T) int64, positions (B) int64 in [0, T)
  // -> (B, V) fp32. lm_head runs on the B selected hidden rows only.
  at::Tensor LogitsAt(const at::Tensor& input_ids, const at::Tensor& positions);

  // Mean next-token cross-entropy (HF LlamaForCausalLM convention: labels are NOT shifted by
  // the caller; the token at position t predicts labels[:, t + 1]; -100 = ignored).
  // input_ids, labels: (B, T) int64 -> scalar fp32 = mean over the K non-ignored targets of
  // -log softmax(logits)[target]. lm_head and the log-softmax are computed ONLY for the K
  // hidden rows that have a target (rows are gathered before lm_head), so the cost is
  // K x H x V instead of N x H x V (on CUDA all N rows are computed with ignore_index, so
  // that the host never waits for the forward to count K). The logits exist one block of rows
  // at a time and the backward keeps dL/dh (rows x H), not the log-probabilities
  // (model/linear_cross_entropy.h). When K == 0 the result is 0
  // (still attached to the graph, so backward runs and yields zero gradients) where HF would
  // return NaN.
  // With a packed `layout` the label at each sequence's first token must be -100
  // (PackExamples makes it so), so that no target crosses a boundary.
  at::Tensor CausalLmLoss(const at::Tensor& input_ids, const at::Tensor& labels,
                          const RowLayout& layout = {});

  // Incremental decoding (no autograd; call under at::NoGradGuard): runs the t new tokens
  // input_ids (B, t) int64 at positions cache->length .. cache->length + t - 1, attending to
  // the cached keys/values and to each other causally (and within the sliding window), appends
  // their keys/values to `cache`, and returns the logits of the last new position: (B, V)
  // fp32. Same formulas as Logits(): ForwardCached(prompt) then one token at a time gives the
  // logits Logits() gives for the whole sequence (within fp32 rounding). No layer hooks run.
  // Positions may run past max_position_embeddings (RoPE extends, as in transformers).
  // Errors: kInvalidArgument for ids ValidateBatch rejects, or a non-empty cache of another
  // batch size or layer count.
  absl::StatusOr<at::Tensor> ForwardCached(const at::Tensor& input_ids, KvCache* cache);

  // Number of linear weights: 7 * num_layers.
  int64_t num_linears() const { return static_cast<int64_t>(linear_slot_.size()); }

  // HF name of linear i, e.g. "model.layers.3.self_attn.k_proj.weight". i in [0, num_linears).
  std::string LinearName(int64_t i) const;

  // The weight of linear i: (m, n) fp32, HF layout (out, in). The reference aliases the
  // model's tensor: in-place updates (under at::NoGradGuard when it requires grad, e.g.
  // W += P D Q^T) change the model. i in [0, num_linears) (CHECKed).
  at::Tensor& LinearWeight(int64_t i);
  const at::Tensor& LinearWeight(int64_t i) const;

  // Sets the mode of every linear (or of linear i). kDense sets W.requires_grad(true);
  // kFrozen and kCustom set it false. W.grad() is left as is (see ZeroLinearGrads). Must not be
  // called between a forward and its backward.
  void SetLinearMode(LinearMode mode);
  void SetLinearMode(int64_t i, LinearMode mode);
  LinearMode linear_mode(int64_t i) const { return modes_[static_cast<size_t>(i)]; }

  // Resets W.grad() of every linear to undefined (dense-mode gradients accumulate otherwise).
  void ZeroLinearGrads();

  // Installs how kCustom linears compute (shared by all of them; null removes it). Takes
  // effect at the next forward (a forward already recorded keeps the nodes it made). Must not
  // be called between a forward and its backward.
  void SetLinearImpl(std::shared_ptr<LinearImpl> impl) { linear_impl_ = std::move(impl); }
  const std::shared_ptr<LinearImpl>& linear_impl() const { return linear_impl_; }

  // Per-layer callbacks (any may be empty), for the offload schedule and the timeline:
  //   pre_forward(l)   before decoder layer l's forward in Hidden() (not during an activation
  //                    checkpointing recompute); may modify layer l's weights in place (the
  //                    layer has recorded nothing yet), e.g. to apply a pending update.
  //   post_forward(l)  after layer l's forward.
  //   post_backward(l) when the gradient w.r.t. layer l's input is computed, i.e. layer l's
  //                    backward is done (autograd thread); not called for a layer whose input
  //                    needs no gradient (layer 0 with a frozen embedding: the end of
  //                    backward() marks it).
  // A forward under at::NoGradGuard calls pre/post_forward only. Hooks must not throw: a
  // failure is a returned status. After the first failing hook of a pass no further hook
  // runs until ClearHookStatus(); the forward still completes (its result must then be
  // discarded) and HookStatus() returns that first failure with its code unchanged. Except
  // kCancelled: a hook returning it stops the pass at that layer boundary (the forward or
  // backward throws LayerPassStopped, which the caller's TorchCall turns into a status;
  // HookStatus() then holds the kCancelled status).
  void SetLayerHooks(LayerHook pre_forward, LayerHook post_forward, LayerHook post_backward);
  // The first failure of a layer hook since the last ClearHookStatus() (OK if none).
  // Thread-safe with respect to the autograd thread that runs post_backward.
  absl::Status HookStatus() const;
  void ClearHookStatus();

  // Activation checkpointing: when on, a forward with grad mode enabled keeps only each
  // decoder layer's input (B, T, H) and recomputes the layer inside the backward pass (a
  // custom autograd node running a nested backward), trading one extra layer forward per
  // layer for activation memory. Gradients (dense G, compressed S) are bitwise those of the
  // plain forward. Must not be toggled between a forward and its backward.
  void SetActivationCheckpointing(bool on) { checkpointing_ = on; }
  bool activation_checkpointing() const { return checkpointing_; }

  // Storage dtype of the linear weights: at::kFloat (default) or at::kBFloat16. Compute stays
  // fp32: a bf16 weight is upcast in every forward (autograd-tracked in kDense, where W.grad()
  // is then bf16). Used to reproduce bf16 weight rounding (W += P D Q^T rounds once into
  // bf16) on CPUs without fast bf16 matmul. kInvalidArgument for other dtypes.
  absl::Status SetLinearStorageDtype(at::ScalarType dtype);

  // Storage dtype of the frozen tensors that are not linears: the embedding, an untied lm_head
  // and every norm weight (biases stay fp32), at::kFloat or at::kBFloat16; a tensor that
  // requires a gradient (a test training a tied embedding) is left as it is. Compute stays
  // fp32: the embedding's rows are upcast after Gemma's scale, a norm multiplies its fp32
  // statistics by the weight's exact value, and the head's GEMMs run in its dtype with fp32
  // output (LmHead; the loss's LinearCrossEntropySum, as autocast runs a bf16 head). A CUDA
  // worker stores them in bf16 (issue 42: 2 bytes per parameter less). kInvalidArgument for
  // other dtypes.
  absl::Status SetFrozenStorageDtype(at::ScalarType dtype);

  // Moves every model tensor and the LinearImpl's tensors to `device` (e.g. cuda:0),
  // keeping dtypes and requires_grad flags; references from LinearWeight() taken before the
  // call are stale afterwards (re-fetch them; optimizers and hooks must be set up after).
  // Must not be called between a forward and its backward. On error the model is unchanged.
  // Errors: kInvalidArgument naming the device when LibTorch cannot place tensors there
  // (e.g. cuda with a CPU-only LibTorch, or not enough device memory).
  absl::Status To(const at::Device& device);
  // The device of the model's tensors (all on one device).
  at::Device device() const;

  // One decoder layer: h (B, T, H) fp32 -> (B, T, H). cos/sin (T, 1, hd) RoPE tables and
  // mask (T, T) additive causal mask as built by Hidden(); for packed rows cos/sin
  // (B, T, 1, hd) and mask (B, 1, 1, T, T). Calls no hooks.
  at::Tensor DecoderLayer(const at::Tensor& h, int64_t layer, const at::Tensor& cos,
                          const at::Tensor& sin, const at::Tensor& mask);

  // Every model tensor with its HF name, in order: embed_tokens, per layer
  // [input_layernorm, q, k, v, o (each followed by its bias when the config has one),
  // [q_norm, k_norm], post_attention_layernorm, [pre_ / post_feedforward_layernorm], gate, up,
  // down], norm, and lm_head only when not tied (272
  // tensors for SmolLM2-135M). The tensors alias the model's. Biases, norms and embeddings
  // stay frozen in every training mode (only the 7 linears per layer are trained).
  std::vector<std::pair<std::string, at::Tensor>> NamedTensors() const;

  // The tensor named `hf_name` (aliases the model's; e.g. to set requires_grad on
  // model.embed_tokens.weight). kNotFound for an unknown name (and lm_head when tied).
  absl::StatusOr<at::Tensor> GetTensor(const std::string& hf_name) const;

  // Copies `value` (any floating dtype, converted to fp32) into the tensor `hf_name`, in place
  // (aliases and requires_grad flags stay valid). Errors: kNotFound for an unknown name;
  // kInvalidArgument for a shape mismatch (message gives both shapes), a non-floating dtype,
  // or lm_head.weight of a tied model (set model.embed_tokens.weight instead).
  absl::Status SetTensor(const std::string& hf_name, const at::Tensor& value);

 private:
  LlamaModel() = default;
  // Allocates uninitialised fp32 tensors for `config` (already validated).
  static LlamaModel Allocate(const LlamaConfig& config);

  const at::Tensor& T(int64_t slot) const { return tensors_[static_cast<size_t>(slot)]; }
  at::Tensor Linear(const at::Tensor& x, int64_t linear_index);
  at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight) const;
  at::Tensor Attention(const at::Tensor& a, int64_t layer, const at::Tensor& cos,
                       const at::Tensor& sin, const at::Tensor& causal_mask);
  at::Tensor LmHead(const at::Tensor& h) const;
  // embed_tokens rows of input_ids (B, T) int64 -> (B, T, H), times config.embed_scale.
  at::Tensor Embed(const at::Tensor& input_ids) const;
  // RoPE cos / sin tables (T_len, 1, hd) in like's dtype and device for positions
  // [start, start + T_len); the sign of rotate_half is folded into sin ([-sin, sin]).
  // `local`: the sliding layers' base (RopeInverseFrequencies).
  std::pair<at::Tensor, at::Tensor> RopeTables(int64_t start, int64_t T_len, const at::Tensor& like,
                                               bool local = false) const;
  // The same tables at given positions (B, T) int64: (B, T, 1, hd) each.
  std::pair<at::Tensor, at::Tensor> RopeTablesAt(const at::Tensor& positions,
                                                 const at::Tensor& like, bool local = false) const;
  // Additive mask (B, 1, 1, T, T) fp32 of a packed layout's segment_ids (B, T): 0 where
  // RowLayout lets a query attend to a key (within `window` W > 0: t - k < W), -inf elsewhere.
  at::Tensor PackedMask(const at::Tensor& segment_ids, int64_t window) const;
  // RoPE tables and mask for the layers of one kind (Hidden): `local` = the sliding layers of a
  // config with sliding_layers, else every other layer.
  struct LayerInputs {
    at::Tensor cos, sin, mask;
  };
  LayerInputs MakeLayerInputs(const at::Tensor& h, const RowLayout& layout, bool local) const;
  // q (B, T, nh, hd), k, v (B, T, nkv, hd) of layer `layer` from a (B, T, H), q and k rotated.
  std::array<at::Tensor, 3> RotatedQkv(const at::Tensor& a, int64_t layer, const at::Tensor& cos,
                                       const at::Tensor& sin);
  // The rest of decoder layer l after its attention: h_in (B, T, H) the layer's input, attn the
  // attention's output (B, T, H, after o_proj) -> the layer's output (the residual adds and the
  // MLP; Gemma's sandwich norms).
  at::Tensor BlockTail(const at::Tensor& h_in, const at::Tensor& attn, int64_t l);
  // SwiGLU (GeGLU for Gemma) MLP of layer `layer`: a (B, T, H) -> (B, T, H).
  at::Tensor Mlp(const at::Tensor& a, int64_t layer);
  // Attention of t new rows a (B, t, H) at positions [start, start + t) against the cache of
  // `layer` (extended in place). cos/sin (t, 1, hd).
  at::Tensor CachedAttention(const at::Tensor& a, int64_t layer, const at::Tensor& cos,
                             const at::Tensor& sin, int64_t start, KvCache* cache);

  LlamaConfig config_;
  std::vector<std::string> names_;   // HF names, NamedTensors order.
  std::vector<at::Tensor> tensors_;  // fp32, aliases handed out by NamedTensors.
  absl::flat_hash_map<std::string, int64_t> slot_of_;
  std::vector<int64_t> linear_slot_;        // linear index -> slot in tensors_.
  std::vector<int64_t> bias_slot_;          // linear index -> slot of its bias, -1 = none.
  std::vector<int64_t> input_norm_slot_;    // layer -> input_layernorm slot.
  std::vector<int64_t> post_norm_slot_;     // layer -> post_attention_layernorm slot.
  std::vector<int64_t> q_norm_slot_;        // layer -> self_attn.q_norm slot (qk_norm only).
  std::vector<int64_t> k_norm_slot_;        // layer -> self_attn.k_norm slot (qk_norm only).
  std::vector<int64_t> pre_ff_norm_slot_;   // layer -> pre_feedforward_layernorm (sandwich).
  std::vector<int64_t> post_ff_norm_slot_;  // layer -> post_feedforward_layernorm (sandwich).
  int64_t embed_slot_ = 0;
  int64_t final_norm_slot_ = 0;
  int64_t lm_head_slot_ = 0;  // == embed_slot_ when tied.
  std::vector<LinearMode> modes_;
  std::shared_ptr<LinearImpl> linear_impl_;
  LayerHook pre_forward_, post_forward_, post_backward_;
  // First hook failure of the pass; shared with the backward hooks a forward registered
  // (stable across model moves). Guarded by its own mutex (autograd thread vs caller).
  struct HookState {
    // Runs `hook(layer)` (if set) unless an earlier hook failed; records the first failure.
    void Run(const LayerHook& hook, int64_t layer);
    mutable absl::Mutex mu;
    absl::Status status ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<HookState> hook_state_ = std::make_shared<HookState>();
  bool checkpointing_ = false;
};

}  // namespace lspo::model

#endif  // LSPO_MODEL_LLAMA_H_
