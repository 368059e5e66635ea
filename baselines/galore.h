// GaLore (Zhao et al., ICML 2024, "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
// Projection", arXiv 2403.03507, Alg. 2), with the semantics of the galore-torch package's
// GaLoreProjector (proj_type "std") and AdamW, so that the same gradients give the same
// weights (docs/baselines.md "GaLore"; tests/baselines/galore_test.cc checks it against
// galore-torch).
//
// Per trained matrix W (m, n) (HF layout) with gradient G (m, n) and rank r <= min(m, n):
//   m >= n  (right):  projector B (r, n) = the first r rows of V^T of G = U S V^T;
//                     R = G B^T (m, r);     back: N B (m, n)
//   m <  n  (left):   projector A (m, r) = the first r columns of U;
//                     R = A^T G (r, n);     back: A N (m, n)
// The projector is recomputed from the step's own gradient at optimizer steps t (1-based) with
// (t - 1) % update_proj_gap == 0; in between it is kept. Adam runs on R with moments of R's
// shape, which are KEPT (not transformed) when the projector changes, as in galore-torch:
//   M <- b1 M + (1 - b1) R,  V <- b2 V + (1 - b2) R^2   (elementwise),
//   step_size = lr sqrt(1 - b2^t) / (1 - b1^t),
//   W <- W - step_size * scale * back(M / (sqrt(V) + eps)),
//   W <- W - lr wd W   (decoupled weight decay applied after the step, as galore-torch does).
// One deliberate difference: the sign of each singular vector is made canonical (its entry
// of largest magnitude positive). An SVD's signs are arbitrary and differ between LAPACK
// builds (OpenBLAS here, MKL in PyPI's torch, cuSOLVER on a GPU); with moments kept across a
// projector change a flipped sign flips the meaning of those moments, so canonical signs make
// a run (and a resume on another machine) reproducible. Within one projector period the
// update does not depend on the signs at all.
//
// Shapes: m out features, n in features of W; r (`rank` in code) is GaLore's rank
// (galore.rank), not lsp's non-zeros per projector row. All GaLore state is fp32.
//
// Thread-safety: none; one thread at a time (the worker's mutex).
#ifndef LSPO_BASELINES_GALORE_H_
#define LSPO_BASELINES_GALORE_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lspo::baselines {

// The job spec's galore settings (galore-torch's param-group keys).
struct GaloreSettings {
  int64_t rank = 128;             // "rank": columns kept of the projected side.
  int64_t update_proj_gap = 200;  // "update_proj_gap": optimizer steps between SVDs.
  double scale = 0.25;            // "scale": multiplies the projected-back step.
};

// Adam's settings (galore-torch AdamW's lr is given per step; correct_bias is always true).
struct GaloreAdamSettings {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double max_grad_norm = 0.0;  // > 0: global L2 clipping of the full gradients first.
};

// Which side of W (m, n) is projected: right (B (r, n)) when m >= n, else left (A (m, r)).
enum class GaloreSide { kRight, kLeft };
GaloreSide GaloreSideOf(int64_t m, int64_t n);

// The rank-`rank` projector of gradient G (m, n), any floating dtype and device: right
// B (rank, n) or left A (m, rank) (see the file comment), fp32 on G's device, with canonical
// singular-vector signs. Computed by at::linalg_svd (full_matrices = false) in fp32.
// Errors: kInvalidArgument if G is not 2-D, rank < 1 or rank > min(m, n), or G is not finite.
absl::StatusOr<at::Tensor> GaloreProjector(const at::Tensor& G, int64_t rank);

// R = G B^T (m, rank) or A^T G (rank, n), fp32. G (m, n); `proj` from GaloreProjector.
at::Tensor GaloreProject(const at::Tensor& G, const at::Tensor& proj, GaloreSide side);
// The full-space (m, n) fp32 image of a projected tensor N (R's shape): N B or A N (unscaled).
at::Tensor GaloreProjectBack(const at::Tensor& N, const at::Tensor& proj, GaloreSide side);

// GaLore AdamW over a list of matrices (see the file comment).
class GaloreAdamW {
 public:
  // Trains `params` (2-D (m, n) leaf tensors with requires_grad, any floating dtype, one device;
  // names for messages and checkpoints, e.g. "model.layers.0.self_attn.q_proj"). Errors:
  // kInvalidArgument naming the matrix when rank > min(m, n) ("galore.rank ... is above the smaller
  // side of <name>") and for rank < 1, update_proj_gap < 1 or a scale that is not finite and > 0.
  static absl::StatusOr<std::unique_ptr<GaloreAdamW>> Create(std::vector<at::Tensor> params,
                                                             std::vector<std::string> names,
                                                             const GaloreSettings& settings,
                                                             const GaloreAdamSettings& adam);

  // One optimizer step at learning rate `lr` from every parameter's .grad() ((m, n), any
  // floating dtype; a parameter without a gradient is skipped, as torch optimizers do). Returns
  // false and changes nothing when a gradient is not finite. With max_grad_norm > 0 the gradients
  // are first scaled by min(1, max / (|g| + 1e-6)) over all of them (torch's clip_grad_norm_, as
  // the HF Trainer does before optimizer.step()); *grad_norm gets |g| before clipping. Recomputes
  // the projectors at steps t with (t - 1) % update_proj_gap == 0.
  bool Step(double lr, double* grad_norm = nullptr);

  // Optimizer steps taken (galore-torch's state["step"]).
  int64_t step() const { return step_; }
  const GaloreSettings& settings() const { return settings_; }
  GaloreSide side(size_t i) const { return sides_[i]; }
  // Projector (fp32, right (rank, n) or left (m, rank)); undefined before the first step.
  const at::Tensor& projector(size_t i) const { return proj_[i]; }
  // Bytes of the optimizer state: both moments (rank x max(m, n) fp32 each) and the projector
  // (rank x min(m, n) fp32) of every matrix.
  int64_t StateBytes() const;

  // Checkpoint: appends per matrix `<name>.galore_projector` (ProjectorShape), `.galore_exp_avg`,
  // `.galore_exp_avg_sq` (MomentShape) (fp32, CPU copies) to `tensors` and {"galore_step"} to
  // `metadata`. Nothing is appended for a matrix before the first step.
  void AppendState(std::vector<std::pair<std::string, at::Tensor>>* tensors,
                   std::map<std::string, std::string>* metadata) const;
  // Checks a state read back (`tensors` in AppendState's names, any device; an empty map =
  // before the first step) without installing it. Errors: kDataLoss naming the tensor when
  // one is missing (step > 0), not F32 of the expected shape, not finite, or an exp_avg_sq
  // has negative entries; a matrix with only some of its three tensors; `step` < 0.
  absl::Status CheckState(const std::map<std::string, at::Tensor>& tensors, int64_t step) const;
  // CheckState, then installs the state (copies on the parameters' device). Nothing changes
  // on an error.
  absl::Status LoadState(const std::map<std::string, at::Tensor>& tensors, int64_t step);

  // Shapes of matrix i's projector (right (rank, n), left (m, rank)) and of its moments (R's:
  // right (m, rank), left (rank, n)).
  std::vector<int64_t> ProjectorShape(size_t i) const;
  std::vector<int64_t> MomentShape(size_t i) const;
  const std::string& name(size_t i) const { return names_[i]; }
  size_t size() const { return params_.size(); }

 private:
  GaloreAdamW() = default;

  std::vector<at::Tensor> params_;  // (m, n) each, any floating dtype
  std::vector<std::string> names_;
  std::vector<GaloreSide> sides_;
  GaloreSettings settings_;
  GaloreAdamSettings adam_;
  // fp32, on the params' device: proj_ ProjectorShape(i), the moments MomentShape(i); undefined
  // before the first step.
  std::vector<at::Tensor> proj_, exp_avg_, exp_avg_sq_;
  int64_t step_ = 0;
};

}  // namespace lspo::baselines

#endif  // LSPO_BASELINES_GALORE_H_
