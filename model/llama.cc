// LlamaModel's forward pass: batch checks, RMSNorm, the linears (through the LinearImpl seam),
// RoPE, causal / packed / KV-cached attention, the MLP, activation checkpointing, layer hooks,
// logits and the causal-LM loss. Weights and loading: llama_weights.cc. Legend and formulas:
// llama.h.
#include "model/llama.h"

#include <glog/logging.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/linear_cross_entropy.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Concatenation of the two halves swapped: [x2, x1] for x = [x1, x2] along the last dim.
at::Tensor SwapHalves(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

// Activation checkpointing of one decoder layer (see LlamaModel::SetActivationCheckpointing):
// the forward runs without recording (autograd Functions run their forward in no-grad mode)
// and saves only the layer input; the backward recomputes the layer with grad mode on and
// runs a nested backward through it, which accumulates dense weight gradients and fires the
// custom linears' backward exactly as the plain graph would, then returns the input gradient.
struct CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h,
                            int64_t model_ptr, int64_t layer, const at::Tensor& cos,
                            const at::Tensor& sin, const at::Tensor& mask) {
    auto* model = reinterpret_cast<LlamaModel*>(model_ptr);
    ctx->save_for_backward({h});
    ctx->saved_data["model"] = model_ptr;
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["cos"] = cos;
    ctx->saved_data["sin"] = sin;
    ctx->saved_data["mask"] = mask;
    return model->DecoderLayer(h, layer, cos, sin, mask);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* model = reinterpret_cast<LlamaModel*>(ctx->saved_data["model"].toInt());
    const int64_t layer = ctx->saved_data["layer"].toInt();
    at::Tensor h = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor out;
    {
      at::AutoGradMode enable(true);
      out = model->DecoderLayer(h, layer, ctx->saved_data["cos"].toTensor(),
                                ctx->saved_data["sin"].toTensor(),
                                ctx->saved_data["mask"].toTensor());
    }
    torch::autograd::backward({out}, {grads[0]});
    return {h.grad(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor RopeInverseFrequencies(const LlamaConfig& c, const at::Device& device, bool local) {
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(device);
  const int64_t hd = c.head_dim;
  const double theta = local ? c.rope_local_theta : c.rope_theta;
  at::Tensor inv_freq = at::pow(theta, at::arange(0, hd, 2, fopts) / hd).reciprocal();  // (hd/2)
  if (local) return inv_freq;  // the sliding layers' RoPE is unscaled (Gemma 3)
  const RopeScaling& s = c.rope_scaling;
  switch (s.type) {
    case RopeScaling::Type::kNone:
      return inv_freq;
    case RopeScaling::Type::kLinear:
      return inv_freq / s.factor;
    case RopeScaling::Type::kLlama3: {
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const double low_wavelen = old_len / s.low_freq_factor;
      const double high_wavelen = old_len / s.high_freq_factor;
      at::Tensor wavelen = 2.0 * M_PI / inv_freq;  // (hd/2)
      at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq);
      at::Tensor smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
      at::Tensor medium = wavelen.ge(high_wavelen).logical_and(wavelen.le(low_wavelen));
      return at::where(medium, smoothed, scaled);
    }
  }
  return inv_freq;
}

absl::Status LlamaModel::ValidateBatch(const at::Tensor& input_ids, const at::Tensor& labels,
                                       const at::Tensor& positions) const {
  const int64_t V = config_.vocab_size;
  if (!input_ids.defined() || input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong ||
      input_ids.size(0) < 1 || input_ids.size(1) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input_ids must be a defined (B, T) int64 tensor with B, T >= 1; got ",
        input_ids.defined() ? absl::StrCat(ShapeString(input_ids.sizes()), " ",
                                           std::string(c10::toString(input_ids.scalar_type())))
                            : std::string("undefined")));
  }
  if (input_ids.device() != tensors_[0].device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("input_ids is on ", input_ids.device().str(), " but the model is on ",
                     tensors_[0].device().str(), "; move the batch with .to(device)"));
  }
  try {
    const int64_t lo = input_ids.min().item<int64_t>(), hi = input_ids.max().item<int64_t>();
    if (lo < 0 || hi >= V) {
      return absl::InvalidArgumentError(absl::StrCat("input_ids holds ids in [", lo, ", ", hi,
                                                     "]; expected ids in [0, vocab_size = ", V,
                                                     "): the tokenizer does not match the model"));
    }
    if (labels.defined()) {
      if (labels.sizes() != input_ids.sizes() || labels.scalar_type() != at::kLong) {
        return absl::InvalidArgumentError(
            absl::StrCat("labels must be int64 with the shape of input_ids ",
                         ShapeString(input_ids.sizes()), "; got ", ShapeString(labels.sizes()), " ",
                         std::string(c10::toString(labels.scalar_type()))));
      }
      at::Tensor bad = (labels != -100).logical_and(labels.lt(0).logical_or(labels.ge(V)));
      if (bad.any().item<bool>()) {
        return absl::InvalidArgumentError(absl::StrCat("labels holds values outside [0, ", V,
                                                       ") other than the ignore value -100"));
      }
    }
    if (positions.defined()) {
      if (positions.dim() != 1 || positions.size(0) != input_ids.size(0) ||
          positions.scalar_type() != at::kLong) {
        return absl::InvalidArgumentError(
            absl::StrCat("positions must be (B = ", input_ids.size(0), ") int64; got ",
                         ShapeString(positions.sizes()), " ",
                         std::string(c10::toString(positions.scalar_type()))));
      }
      const int64_t T = input_ids.size(1);
      if (positions.lt(0).logical_or(positions.ge(T)).any().item<bool>()) {
        return absl::InvalidArgumentError(absl::StrCat("positions must lie in [0, T = ", T, ")"));
      }
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("ValidateBatch: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::ValidateLayout(const at::Tensor& input_ids,
                                        const RowLayout& layout) const {
  if (!layout.positions.defined() && !layout.segment_ids.defined()) return absl::OkStatus();
  const std::array<std::pair<const char*, const at::Tensor*>, 2> parts = {
      {{"positions", &layout.positions}, {"segment_ids", &layout.segment_ids}}};
  for (const auto& [name, tp] : parts) {
    const at::Tensor& t = *tp;
    if (!t.defined() || t.sizes() != input_ids.sizes() || t.scalar_type() != at::kLong ||
        t.device() != input_ids.device()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RowLayout.", name, " must be int64 with the shape and device of input_ids ",
          ShapeString(input_ids.sizes()), "; got ",
          t.defined()
              ? absl::StrCat(ShapeString(t.sizes()), " ",
                             std::string(c10::toString(t.scalar_type())), " on ", t.device().str())
              : std::string("undefined")));
    }
  }
  try {
    if (layout.positions.lt(0).any().item<bool>()) {
      return absl::InvalidArgumentError("RowLayout.positions must be >= 0");
    }
    if (input_ids.size(1) > 1 && layout.segment_ids.diff(1, 1).lt(0).any().item<bool>()) {
      return absl::InvalidArgumentError(
          "RowLayout.segment_ids must not decrease along a row (one id per packed sequence, "
          "in order)");
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("ValidateLayout: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

at::Tensor LlamaModel::RmsNorm(const at::Tensor& x, const at::Tensor& weight) const {
  // HF LlamaRMSNorm: fp32 statistics, result cast back to x's dtype, then scaled.
  at::Tensor xf = x.to(at::kFloat);  // (..., H) fp32
  at::Tensor inv = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + config_.rms_norm_eps);
  if (config_.norm_weight_offset) {
    // Gemma3RMSNorm: x̂ · (1 + w), the product in fp32, then cast.
    return ((xf * inv) * (weight.to(at::kFloat) + 1.0)).to(x.scalar_type());
  }
  return weight * (xf * inv).to(x.scalar_type());  // (..., H)
}

at::Tensor LlamaModel::Linear(const at::Tensor& x, int64_t linear_index) {
  const at::Tensor& w = T(linear_slot_[static_cast<size_t>(linear_index)]);  // (m, n) as stored
  // 16-bit storage: compute in x's dtype (fp32) with W upcast on the fly, keeping W itself
  // for the backward rather than an upcast copy (UpcastLinear; the LinearImpl contract).
  const int64_t m = w.size(0), n = w.size(1);
  std::vector<int64_t> out_shape = x.sizes().vec();
  out_shape.back() = m;
  at::Tensor x2d = x.reshape({-1, n});  // (N, n)
  const LinearMode mode = modes_[static_cast<size_t>(linear_index)];
  at::Tensor y;  // (N, m)
  if (mode == LinearMode::kCustom && linear_impl_ != nullptr &&
      (at::GradMode::is_enabled() || linear_impl_->AppliesWithoutGrad())) {
    y = linear_impl_->Forward(x2d, w, linear_index);
  } else {
    if (mode == LinearMode::kCustom && at::GradMode::is_enabled()) {
      LOG_FIRST_N(WARNING, 8) << "LlamaModel: linear " << LinearName(linear_index)
                              << " is in kCustom mode without a LinearImpl; treated as frozen "
                                 "(call SetLinearImpl first)";
    }
    y = UpcastLinear(x2d, w);
  }
  const int64_t bias_slot = bias_slot_[static_cast<size_t>(linear_index)];
  if (bias_slot >= 0) y = y + T(bias_slot).to(y.scalar_type());  // + b (m), frozen
  return y.view(out_shape);                                      // (..., m)
}

std::pair<at::Tensor, at::Tensor> LlamaModel::RopeTables(int64_t start, int64_t T_len,
                                                         const at::Tensor& like, bool local) const {
  const int64_t hd = config_.head_dim;
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(like.device());
  // RoPE tables as HF LlamaRotaryEmbedding (fp32): inv_freq_i = θ^(-2i/hd) (then scaled,
  // llama_config.h RopeScaling), angle(t, i) = t · inv_freq_i, emb = [angle, angle].
  at::Tensor inv_freq = RopeInverseFrequencies(config_, like.device(), local);      // (hd/2) fp32
  at::Tensor angle = at::outer(at::arange(start, start + T_len, fopts), inv_freq);  // (T, hd/2)
  at::Tensor cos_half = angle.cos(), sin_half = angle.sin();
  at::Tensor cos = at::cat({cos_half, cos_half}, -1).view({T_len, 1, hd}).to(like.scalar_type());
  at::Tensor sin = at::cat({-sin_half, sin_half}, -1).view({T_len, 1, hd}).to(like.scalar_type());
  return {cos, sin};
}

std::pair<at::Tensor, at::Tensor> LlamaModel::RopeTablesAt(const at::Tensor& positions,
                                                           const at::Tensor& like,
                                                           bool local) const {
  const int64_t hd = config_.head_dim, B = positions.size(0), T_len = positions.size(1);
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(like.device());
  at::Tensor inv_freq = RopeInverseFrequencies(config_, like.device(), local);  // (hd/2) fp32
  at::Tensor angle = positions.to(fopts).unsqueeze(-1) * inv_freq;              // (B, T, hd/2)
  at::Tensor cos_half = angle.cos(), sin_half = angle.sin();
  at::Tensor cos = at::cat({cos_half, cos_half}, -1).view({B, T_len, 1, hd}).to(like.scalar_type());
  at::Tensor sin =
      at::cat({-sin_half, sin_half}, -1).view({B, T_len, 1, hd}).to(like.scalar_type());
  return {cos, sin};
}

at::Tensor LlamaModel::PackedMask(const at::Tensor& segment_ids, int64_t window) const {
  const int64_t B = segment_ids.size(0), T_len = segment_ids.size(1);
  const auto iopts = at::TensorOptions().dtype(at::kLong).device(segment_ids.device());
  at::Tensor query = at::arange(T_len, iopts).unsqueeze(1);                 // (T, 1)
  at::Tensor key = at::arange(T_len, iopts).unsqueeze(0);                   // (1, T)
  at::Tensor keep = segment_ids.unsqueeze(2).eq(segment_ids.unsqueeze(1));  // (B, T, T)
  keep = keep.logical_and(key.le(query));                                   // causal
  if (window > 0) keep = keep.logical_and((query - key).lt(window));        // t - k < W
  return at::zeros({B, T_len, T_len}, iopts.dtype(at::kFloat))
      .masked_fill(keep.logical_not(), -std::numeric_limits<float>::infinity())
      .view({B, 1, 1, T_len, T_len});
}

std::array<at::Tensor, 3> LlamaModel::RotatedQkv(const at::Tensor& a, int64_t layer,
                                                 const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t B = a.size(0), T = a.size(1);
  const int64_t nh = config_.num_heads, nkv = config_.num_kv_heads, hd = config_.head_dim;
  const int64_t base = layer * kLinearsPerLayer;
  at::Tensor q = Linear(a, base + static_cast<int64_t>(LinearKind::kQ)).view({B, T, nh, hd});
  at::Tensor k = Linear(a, base + static_cast<int64_t>(LinearKind::kK)).view({B, T, nkv, hd});
  at::Tensor v = Linear(a, base + static_cast<int64_t>(LinearKind::kV)).view({B, T, nkv, hd});
  if (config_.qk_norm) {  // Qwen3: RMSNorm over each head's hd before RoPE
    q = RmsNorm(q, this->T(q_norm_slot_[static_cast<size_t>(layer)]));
    k = RmsNorm(k, this->T(k_norm_slot_[static_cast<size_t>(layer)]));
  }
  // RoPE (HF rotate_half): x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]; the sign is
  // folded into `sin` ([-sin, sin] halves), so rotate_half(x) sin == SwapHalves(x) sin_signed.
  q = q * cos + SwapHalves(q) * sin;  // (B, T, nh, hd); cos/sin (T, 1, hd)
  k = k * cos + SwapHalves(k) * sin;  // (B, T, nkv, hd)
  return {q, k, v};
}

at::Tensor LlamaModel::Mlp(const at::Tensor& a, int64_t layer) {
  const int64_t lin = layer * kLinearsPerLayer;
  at::Tensor gate = Linear(a, lin + static_cast<int64_t>(LinearKind::kGate));  // (B, T, F)
  at::Tensor up = Linear(a, lin + static_cast<int64_t>(LinearKind::kUp));      // (B, T, F)
  at::Tensor act =
      config_.hidden_act == Activation::kGeluTanh ? at::gelu(gate, "tanh") : at::silu(gate);
  return Linear(act * up, lin + static_cast<int64_t>(LinearKind::kDown));
}

at::Tensor LlamaModel::Attention(const at::Tensor& a, int64_t layer, const at::Tensor& cos,
                                 const at::Tensor& sin, const at::Tensor& causal_mask) {
  const int64_t B = a.size(0), T = a.size(1);
  const int64_t nh = config_.num_heads, nkv = config_.num_kv_heads, hd = config_.head_dim;
  const int64_t G = nh / nkv;
  const int64_t base = layer * kLinearsPerLayer;
  auto [q, k, v] = RotatedQkv(a, layer, cos, sin);
  // GQA without repeating k/v: query head j = kv * G + g, so (B, nh, T, hd) viewed as
  // (B, nkv, G*T, hd) pairs every query row with its kv head.
  at::Tensor qg = q.transpose(1, 2).contiguous().view({B, nkv, G * T, hd});
  at::Tensor kt = k.permute({0, 2, 3, 1});  // (B, nkv, hd, T)
  at::Tensor vh = v.transpose(1, 2);        // (B, nkv, T, hd)
  const double scale =
      1.0 / std::sqrt(config_.attn_scalar > 0 ? config_.attn_scalar : static_cast<double>(hd));
  at::Tensor scores = at::matmul(qg, kt).view({B, nkv, G, T, T});  // q k^T
  scores = at::add(causal_mask, scores, scale);  // scale · q k^T + (0 | -inf), (B,nkv,G,T,T)
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(vh.scalar_type());
  at::Tensor o = at::matmul(probs.view({B, nkv, G * T, T}), vh);  // (B, nkv, G*T, hd)
  o = o.view({B, nh, T, hd}).transpose(1, 2).reshape({B, T, nh * hd});
  return Linear(o, base + static_cast<int64_t>(LinearKind::kO));  // (B, T, H)
}

at::Tensor LlamaModel::LmHead(const at::Tensor& h) const {
  const at::Tensor& w = T(lm_head_slot_);                               // (V, H)
  if (w.scalar_type() == h.scalar_type()) return at::matmul(h, w.t());  // (..., V)
  // A 16-bit head (SetFrozenStorageDtype): the GEMM in its dtype (fp32 accumulation), as
  // autocast runs it, instead of a (V, H) upcast copy per call; logits in h's dtype.
  return at::matmul(h.to(w.scalar_type()), w.t()).to(h.scalar_type());  // (..., V)
}

LlamaModel::LayerInputs LlamaModel::MakeLayerInputs(const at::Tensor& h, const RowLayout& layout,
                                                    bool local) const {
  // The window of this kind of layer: the sliding layers' (local), else the uniform window of a
  // config without sliding_layers (Mistral; 0 = none) or none (Gemma's full layers).
  const int64_t W = local || config_.sliding_layers.empty() ? config_.sliding_window : 0;
  LayerInputs in;
  if (layout.packed()) {
    std::tie(in.cos, in.sin) = RopeTablesAt(layout.positions, h, local);  // (B, T, 1, hd) each
    in.mask = PackedMask(layout.segment_ids, W);                          // (B, 1, 1, T, T)
    return in;
  }
  const int64_t T_len = h.size(1);
  const auto fopts = at::TensorOptions().dtype(at::kFloat).device(h.device());
  std::tie(in.cos, in.sin) = RopeTables(0, T_len, h, local);  // (T, 1, hd) each
  // Additive causal mask: -inf above the diagonal, (T, T); with a sliding window W also
  // -inf for keys at or before t - W (HF: key kept iff t - W < key <= t).
  const float neg_inf = -std::numeric_limits<float>::infinity();
  in.mask = at::full({T_len, T_len}, neg_inf, fopts).triu(1);
  if (W > 0 && T_len > W) in.mask = in.mask + at::full({T_len, T_len}, neg_inf, fopts).tril(-W);
  return in;
}

at::Tensor LlamaModel::Embed(const at::Tensor& input_ids) const {
  at::Tensor h = at::embedding(T(embed_slot_), input_ids);  // (B, T, H) embedding's dtype
  if (config_.embed_scale != 1.0) {
    // Gemma3TextScaledWordEmbedding: the scale rounded to the embedding's dtype first (on the
    // host: no device round trip per forward), the product in that dtype.
    const at::Scalar scale =
        at::scalar_tensor(config_.embed_scale, at::TensorOptions().dtype(h.scalar_type())).item();
    h = h * scale;
  }
  // A 16-bit embedding (SetFrozenStorageDtype): the residual stream stays fp32.
  return h.scalar_type() == at::kFloat ? h : h.to(at::kFloat);
}

at::Tensor LlamaModel::Hidden(const at::Tensor& input_ids, const RowLayout& layout) {
  at::Tensor h = Embed(input_ids);  // (B, T, H)
  const LayerInputs full = MakeLayerInputs(h, layout, /*local=*/false);
  const LayerInputs sliding =
      config_.sliding_layers.empty() ? LayerInputs{} : MakeLayerInputs(h, layout, /*local=*/true);
  const bool grad = at::GradMode::is_enabled();
  if (grad && checkpointing_ && !h.requires_grad()) {
    // A checkpointed layer records a backward node only when its input needs a gradient
    // (autograd Function semantics), and with a frozen embedding nothing would: make the
    // first layer's input a leaf that needs one, so every layer's backward (and its LSP
    // sinks or weight gradients) runs. Costs layer 0's input gradient, which is discarded.
    h = h.detach().requires_grad_(true);
  }
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    hook_state_->Run(pre_forward_, l);
    if (grad && post_backward_ && h.requires_grad()) {
      // Captures the shared state, not `this`: the model may be moved before the backward.
      h.register_hook([hook = post_backward_, state = hook_state_, l](const at::Tensor& g) {
        state->Run(hook, l);
        return g;
      });
    }
    const LayerInputs& in = config_.LayerUsesLocalRope(l) ? sliding : full;
    if (grad && checkpointing_) {
      h = CheckpointedLayer::apply(h, reinterpret_cast<int64_t>(this), l, in.cos, in.sin, in.mask);
    } else {
      h = DecoderLayer(h, l, in.cos, in.sin, in.mask);
    }
    hook_state_->Run(post_forward_, l);
  }
  return RmsNorm(h, T(final_norm_slot_));  // (B, T, H)
}

at::Tensor LlamaModel::CachedAttention(const at::Tensor& a, int64_t layer, const at::Tensor& cos,
                                       const at::Tensor& sin, int64_t start, KvCache* cache) {
  const int64_t B = a.size(0), t = a.size(1);
  const int64_t nh = config_.num_heads, nkv = config_.num_kv_heads, hd = config_.head_dim;
  const int64_t G = nh / nkv;
  const int64_t base = layer * kLinearsPerLayer;
  auto [q, k, v] = RotatedQkv(a, layer, cos, sin);  // (B, t, nh | nkv, hd)
  at::Tensor& kc = cache->k[static_cast<size_t>(layer)];
  at::Tensor& vc = cache->v[static_cast<size_t>(layer)];
  at::Tensor kn = k.transpose(1, 2);  // (B, nkv, t, hd)
  at::Tensor vn = v.transpose(1, 2);
  kc = kc.defined() ? at::cat({kc, kn}, 2) : kn.contiguous();  // (B, nkv, L, hd)
  vc = vc.defined() ? at::cat({vc, vn}, 2) : vn.contiguous();
  const int64_t L = kc.size(2);  // start + t
  at::Tensor qg = q.transpose(1, 2).contiguous().view({B, nkv, G * t, hd});
  const double scale =
      1.0 / std::sqrt(config_.attn_scalar > 0 ? config_.attn_scalar : static_cast<double>(hd));
  at::Tensor scores = at::matmul(qg, kc.transpose(2, 3)).view({B, nkv, G, t, L});
  // Query i (position start + i) sees key j iff j <= start + i and, with a window W,
  // j > start + i - W.
  const auto iopts = at::TensorOptions().dtype(at::kLong).device(a.device());
  at::Tensor qpos = at::arange(start, start + t, iopts).unsqueeze(1);  // (t, 1)
  at::Tensor kpos = at::arange(0, L, iopts).unsqueeze(0);              // (1, L)
  at::Tensor hidden = kpos > qpos;
  if (const int64_t W = config_.LayerWindow(layer); W > 0) {
    hidden = hidden.logical_or(kpos <= qpos - W);
  }
  at::Tensor mask = at::zeros({t, L}, a.options().dtype(at::kFloat))
                        .masked_fill(hidden, -std::numeric_limits<float>::infinity());
  scores = at::add(mask, scores, scale);  // (B, nkv, G, t, L)
  at::Tensor probs = at::softmax(scores, -1, at::kFloat).to(vc.scalar_type());
  at::Tensor o = at::matmul(probs.view({B, nkv, G * t, L}), vc);  // (B, nkv, G*t, hd)
  o = o.view({B, nh, t, hd}).transpose(1, 2).reshape({B, t, nh * hd});
  return Linear(o, base + static_cast<int64_t>(LinearKind::kO));  // (B, t, H)
}

absl::StatusOr<at::Tensor> LlamaModel::ForwardCached(const at::Tensor& input_ids, KvCache* cache) {
  RETURN_IF_ERROR(ValidateBatch(input_ids));
  const int64_t B = input_ids.size(0), t = input_ids.size(1);
  const size_t layers = static_cast<size_t>(config_.num_layers);
  if (cache->length == 0) {
    cache->k.assign(layers, at::Tensor());
    cache->v.assign(layers, at::Tensor());
  } else if (cache->k.size() != layers || cache->v.size() != layers || !cache->k[0].defined() ||
             cache->k[0].size(0) != B) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ForwardCached: the KV cache holds ", cache->k.size(), " layers of batch ",
        cache->k.empty() || !cache->k[0].defined() ? 0 : cache->k[0].size(0), " but the model has ",
        layers, " layers and the batch is ", B, "; use a fresh KvCache per batch"));
  }
  try {
    const int64_t start = cache->length;
    at::Tensor h = Embed(input_ids);            // (B, t, H)
    auto [cos, sin] = RopeTables(start, t, h);  // (t, 1, hd) each
    at::Tensor cos_local, sin_local;            // the sliding layers' (Gemma 3)
    if (!config_.sliding_layers.empty()) {
      std::tie(cos_local, sin_local) = RopeTables(start, t, h, /*local=*/true);
    }
    for (int64_t l = 0; l < config_.num_layers; ++l) {
      const bool local = config_.LayerUsesLocalRope(l);
      const size_t i = static_cast<size_t>(l);
      at::Tensor a = RmsNorm(h, T(input_norm_slot_[i]));
      at::Tensor o =
          CachedAttention(a, l, local ? cos_local : cos, local ? sin_local : sin, start, cache);
      h = BlockTail(h, o, l);
    }
    cache->length = start + t;
    at::Tensor last = h.select(1, t - 1);               // (B, H)
    return LmHead(RmsNorm(last, T(final_norm_slot_)));  // (B, V)
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("LlamaModel::ForwardCached: ", e.what_without_backtrace()));
  }
}

at::Tensor LlamaModel::DecoderLayer(const at::Tensor& h_in, int64_t l, const at::Tensor& cos,
                                    const at::Tensor& sin, const at::Tensor& mask) {
  at::Tensor a = RmsNorm(h_in, T(input_norm_slot_[static_cast<size_t>(l)]));
  return BlockTail(h_in, Attention(a, l, cos, sin, mask), l);
}

at::Tensor LlamaModel::BlockTail(const at::Tensor& h_in, const at::Tensor& attn, int64_t l) {
  const size_t i = static_cast<size_t>(l);
  if (!config_.sandwich_norms) {
    at::Tensor h = h_in + attn;
    return h + Mlp(RmsNorm(h, T(post_norm_slot_[i])), l);
  }
  // Gemma: post_attention_layernorm on the attention output, norms around the MLP.
  at::Tensor h = h_in + RmsNorm(attn, T(post_norm_slot_[i]));
  return h + RmsNorm(Mlp(RmsNorm(h, T(pre_ff_norm_slot_[i])), l), T(post_ff_norm_slot_[i]));
}

void LlamaModel::HookState::Run(const LayerHook& hook, int64_t layer) {
  if (!hook) return;
  {
    absl::MutexLock lock(&mu);
    if (!status.ok()) return;
  }
  absl::Status s = hook(layer);  // Not under mu: a hook may read HookStatus().
  if (s.ok()) return;
  const bool stop = absl::IsCancelled(s);
  const std::string message(s.message());
  {
    absl::MutexLock lock(&mu);
    if (status.ok()) status = std::move(s);
  }
  if (stop) throw LayerPassStopped(message);
}

absl::Status LlamaModel::HookStatus() const {
  absl::MutexLock lock(&hook_state_->mu);
  return hook_state_->status;
}

void LlamaModel::ClearHookStatus() {
  absl::MutexLock lock(&hook_state_->mu);
  hook_state_->status = absl::OkStatus();
}

void LlamaModel::SetLayerHooks(LayerHook pre_forward, LayerHook post_forward,
                               LayerHook post_backward) {
  pre_forward_ = std::move(pre_forward);
  post_forward_ = std::move(post_forward);
  post_backward_ = std::move(post_backward);
}

at::Tensor LlamaModel::Logits(const at::Tensor& input_ids, const RowLayout& layout) {
  return LmHead(Hidden(input_ids, layout));  // (B, T, V)
}

at::Tensor LlamaModel::LogitsAt(const at::Tensor& input_ids, const at::Tensor& positions) {
  const int64_t B = input_ids.size(0), T_len = input_ids.size(1);
  at::Tensor h = Hidden(input_ids);                                          // (B, T, H)
  at::Tensor rows = at::arange(B, positions.options()) * T_len + positions;  // (B) flat row index
  return LmHead(h.reshape({B * T_len, -1}).index_select(0, rows));           // (B, V)
}

at::Tensor LlamaModel::CausalLmLoss(const at::Tensor& input_ids, const at::Tensor& labels,
                                    const RowLayout& layout) {
  const int64_t B = input_ids.size(0), T_len = input_ids.size(1);
  at::Tensor h = Hidden(input_ids, layout);  // (B, T, H)
  // target(b, t) = labels(b, t + 1) for t < T - 1; -100 at t = T - 1.
  at::Tensor target = at::full({B, T_len}, -100, labels.options());  // (B, T) int64
  if (T_len > 1) target.narrow(1, 0, T_len - 1).copy_(labels.narrow(1, 1, T_len - 1));
  target = target.view(-1);                   // (N)
  const at::Tensor& head = T(lm_head_slot_);  // (V, H), frozen
  if (h.is_cuda()) {
    // On a GPU: every one of the N rows, the ignored ones masked, instead of gathering the K
    // target rows, whose count (nonzero) would make the host wait for the forward. Same value.
    at::Tensor nll = LinearCrossEntropySum(h.reshape({B * T_len, -1}), head, target);  // ()
    at::Tensor k = (target != -100).sum().clamp_min(1).to(nll.scalar_type());          // K (>= 1)
    return nll / k;  // K == 0: 0, still attached to the graph
  }
  at::Tensor rows = (target != -100).nonzero().view(-1);  // (K) flat row index
  if (rows.numel() == 0) return h.sum() * 0.0;            // K == 0: zero, still a graph
  at::Tensor hsel = h.reshape({B * T_len, -1}).index_select(0, rows);  // (K, H)
  return LinearCrossEntropySum(hsel, head, target.index_select(0, rows)) /
         static_cast<double>(rows.numel());
}

}  // namespace lspo::model
