// The zero update rule (arena layout mode MODE_ZERO; the optimizer's half of
// gpu_worker/zero_path.cc): the ZeRO-Offload-style baseline (Ren et al. 2021, Sec. 4). Per
// trained matrix W (m, n): the fp32 master weight and full Adam moments m, v ((m, n) fp32
// each) and a step counter. A step reads the bf16 gradient G (m, n) from the full_grad slot
// and runs AdamW on the master (lsp/adam.h FusedAdamStep: weight decay included, the clip
// coefficient folded in) in one pass that also writes the bf16 parameters into the param slot.
// Before the worker's verdict (overlap schedule; issue 43) each matrix's state before the step
// goes to an undo pool of at most kZeroUndoBudgetBytes (the same pass writes it); past that
// the rule waits for the verdict. Internal to cpu_optimizer_service/.
// Shapes: m out features, n in features of W; the slots as in offload/arena_layout.h.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cpu_optimizer_service/optimizer_job.h"
#include "cpu_optimizer_service/update_rule.h"
#include "lsp/adam.h"
#include "runtime/status_macros.h"

namespace lspo::optimizer {

namespace {

// The most host memory a zero-mode job keeps for undo records of the matrices it updates
// before the worker's verdict on the step (overlap schedule; issue 43): 12 bytes per parameter
// (fp32 master, m, v). Past it the optimizer waits for the verdict. See docs/operations.md.
constexpr int64_t kZeroUndoBudgetBytes = int64_t{1} << 30;

// The zero rule (see the file comment).
class ZeroRule final : public UpdateRule {
 public:
  const char* name() const override { return "zero"; }

  absl::StatusOr<int64_t> AddMatrix(const lspo::v1::LinearSlot& slot, at::Tensor w0) override {
    Matrix st;
    st.master = std::move(w0);  // (m, n) fp32
    const int64_t n = st.master.numel();
    st.m.assign(n, 0.0f);
    st.v.assign(n, 0.0f);
    matrices_.push_back(std::move(st));
    return 4 * (n + 2 * n);  // fp32 master, m, v (m n each)
  }

  std::string Describe(const lspo::v1::ArenaLayout& layout) const override {
    return "full Adam (zero mode)";
  }

  absl::StatusOr<MatrixGradient> Gradient(const OptimizerJob& job, int i) const override {
    const auto& slot = job.layout.linears(i);
    MatrixGradient g;
    g.n = slot.m() * slot.n();  // G (m, n)
    ASSIGN_OR_RETURN(g.bf16, job.arena.At<uint16_t>(slot.full_grad().offset(), g.n));
    return g;
  }

  // Every gradient is in: the verdict follows at once (the worker's loss check), and waiting
  // for it costs less than undo records of the whole state.
  bool AwaitVerdictBeforeUpdates() const override { return true; }

  absl::Status UpdateMatrix(OptimizerJob* job, int i, const MatrixGradient& g,
                            const StepInputs& in) override;

  void RollBack() override {
    for (const Undo& z : undo_) {
      Matrix& st = matrices_[z.index];
      lsp::RestoreAdamState(pool_.data() + z.offset, st.master.data_ptr<float>(), st.m.data(),
                            st.v.data(), static_cast<int64_t>(st.m.size()));
      st.step = z.step;
    }
    undo_.clear();
  }

  void EndStep() override {
    undo_.clear();
    pool_used_ = 0;
  }

  void WriteMasterWeight(int i, at::Tensor out) const override { out.copy_(matrices_[i].master); }

  absl::Status CheckLayerExport() const override {
    return absl::FailedPreconditionError("ExportLayerWeights needs MODE_LSP");
  }

  // Per matrix NAME: NAME.master, .adam_m, .adam_v (m, n) fp32 and .adam_step () int64.
  void AppendState(const lspo::v1::ArenaLayout& layout, offload::NamedTensors* tensors) override {
    for (int i = 0; i < layout.linears_size(); ++i) {
      const std::string& name = layout.linears(i).name();
      Matrix& st = matrices_[i];
      const auto shape = st.master.sizes();
      tensors->emplace_back(name + ".master", st.master);
      tensors->emplace_back(name + ".adam_m", at::from_blob(st.m.data(), shape, at::kFloat));
      tensors->emplace_back(name + ".adam_v", at::from_blob(st.v.data(), shape, at::kFloat));
      tensors->emplace_back(name + ".adam_step", at::scalar_tensor(st.step, at::kLong));
    }
  }

  absl::StatusOr<Commit> ReadState(const lspo::v1::ArenaLayout& layout,
                                   const model::SafetensorsFile& file,
                                   const std::string& what) override {
    // Views into the mapped file: everything is validated before anything is copied.
    auto loaded = std::make_shared<std::vector<SavedAdamState>>(matrices_.size());
    for (int i = 0; i < layout.linears_size(); ++i) {
      const auto& slot = layout.linears(i);
      ASSIGN_OR_RETURN((*loaded)[i], ReadSavedAdamState(file, what, slot, {slot.m(), slot.n()}));
    }
    return Commit([this, loaded]() -> absl::Status {
      for (size_t i = 0; i < loaded->size(); ++i) {
        Matrix& st = matrices_[i];
        const SavedAdamState& l = (*loaded)[i];
        st.master.copy_(l.master);  // In place: no second copy of the state (known failure #15).
        std::memcpy(st.m.data(), l.m.data_ptr<float>(), st.m.size() * sizeof(float));
        std::memcpy(st.v.data(), l.v.data_ptr<float>(), st.v.size() * sizeof(float));
        st.step = l.step;
      }
      return absl::OkStatus();
    });
  }

 private:
  // One trained matrix's state (see the file comment).
  struct Matrix {
    at::Tensor master;        // (m, n) fp32
    std::vector<float> m, v;  // (m, n) fp32 Adam moments
    int64_t step = 0;
  };
  // Where one matrix's state before the step in progress sits in pool_ (master, m, v back to
  // back, n floats each).
  struct Undo {
    int index;
    int64_t step;
    int64_t offset;  // in floats
  };

  std::vector<Matrix> matrices_;
  // Overlap schedule: the undo records' storage (allocated at the first such Update:
  // min(kZeroUndoBudgetBytes, 12 bytes x the trained parameters)), kept for the job.
  std::vector<float> pool_;
  int64_t pool_used_ = 0;  // Floats of pool_ the step in progress used.
  std::vector<Undo> undo_;
};

absl::Status ZeroRule::UpdateMatrix(OptimizerJob* job, int i, const MatrixGradient& g,
                                    const StepInputs& in) {
  const auto& slot = job->layout.linears(i);
  Matrix& st = matrices_[i];
  const int64_t n = g.n;
  float* undo_record = nullptr;
  if (!in.verdict->Peek()) {
    // Before the verdict: keep the matrix's state to undo it, or, the pool full, wait.
    if (pool_.empty()) {
      int64_t total = 0;
      for (const Matrix& l : matrices_) total += 3 * static_cast<int64_t>(l.m.size());
      pool_.resize(
          std::min<int64_t>(total, kZeroUndoBudgetBytes / static_cast<int64_t>(sizeof(float))));
    }
    if (pool_used_ + 3 * n <= static_cast<int64_t>(pool_.size())) {
      undo_record = pool_.data() + pool_used_;  // written by the step below
    } else {
      RETURN_IF_ERROR(in.verdict->Await());
    }
  }
  // Full AdamW on the fp32 master weight, clip folded in, bf16 parameter out: one fused pass
  // over memory (lsp/adam.h FusedAdamStep).
  ASSIGN_OR_RETURN(uint16_t * out, job->arena.At<uint16_t>(slot.param().offset(), n));
  if (undo_record != nullptr) {  // recorded only once the step that writes it runs
    undo_.push_back({i, st.step, pool_used_});
    pool_used_ += 3 * n;
  }
  ++st.step;
  lsp::AdamOperands ops;
  ops.grad_bf16 = g.bf16;
  ops.grad_scale = in.clip;
  ops.m = st.m.data();
  ops.v = st.v.data();
  ops.out = st.master.data_ptr<float>();
  ops.accumulate = true;
  ops.out_bf16 = out;
  ops.undo = undo_record;
  ops.n = n;
  lsp::FusedAdamStep(in.hyper, st.step, ops);
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<UpdateRule> MakeZeroRule() { return std::make_unique<ZeroRule>(); }

}  // namespace lspo::optimizer
