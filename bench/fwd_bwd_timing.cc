// Forward + backward timing of the real SmolLM2-135M in the three ways a linear can train:
// "lsp" (the LSP LinearImpl: S with d = min(m, n) / 2, r = 8), "dense" (all 210 weight
// gradients formed) and "frozen" (only the embedding trains, so the backward runs through
// every layer without weight gradients). Prints ratios to the frozen pass measured in this run
// (absolute times are not comparable across machines). With --packed_segments=N > 1 the lsp
// pass is also timed with every row packed as N sequences (model/llama.h RowLayout: positions
// restarting, attention within a segment), the ratio to the plain lsp pass printed: the cost
// of the packed layout itself at equal tokens (data.packing). Run from the repository root:
//   build/bench/fwd_bwd_timing [--batch=8] [--seq_len=80] [--threads=2] [--reps=2]
//                              [--packed_segments=0]
#include <ATen/CPUGeneratorImpl.h>
#include "third_party/torch/torch_api.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "lsp/lsp_linear.h"
#include "lsp/projector.h"
#include "model/gguf.h"
#include "model/llama.h"

ABSL_FLAG(std::string, model, "models/SmolLM2-135M-Instruct.Q4_1.gguf", "GGUF model file");
ABSL_FLAG(int64_t, batch, 8, "micro-batch rows B");
ABSL_FLAG(int64_t, seq_len, 80, "tokens per row T");
ABSL_FLAG(int, threads, 2, "intra-op threads");
ABSL_FLAG(int, reps, 2, "timed repetitions per mode (the best is reported)");
ABSL_FLAG(int64_t, packed_segments, 0, "> 1: also time lsp with rows packed as this many "
                                       "sequences each");

namespace {

using lspo::model::LinearMode;

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto gguf = lspo::model::GgufFile::Open(absl::GetFlag(FLAGS_model));
  if (!gguf.ok()) {
    std::fprintf(stderr, "%s (run scripts/setup to fetch the model)\n",
                 gguf.status().ToString().c_str());
    return 1;
  }
  auto model = lspo::model::LlamaModel::FromGguf(*gguf);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  auto lsp_linears = std::make_shared<lspo::lsp::LspLinears>(*model);
  model->SetLinearImpl(lsp_linears);
  for (int64_t i = 0; i < model->num_linears(); ++i) {
    const at::Tensor& w = model->LinearWeight(i);  // (m, n)
    const int64_t d = std::min(w.size(0), w.size(1)) / 2;
    auto p = lspo::lsp::SparseProjector::Random(w.size(0), d, 8, 1000 + 2 * i);
    auto q = lspo::lsp::SparseProjector::Random(w.size(1), d, 8, 1001 + 2 * i);
    if (!p.ok() || !q.ok() || !lsp_linears->SetProjectors(i, *p, *q).ok()) return 1;
  }
  int64_t calls = 0;
  lsp_linears->SetSink([&calls](int64_t, const at::Tensor&) { ++calls; });
  const int64_t B = absl::GetFlag(FLAGS_batch), T = absl::GetFlag(FLAGS_seq_len);
  at::set_num_threads(absl::GetFlag(FLAGS_threads));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  at::Tensor ids = at::randint(3, model->config().vocab_size, {B, T}, gen,
                               at::TensorOptions().dtype(at::kLong));  // (B, T) int64
  at::Tensor labels = ids.clone();
  labels.narrow(1, 0, T / 4).fill_(-100);  // a masked prompt
  at::Tensor embed = *model->GetTensor("model.embed_tokens.weight");
  // Packed layout: N equal segments per row (the last takes the remainder).
  const int64_t n_seg = std::max<int64_t>(1, absl::GetFlag(FLAGS_packed_segments));
  lspo::model::RowLayout packed;
  at::Tensor packed_labels = labels.clone();
  if (n_seg > 1) {
    const int64_t len = std::max<int64_t>(1, T / n_seg);
    at::Tensor t = at::arange(T, at::TensorOptions().dtype(at::kLong));
    at::Tensor seg = at::clamp_max(t.div(len, "floor"), n_seg - 1);  // (T)
    packed.segment_ids = seg.unsqueeze(0).expand({B, T}).contiguous();
    packed.positions = (t - seg * len).unsqueeze(0).expand({B, T}).contiguous();
    packed_labels.masked_fill_(packed.positions.eq(0), -100);  // no target across a boundary
  }
  std::map<std::string, double> best;
  for (const char* mode : {"frozen", "lsp", "dense", "lsp-packed"}) {
    const std::string m = mode;
    if (m == "lsp-packed" && n_seg < 2) continue;
    model->SetLinearMode(m == "lsp" || m == "lsp-packed" ? LinearMode::kCustom
                         : m == "dense"                  ? LinearMode::kDense
                                                         : LinearMode::kFrozen);
    embed.requires_grad_(m == "frozen");
    best[m] = 1e30;
    for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
      calls = 0;
      auto t0 = std::chrono::steady_clock::now();
      at::Tensor loss = m == "lsp-packed" ? model->CausalLmLoss(ids, packed_labels, packed)
                                          : model->CausalLmLoss(ids, labels);
      auto t1 = std::chrono::steady_clock::now();
      loss.backward();
      auto t2 = std::chrono::steady_clock::now();
      std::printf("B=%lld T=%lld %-10s rep %d: forward %.2f s, backward %.2f s (loss %.4f, "
                  "S delivered %lld)\n",
                  static_cast<long long>(B), static_cast<long long>(T), mode, rep,
                  Seconds(t0, t1), Seconds(t1, t2), loss.item<double>(),
                  static_cast<long long>(calls));
      best[m] = std::min(best[m], Seconds(t0, t2));
      model->ZeroLinearGrads();
      embed.mutable_grad() = at::Tensor();
    }
  }
  std::printf("forward+backward relative to frozen (same run): lsp %.2fx, dense %.2fx\n",
              best["lsp"] / best["frozen"], best["dense"] / best["frozen"]);
  if (n_seg > 1) {
    std::printf("packed layout (%lld sequences per row) relative to one per row, lsp: %.2fx\n",
                static_cast<long long>(n_seg), best["lsp-packed"] / best["lsp"]);
  }
  return 0;
}
