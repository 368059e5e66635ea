// GaLore's projector and AdamW. Formulas and sources: galore.h. Shapes as in galore.h (r = rank).
#include "baselines/galore.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lspo::baselines {

namespace {

// Flips each singular vector (dim `vec_dim` indexes the vectors: 0 for the rows of B, 1 for
// the columns of A) so that its entry of largest magnitude is positive. vectors: B (rank, n)
// or A (m, rank) fp32 -> the same shape, contiguous.
at::Tensor CanonicalSigns(const at::Tensor& vectors, int64_t vec_dim) {
  const int64_t along = 1 - vec_dim;
  // (rank, 1) for B, (1, rank) for A; int64
  at::Tensor idx = vectors.abs().argmax(along, /*keepdim=*/true);
  at::Tensor sgn = vectors.gather(along, idx).sign();  // idx's shape, fp32
  sgn = at::where(sgn == 0, at::ones_like(sgn), sgn);
  return (vectors * sgn).contiguous();
}

}  // namespace

GaloreSide GaloreSideOf(int64_t m, int64_t n) {
  return m >= n ? GaloreSide::kRight : GaloreSide::kLeft;
}

absl::StatusOr<at::Tensor> GaloreProjector(const at::Tensor& G, int64_t rank) {
  if (G.dim() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("GaloreProjector: the gradient must be 2-D, got ", G.dim(), "-D"));
  }
  const int64_t m = G.size(0), n = G.size(1);
  if (rank < 1 || rank > std::min(m, n)) {
    return absl::InvalidArgumentError(absl::StrCat("GaloreProjector: rank ", rank,
                                                   " is not in [1, min(m, n) = ", std::min(m, n),
                                                   "] for a (", m, ", ", n, ") gradient"));
  }
  at::Tensor g = G.to(at::kFloat);  // (m, n) fp32
  if (!at::isfinite(g).all().item<bool>()) {
    return absl::InvalidArgumentError("GaloreProjector: the gradient is not finite");
  }
  // u (m, k), s (k), vh (k, n) fp32 with k = min(m, n).
  auto [u, s, vh] = at::linalg_svd(g, /*full_matrices=*/false);
  if (GaloreSideOf(m, n) == GaloreSide::kRight) {
    return CanonicalSigns(vh.narrow(0, 0, rank), /*vec_dim=*/0);  // B (rank, n)
  }
  return CanonicalSigns(u.narrow(1, 0, rank), /*vec_dim=*/1);  // A (m, rank)
}

at::Tensor GaloreProject(const at::Tensor& G, const at::Tensor& proj, GaloreSide side) {
  at::Tensor g = G.to(at::kFloat);  // (m, n) fp32
  return side == GaloreSide::kRight ? at::mm(g, proj.t()) : at::mm(proj.t(), g);
}

at::Tensor GaloreProjectBack(const at::Tensor& N, const at::Tensor& proj, GaloreSide side) {
  return side == GaloreSide::kRight ? at::mm(N, proj) : at::mm(proj, N);
}

absl::StatusOr<std::unique_ptr<GaloreAdamW>> GaloreAdamW::Create(std::vector<at::Tensor> params,
                                                                 std::vector<std::string> names,
                                                                 const GaloreSettings& settings,
                                                                 const GaloreAdamSettings& adam) {
  if (settings.rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("galore.rank = ", settings.rank,
                     ": the rank must be >= 1 (GaLore's "
                     "usual rank is 128 for hidden sizes near 1000, a quarter of the width)"));
  }
  if (settings.update_proj_gap < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("galore.update_proj_gap = ", settings.update_proj_gap,
                     ": the projector is recomputed every this many steps; use >= 1 "
                     "(GaLore's default is 200)"));
  }
  // The scale multiplies fp32 updates: it must be a normal fp32 number (a larger one turns
  // every update into inf, a smaller one into 0).
  if (!(settings.scale >= std::numeric_limits<float>::min() &&
        settings.scale <= std::numeric_limits<float>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("galore.scale = ", settings.scale,
                     ": must be a normal fp32 number > 0 (GaLore uses 0.25 to 4)"));
  }
  if (names.size() != params.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("GaloreAdamW: ", params.size(), " matrices but ", names.size(), " names"));
  }
  auto opt = std::unique_ptr<GaloreAdamW>(new GaloreAdamW());
  size_t narrowest = 0;  // The matrix with the smallest min(m, n): it bounds the rank.
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];  // (m, n) if 2-D (checked next)
    if (p.dim() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("GaloreAdamW: ", names[i], " is ", p.dim(), "-D; GaLore trains matrices"));
    }
    const int64_t m = p.size(0), n = p.size(1);
    if (std::min(m, n) < std::min(params[narrowest].size(0), params[narrowest].size(1))) {
      narrowest = i;
    }
    opt->sides_.push_back(GaloreSideOf(m, n));
  }
  if (!params.empty()) {
    const int64_t m = params[narrowest].size(0), n = params[narrowest].size(1);
    if (settings.rank > std::min(m, n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "galore.rank = ", settings.rank, " is above the smaller side of ", names[narrowest], " (",
          m, " x ", n, "), the narrowest trained matrix: use a rank <= ", std::min(m, n),
          " (an unset galore.rank is 128)"));
    }
  }
  opt->params_ = std::move(params);
  opt->names_ = std::move(names);
  opt->settings_ = settings;
  opt->adam_ = adam;
  opt->proj_.resize(opt->params_.size());
  opt->exp_avg_.resize(opt->params_.size());
  opt->exp_avg_sq_.resize(opt->params_.size());
  return opt;
}

std::vector<int64_t> GaloreAdamW::ProjectorShape(size_t i) const {
  const int64_t m = params_[i].size(0), n = params_[i].size(1), r = settings_.rank;
  return sides_[i] == GaloreSide::kRight ? std::vector<int64_t>{r, n} : std::vector<int64_t>{m, r};
}

std::vector<int64_t> GaloreAdamW::MomentShape(size_t i) const {
  const int64_t m = params_[i].size(0), n = params_[i].size(1), r = settings_.rank;
  return sides_[i] == GaloreSide::kRight ? std::vector<int64_t>{m, r} : std::vector<int64_t>{r, n};
}

int64_t GaloreAdamW::StateBytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t m = params_[i].size(0), n = params_[i].size(1);
    bytes += 4 * settings_.rank * (2 * std::max(m, n) + std::min(m, n));
  }
  return bytes;
}

bool GaloreAdamW::Step(double lr, double* grad_norm) {
  at::NoGradGuard no_grad;
  // One host synchronisation for the finiteness check and the norm (fp64 sum of squares).
  at::Tensor sq;  // () fp64, sum of squared gradient entries
  for (const at::Tensor& p : params_) {
    if (!p.grad().defined()) continue;
    at::Tensor s = p.grad().to(at::kDouble).pow(2).sum();  // () fp64
    sq = sq.defined() ? sq + s : s;
  }
  const double norm = sq.defined() ? std::sqrt(sq.item<double>()) : 0.0;
  if (!std::isfinite(norm)) return false;
  if (grad_norm != nullptr) *grad_norm = norm;
  double clip = 1.0;
  if (adam_.max_grad_norm > 0) clip = std::min(1.0, adam_.max_grad_norm / (norm + 1e-6));

  const bool refresh = step_ % settings_.update_proj_gap == 0;
  const int64_t t = step_ + 1;
  const double b1 = adam_.beta1, b2 = adam_.beta2;
  const double step_size = lr * std::sqrt(1.0 - std::pow(b2, static_cast<double>(t))) /
                           (1.0 - std::pow(b1, static_cast<double>(t)));
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];  // (m, n), the weight's dtype
    if (!p.grad().defined()) continue;
    at::Tensor g = p.grad().to(at::kFloat);  // (m, n) fp32
    if (clip < 1.0) g = g * clip;
    if (refresh || !proj_[i].defined()) {
      // Finite (checked above) and rank <= min(m, n) (checked in Create): cannot fail.
      proj_[i] = *GaloreProjector(g, settings_.rank);
    }
    // R: right (m, rank), left (rank, n) fp32
    at::Tensor r = GaloreProject(g, proj_[i], sides_[i]);
    if (!exp_avg_[i].defined()) {
      exp_avg_[i] = at::zeros_like(r);
      exp_avg_sq_[i] = at::zeros_like(r);
    }
    exp_avg_[i].mul_(b1).add_(r, 1.0 - b1);
    exp_avg_sq_[i].mul_(b2).addcmul_(r, r, 1.0 - b2);
    at::Tensor norm_grad = exp_avg_[i] / (exp_avg_sq_[i].sqrt() + adam_.eps);  // R's shape, fp32
    // (m, n) fp32
    at::Tensor update = GaloreProjectBack(norm_grad, proj_[i], sides_[i]) * settings_.scale;
    p.add_(update.to(p.scalar_type()), -step_size);
    if (adam_.weight_decay > 0) p.add_(p, -lr * adam_.weight_decay);
  }
  step_ = t;
  return true;
}

void GaloreAdamW::AppendState(std::vector<std::pair<std::string, at::Tensor>>* tensors,
                              std::map<std::string, std::string>* metadata) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!proj_[i].defined()) continue;
    tensors->emplace_back(names_[i] + ".galore_projector", proj_[i].to(at::kCPU).contiguous());
    tensors->emplace_back(names_[i] + ".galore_exp_avg", exp_avg_[i].to(at::kCPU).contiguous());
    tensors->emplace_back(names_[i] + ".galore_exp_avg_sq",
                          exp_avg_sq_[i].to(at::kCPU).contiguous());
  }
  (*metadata)["galore_step"] = std::to_string(step_);
}

absl::Status GaloreAdamW::CheckState(const std::map<std::string, at::Tensor>& tensors,
                                     int64_t step) const {
  if (step < 0) {
    return absl::DataLossError(absl::StrCat("galore_step = ", step, " is negative"));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string base = names_[i] + ".galore_";
    int present = 0;
    for (const auto& [what, shape] :
         {std::make_pair("projector", ProjectorShape(i)), std::make_pair("exp_avg", MomentShape(i)),
          std::make_pair("exp_avg_sq", MomentShape(i))}) {
      auto it = tensors.find(base + what);
      if (it == tensors.end()) continue;
      ++present;
      const at::Tensor& t = it->second;  // any device; checked: fp32 of `shape`
      if (t.sizes() != at::IntArrayRef(shape) || t.scalar_type() != at::kFloat) {
        return absl::DataLossError(absl::StrCat("tensor '", base, what, "' is not F32 of shape [",
                                                absl::StrJoin(shape, ", "), "]"));
      }
      if (!at::isfinite(t).all().item<bool>()) {
        return absl::DataLossError(absl::StrCat("tensor '", base, what, "' is not finite"));
      }
      if (std::string(what) == "exp_avg_sq" && (t < 0).any().item<bool>()) {
        return absl::DataLossError(absl::StrCat("tensor '", base, what, "' has negative entries"));
      }
    }
    if (present != 0 && present != 3) {
      return absl::DataLossError(absl::StrCat("the galore state of ", names_[i],
                                              " is incomplete (projector and both moments go "
                                              "together)"));
    }
    if (present == 0 && step > 0 && params_[i].requires_grad()) {
      return absl::DataLossError(absl::StrCat("tensor '", base, "projector' is missing"));
    }
  }
  return absl::OkStatus();
}

absl::Status GaloreAdamW::LoadState(const std::map<std::string, at::Tensor>& tensors,
                                    int64_t step) {
  if (absl::Status st = CheckState(tensors, step); !st.ok()) return st;
  for (size_t i = 0; i < params_.size(); ++i) {
    const std::string base = names_[i] + ".galore_";
    auto take = [&](const char* what) {
      auto it = tensors.find(base + what);
      return it == tensors.end() ? at::Tensor() : it->second.to(params_[i].device()).clone();
    };
    proj_[i] = take("projector");
    exp_avg_[i] = take("exp_avg");
    exp_avg_sq_[i] = take("exp_avg_sq");
  }
  step_ = step;
  return absl::OkStatus();
}

}  // namespace lspo::baselines
