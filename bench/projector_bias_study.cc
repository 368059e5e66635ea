// projector_bias_study: relative estimation bias of learned vs random (d, r)-sparse projectors
// on HELD-OUT gradients of a real model (SmolLM2-135M-Instruct, SMS spam), docs/method.md "Learning
// the projectors" and "Math" (bias b = P P^T G Q Q^T - G, quality |b|_F / |G|_F).
//
// What it does:
//   1. Loads the GGUF model + tokenizer and the labelled training data; draws two disjoint
//      subsets with data::ShuffledOrder(#rows, --seed, epoch 0): the first --cal_examples rows
//      are the CALIBRATION set, the next --heldout_examples rows the HELD-OUT set.
//   2. With the sampled layers' linears in kDense (all others kFrozen), computes per sampled
//      linear the dense gradient of the mean answer-token loss over each subset:
//      G_cal, G_ho (m, n) fp32.
//   3. For each d in --d, r in --r and sampled linear: the subspace of lsp/subspace.h under
//      --narrow; draws P (m, d_p), Q (n, d_q) with SparseProjector::ForSide (seeds from
//      --projector_seed and the linear/d/r), and measures RelativeBias on G_cal and G_ho for
//        random   : the raw draw (values N(0, 1/r));
//        rescaled : the draw after FitProjectors' closed-form common rescale on G_cal only
//                   (max_iters = 0) -- the cheapest "fitted" baseline;
//        learned  : after FitProjectors on G_cal (--fit_iters Adam steps, lr --fit_lr,
//                   float64 = false, rescale = true, alpha = 0, beta = 0).
//      With --narrow=none (default) shapes with d >= min(m, n) (e.g. k/v_proj 192 x 576 with
//      d = 256) are recorded as "n/a" with the reason.
//   4. The learning-rate meaning of each projector pair (BiasRow::descent_*, step_*): the first
//      subspace Adam step's first-order loss decrease and Frobenius size per unit lr on G_ho,
//      relative to full Adam's first step.
//   5. Prints a markdown summary, writes every row as JSON (--json_out) and the markdown
//      (--md_out).
//
// Dimension legend: m out / n in features of a weight W (m, n) (HF layout, y = x W^T),
// d subspace dimension, r non-zeros per projector row, B batch rows, T sequence length.
//
// Run from the repository root (paths are relative to it), e.g.
//   OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 nice -n 15 build/bench/projector_bias_study
//       --json_out=/tmp/bias.json --md_out=/tmp/bias.md   (one command line)
// Single-threaded by default (--threads): intra-op ATen threads and TBB (GGUF dequant) are
// limited to --threads.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "third_party/torch/torch_api.h"

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "data/datasets.h"
#include "glog/logging.h"
#include "lsp/fit.h"
#include "lsp/projector.h"
#include "lsp/subspace.h"
#include "model/gguf.h"
#include "model/llama.h"
#include "nlohmann/json.hpp"
#include "runtime/status_macros.h"
#include "tbb/global_control.h"
#include "text/tokenizer.h"

ABSL_FLAG(std::string, model, "models/SmolLM2-135M-Instruct.Q4_1.gguf",
          "GGUF checkpoint (model + tokenizer), relative to the repository root");
ABSL_FLAG(std::string, data, "datasets/sms-spam/train.tsv",
          "labelled training data (label<TAB>text .tsv, or .jsonl/.json)");
ABSL_FLAG(std::string, question, "Is this message spam or ham?",
          "question put before each message (examples/smollm2-sms-spam.yaml)");
ABSL_FLAG(std::string, system_prompt, "You classify SMS messages.",
          "system prompt of each chat (examples/smollm2-sms-spam.yaml)");
ABSL_FLAG(int32_t, seq_len, 128, "maximum tokens per example (text is cut to fit)");
ABSL_FLAG(int32_t, cal_examples, 32, "calibration subset size (G_cal)");
ABSL_FLAG(int32_t, heldout_examples, 32, "held-out subset size (G_ho), disjoint from G_cal's");
ABSL_FLAG(int32_t, micro_batch, 8, "examples per forward/backward when computing gradients");
ABSL_FLAG(uint64_t, seed, 42, "seed of the subset shuffle (data::ShuffledOrder, epoch 0)");
ABSL_FLAG(uint64_t, projector_seed, 1234, "base seed of the random projectors");
ABSL_FLAG(std::vector<std::string>, layers, std::vector<std::string>({"0", "10", "20", "29"}),
          "decoder layers whose 7 linears are measured (comma separated)");
ABSL_FLAG(std::vector<std::string>, modules,
          std::vector<std::string>({"q", "k", "v", "o", "gate", "up", "down"}),
          "module types measured (subset of q,k,v,o,gate,up,down)");
ABSL_FLAG(std::vector<std::string>, d, std::vector<std::string>({"64", "128", "256"}),
          "subspace dimensions d (comma separated)");
ABSL_FLAG(std::vector<std::string>, r, std::vector<std::string>({"2", "4", "8", "16"}),
          "non-zeros per projector row r (comma separated)");
ABSL_FLAG(std::string, narrow, "none",
          "matrices with a side <= d: none (left out, n/a), one-sided, half or full "
          "(lsp.narrow, lsp/subspace.h)");
ABSL_FLAG(int32_t, fit_iters, 40, "Adam iterations of FitProjectors (FitOptions::max_iters)");
ABSL_FLAG(double, fit_lr, 0.05, "Adam learning rate of FitProjectors (FitOptions::lr)");
ABSL_FLAG(int32_t, fit_patience, 3,
          "FitOptions::patience: halve the fit lr after this many iterates without a new best "
          "(0: a fixed lr, as before 2026-12-03)");
ABSL_FLAG(int32_t, threads, 1, "intra-op threads (ATen and TBB)");
ABSL_FLAG(std::string, json_out, "", "write every row as JSON here (empty: skip)");
ABSL_FLAG(std::string, md_out, "", "write the markdown report here (empty: skip)");

namespace lspo::bench {
namespace {

using model::LinearKind;

// The module types of a decoder layer, in LinearKind order.
struct ModuleInfo {
  LinearKind kind;
  const char* short_name;  // flag spelling
};
constexpr ModuleInfo kModules[] = {
    {LinearKind::kQ, "q"},       {LinearKind::kK, "k"},  {LinearKind::kV, "v"},
    {LinearKind::kO, "o"},       {LinearKind::kGate, "gate"},
    {LinearKind::kUp, "up"},     {LinearKind::kDown, "down"},
};

// Wall-clock seconds elapsed since t0.
double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Study settings (the flags, validated by ParseStudyOptions).
struct StudyOptions {
  std::string model_path;
  std::string data_path;
  std::string question;
  std::string system_prompt;
  int seq_len = 128;
  int64_t cal_examples = 32;
  int64_t heldout_examples = 32;
  int64_t micro_batch = 8;
  uint64_t seed = 42;
  uint64_t projector_seed = 1234;
  std::vector<int64_t> layers;       // decoder layer indices
  std::vector<LinearKind> modules;   // module types
  std::vector<int64_t> ds;           // subspace dimensions
  std::vector<int64_t> rs;           // non-zeros per row
  lsp::FitOptions fit;
};

// One (linear, d, r) measurement. Bias values are RelativeBias (fp64) on the named gradient;
// NaN when `ok` is false.
struct BiasRow {
  int64_t layer = 0;
  std::string module;   // "q" ... "down"
  std::string name;     // HF name of the weight
  int64_t m = 0, n = 0, d = 0, r = 0;
  bool ok = false;      // false: shape not allowed (n/a) or the fit failed; see `note`
  std::string note;
  double random_cal = NAN, random_ho = NAN;      // raw random draw
  double rescaled_cal = NAN, rescaled_ho = NAN;  // random + closed-form rescale on G_cal
  double learned_cal = NAN, learned_ho = NAN;    // after FitProjectors on G_cal
  // Dense references (no sparsity): svd_floor_ho = the best any rank-d pair can do on G_ho,
  // sqrt(sum_{i > d} s_i^2) / |G_ho|_F (Eckart-Young; P P^T G Q Q^T has rank <= d);
  // svd_cal_ho = the bias on G_ho of the orthonormal top-d singular subspaces of G_cal
  // (P = U_d, Q = V_d), i.e. dense projectors fitted exactly on G_cal.
  double svd_floor_ho = NAN, svd_cal_ho = NAN;
  // The learning-rate meaning (issue 16): the first subspace Adam step is D = -lr sign(S) with
  // S = P^T G Q (bias-corrected m / sqrt(v) = g / |g| at t = 1), applied as P D Q^T; full Adam's
  // first step is -lr sign(G). On G_ho, per unit lr and relative to full Adam:
  //   descent = <P sign(S) Q^T, G> / <sign(G), G> = |S|_1 / |G|_1 (first-order loss decrease),
  //   step    = |P sign(S) Q^T|_F / |sign(G)|_F = |P sign(S) Q^T|_F / sqrt(m n) (update size).
  // For random, rescaled and learned projectors, and svd-cal (U_d, V_d of G_cal, orthonormal).
  double descent_random = NAN, descent_rescaled = NAN, descent_learned = NAN, descent_svd = NAN;
  double step_random = NAN, step_rescaled = NAN, step_learned = NAN, step_svd = NAN;
  int iterations = 0;                            // Adam steps taken by the fit
  int lr_halvings = 0;                           // FitResult::lr_halvings of the fit
  double fit_seconds = 0;                        // wall time of the learned fit
};

// Per-linear gradient statistics (context for reading the biases).
struct GradStats {
  int64_t layer = 0;
  std::string module;
  double cal_norm = 0, ho_norm = 0;  // |G|_F
  double cosine = 0;                 // <G_cal, G_ho> / (|G_cal| |G_ho|)
  double ho_top1 = 0;                // s_1^2 / |G_ho|_F^2: energy in G_ho's top direction
};

// Mean of the rows of one (d, r, module) cell, over the sampled layers with ok == true.
struct BiasSummary {
  int64_t d = 0, r = 0;
  std::string module;
  int64_t count = 0;      // rows averaged (0: every row n/a)
  std::string note;       // reason when count == 0
  double random_ho = NAN, rescaled_ho = NAN, learned_ho = NAN, learned_cal = NAN;
  double svd_floor_ho = NAN, svd_cal_ho = NAN;
  double descent_random = NAN, descent_rescaled = NAN, descent_learned = NAN, descent_svd = NAN;
  double step_random = NAN, step_rescaled = NAN, step_learned = NAN, step_svd = NAN;
  int64_t learned_not_below_random = 0;    // rows with learned_ho >= random_ho
  int64_t learned_not_below_rescaled = 0;  // rows with learned_ho >= rescaled_ho
};

// Parses a list of integers (flag values); kInvalidArgument naming the flag on a bad entry or
// an empty list.
absl::StatusOr<std::vector<int64_t>> ParseIntList(const std::vector<std::string>& items,
                                                  absl::string_view flag) {
  std::vector<int64_t> out;
  for (const std::string& s : items) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(s, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": '", s, "' is not an integer; expected e.g. 64,128"));
    }
    out.push_back(v);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " is empty"));
  }
  return out;
}

// Builds StudyOptions from the flags. kInvalidArgument for non-positive sizes, unknown module
// names or non-positive d/r (per-shape subspaces are resolved later, lsp/subspace.h).
absl::StatusOr<StudyOptions> ParseStudyOptions() {
  StudyOptions o;
  o.model_path = absl::GetFlag(FLAGS_model);
  o.data_path = absl::GetFlag(FLAGS_data);
  o.question = absl::GetFlag(FLAGS_question);
  o.system_prompt = absl::GetFlag(FLAGS_system_prompt);
  o.seq_len = absl::GetFlag(FLAGS_seq_len);
  o.cal_examples = absl::GetFlag(FLAGS_cal_examples);
  o.heldout_examples = absl::GetFlag(FLAGS_heldout_examples);
  o.micro_batch = absl::GetFlag(FLAGS_micro_batch);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.projector_seed = absl::GetFlag(FLAGS_projector_seed);
  if (o.seq_len < 1 || o.cal_examples < 1 || o.heldout_examples < 1 || o.micro_batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--seq_len, --cal_examples, --heldout_examples and --micro_batch must be >= 1; got ",
        o.seq_len, ", ", o.cal_examples, ", ", o.heldout_examples, ", ", o.micro_batch));
  }
  ASSIGN_OR_RETURN(o.layers, ParseIntList(absl::GetFlag(FLAGS_layers), "layers"));
  ASSIGN_OR_RETURN(o.ds, ParseIntList(absl::GetFlag(FLAGS_d), "d"));
  ASSIGN_OR_RETURN(o.rs, ParseIntList(absl::GetFlag(FLAGS_r), "r"));
  for (int64_t v : o.ds) {
    if (v < 1) return absl::InvalidArgumentError(absl::StrCat("--d: ", v, " must be >= 1"));
  }
  for (int64_t v : o.rs) {
    if (v < 1) return absl::InvalidArgumentError(absl::StrCat("--r: ", v, " must be >= 1"));
  }
  for (const std::string& name : absl::GetFlag(FLAGS_modules)) {
    bool found = false;
    for (const ModuleInfo& mi : kModules) {
      if (name == mi.short_name) {
        o.modules.push_back(mi.kind);
        found = true;
      }
    }
    if (!found) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--modules: unknown module '", name, "'; expected a subset of q,k,v,o,gate,up,down"));
    }
  }
  if (o.modules.empty()) return absl::InvalidArgumentError("--modules is empty");
  o.fit.max_iters = absl::GetFlag(FLAGS_fit_iters);
  o.fit.lr = absl::GetFlag(FLAGS_fit_lr);
  o.fit.patience = absl::GetFlag(FLAGS_fit_patience);
  o.fit.beta = 0.0;
  o.fit.alpha = 0.0;
  o.fit.float64 = false;
  o.fit.rescale = true;
  return o;
}

// Short flag name of a module type ("q" ... "down").
std::string ModuleName(LinearKind kind) {
  return kModules[static_cast<int64_t>(kind)].short_name;
}

// Opens the GGUF file at `path` and builds the model and the tokenizer from it.
// kNotFound when the file is missing (the message names the path and says to run
// scripts/setup); other errors of GgufFile::Open / FromGguf prefixed with the path.
absl::StatusOr<std::pair<model::LlamaModel, model::BpeTokenizer>> LoadModelAndTokenizer(
    const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "model file '", path, "' not found: run scripts/setup from the repository root to "
        "fetch SmolLM2-135M-Instruct (or pass --model=<path to a GGUF file>)"));
  }
  auto file = model::GgufFile::Open(path);
  if (!file.ok()) {
    return absl::Status(file.status().code(),
                        absl::StrCat("model file '", path, "': ", file.status().message()));
  }
  auto tok = model::BpeTokenizer::FromGguf(*file);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        absl::StrCat("tokenizer in '", path, "': ", tok.status().message()));
  }
  auto llama = model::LlamaModel::FromGguf(*file);
  if (!llama.ok()) {
    return absl::Status(llama.status().code(),
                        absl::StrCat("model file '", path, "': ", llama.status().message()));
  }
  return std::make_pair(std::move(*llama), std::move(*tok));
}

// The calibration and held-out examples: rows order[0, cal) and order[cal, cal + ho) of the
// data file, order = data::ShuffledOrder(#rows, seed, 0), built with BuildClassificationChat.
// Also counts the labels of each subset into `*label_counts` ("cal:<label>" / "ho:<label>").
// kInvalidArgument when the file has fewer than cal + ho rows; loader errors otherwise.
absl::Status LoadSubsets(const StudyOptions& o, const model::BpeTokenizer& tok,
                         std::vector<data::TokenizedExample>* cal,
                         std::vector<data::TokenizedExample>* ho,
                         std::map<std::string, int64_t>* label_counts) {
  auto rows = data::LoadLabeled(o.data_path);
  if (!rows.ok()) {
    return absl::Status(rows.status().code(),
                        absl::StrCat(rows.status().message(),
                                     " (the data sets live in datasets/ of the repository; run "
                                     "from the repository root or pass --data)"));
  }
  const int64_t need = o.cal_examples + o.heldout_examples;
  if (static_cast<int64_t>(rows->size()) < need) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data '", o.data_path, "' has ", rows->size(), " rows; --cal_examples + "
        "--heldout_examples = ", need, " needs at least that many"));
  }
  const std::vector<int64_t> order = data::ShuffledOrder(rows->size(), o.seed, 0);
  ASSIGN_OR_RETURN(model::ChatTemplate tmpl, model::ChatTemplate::ForTokenizer(tok));
  for (int64_t k = 0; k < need; ++k) {
    const data::LabeledText& row = (*rows)[order[k]];
    ASSIGN_OR_RETURN(data::TokenizedExample ex,
                     data::BuildClassificationChat(tok, tmpl, row.text, row.label, o.question,
                                                   o.system_prompt, o.seq_len));
    const bool is_cal = k < o.cal_examples;
    (is_cal ? cal : ho)->push_back(std::move(ex));
    ++(*label_counts)[absl::StrCat(is_cal ? "cal:" : "ho:", row.label)];
  }
  return absl::OkStatus();
}

// Dense gradient of the mean answer-token loss over `examples` (every loss token weighted
// equally, as in the worker's calibration) for each linear index in `linears`.
// The model's modes are the caller's: `linears` must be kDense (others may be kFrozen).
// Micro-batches of `micro_batch` rows, right-padded with `pad_id`.
// Returns one (m, n) fp32 tensor per entry of `linears` (W.grad() clones; W.grad() is reset
// afterwards). kInvalidArgument when no example has a loss token or a batch is invalid;
// kInternal on a LibTorch error.
absl::StatusOr<std::vector<at::Tensor>> MeanDenseGradients(
    model::LlamaModel& llama, absl::Span<const data::TokenizedExample> examples,
    absl::Span<const int64_t> linears, int64_t micro_batch, int32_t pad_id) {
  std::vector<data::Batch> batches;
  int64_t total = 0;
  for (size_t s = 0; s < examples.size(); s += static_cast<size_t>(micro_batch)) {
    std::vector<const data::TokenizedExample*> rows;
    for (size_t k = s; k < std::min(examples.size(), s + static_cast<size_t>(micro_batch)); ++k) {
      rows.push_back(&examples[k]);
    }
    batches.push_back(data::MakeBatch(rows, pad_id));
    total += batches.back().num_loss_tokens;
  }
  if (total == 0) {
    return absl::InvalidArgumentError("MeanDenseGradients: no example has an answer token");
  }
  try {
    llama.ZeroLinearGrads();
    for (const data::Batch& b : batches) {
      if (b.num_loss_tokens == 0) continue;
      const at::Tensor ids = at::from_blob(const_cast<int64_t*>(b.input_ids.data()),
                                           {b.batch_size, b.seq_len}, at::kLong)
                                 .clone();  // (B, T) int64
      const at::Tensor labels = at::from_blob(const_cast<int64_t*>(b.labels.data()),
                                              {b.batch_size, b.seq_len}, at::kLong)
                                    .clone();  // (B, T) int64
      RETURN_IF_ERROR(llama.ValidateBatch(ids, labels));
      const at::Tensor loss = llama.CausalLmLoss(ids, labels);  // () fp32, mean over targets
      (loss * (static_cast<double>(b.num_loss_tokens) / static_cast<double>(total))).backward();
    }
    std::vector<at::Tensor> grads;
    for (int64_t i : linears) {
      const at::Tensor& w = llama.LinearWeight(i);
      if (!w.grad().defined()) {
        return absl::InternalError(absl::StrCat("MeanDenseGradients: no gradient for ",
                                                llama.LinearName(i), " (is it kDense?)"));
      }
      grads.push_back(w.grad().detach().clone());  // (m, n) fp32
    }
    llama.ZeroLinearGrads();
    return grads;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("MeanDenseGradients: LibTorch error: ", e.what()));
  }
}

// Dense SVD references of one linear (see BiasRow::svd_floor_ho / svd_cal_ho).
struct SvdReference {
  at::Tensor cal_u;      // (m, k) fp64, left singular vectors of G_cal, k = min(m, n)
  at::Tensor cal_v;      // (n, k) fp64, right singular vectors of G_cal
  at::Tensor ho_energy;  // (k) fp64, cumulative s_i^2 / |G_ho|_F^2 of G_ho, non-decreasing
};

// The SVD references of g_cal, g_ho: (m, n) fp32, finite. kInternal on a LibTorch error.
absl::StatusOr<SvdReference> MakeSvdReference(const at::Tensor& g_cal, const at::Tensor& g_ho) {
  try {
    SvdReference ref;
    auto usv = at::linalg_svd(g_cal.to(at::kDouble), /*full_matrices=*/false);
    ref.cal_u = std::get<0>(usv);                        // (m, k)
    ref.cal_v = std::get<2>(usv).t().contiguous();       // (n, k)
    const at::Tensor e = at::linalg_svdvals(g_ho.to(at::kDouble)).pow(2);  // (k)
    ref.ho_energy = e.cumsum(0) / e.sum();                                 // (k)
    return ref;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("MakeSvdReference: LibTorch error: ", e.what()));
  }
}

// Fills row->svd_floor_ho and row->svd_cal_ho for row->d (1 <= d <= min(m, n)) from `ref`;
// g_ho: (m, n) fp32, non-zero.
void MeasureSvdReference(const SvdReference& ref, const at::Tensor& g_ho, BiasRow* row) {
  // A one-sided or half subspace (--narrow) has rank <= min(d, min(m, n)).
  const int64_t d = std::min(row->d, std::min(row->m, row->n));
  const double kept = ref.ho_energy[d - 1].item<double>();
  row->svd_floor_ho = std::sqrt(std::max(0.0, 1.0 - kept));
  const at::Tensor g = g_ho.to(at::kDouble);                   // (m, n)
  const at::Tensor u = ref.cal_u.narrow(1, 0, d);              // (m, d)
  const at::Tensor v = ref.cal_v.narrow(1, 0, d);              // (n, d)
  const at::Tensor s = u.t().mm(g).mm(v);                      // (d, d)
  const at::Tensor recon = u.mm(s).mm(v.t());                  // (m, n)
  row->svd_cal_ho = (recon - g).norm().item<double>() / g.norm().item<double>();
  row->descent_svd = s.abs().sum().item<double>() / g.abs().sum().item<double>();
  row->step_svd = u.mm(s.sign()).mm(v.t()).norm().item<double>() /
                  std::sqrt(static_cast<double>(row->m) * static_cast<double>(row->n));
}

// The first-step learning-rate meaning of projectors p, q on g (m, n) fp32, non-zero (see
// BiasRow::descent_*): {descent, step} per unit lr relative to full Adam, in float64.
std::pair<double, double> StepScale(const at::Tensor& g, const lsp::SparseProjector& p,
                                    const lsp::SparseProjector& q) {
  const at::Tensor g64 = g.to(at::kDouble);                 // (m, n)
  const at::Tensor s = lsp::CompressDense(g64, p, q);       // (d_p, d_q) fp64
  const at::Tensor step = lsp::ExpandStep(p, s.sign(), q);  // (m, n) fp64
  const double mn = static_cast<double>(g.size(0)) * static_cast<double>(g.size(1));
  return {s.abs().sum().item<double>() / g64.abs().sum().item<double>(),
          step.norm().item<double>() / std::sqrt(mn)};
}

// A deterministic seed for the projector pair of (linear index, d, r); Q uses seed + 1.
uint64_t ProjectorSeed(uint64_t base, int64_t linear_index, int64_t d, int64_t r) {
  return lsp::ProjectorSeed(base, linear_index, d) + static_cast<uint64_t>(r) * 31ull;
}

// Measures one (linear, d, r): random, rescaled-random and learned bias on g_cal and g_ho,
// both (m, n) fp32 finite and non-zero. `row` must carry layer/module/name/m/n/d/r; fills the
// rest. A shape left out by --narrow=none gives ok = false and note = the reason (OK
// status). Errors of Random/FitProjectors are returned.
absl::Status MeasureRow(const at::Tensor& g_cal, const at::Tensor& g_ho, uint64_t seed,
                        const lsp::FitOptions& fit, BiasRow* row) {
  // The matrix's subspace under --narrow (lsp/subspace.h); "none" keeps a matrix with a side
  // <= d out of the study (n/a), as the product did before lsp.narrow existed.
  const std::string narrow = absl::GetFlag(FLAGS_narrow);
  if (narrow == "none" && row->d >= std::min(row->m, row->n)) {
    row->ok = false;
    row->note = absl::StrCat("n/a: d >= min(m, n) = ", std::min(row->m, row->n));
    return absl::OkStatus();
  }
  const lsp::NarrowRule rule = narrow == "half"   ? lsp::NarrowRule::kHalf
                               : narrow == "full" ? lsp::NarrowRule::kFull
                                                  : lsp::NarrowRule::kOneSided;
  ASSIGN_OR_RETURN(const lsp::MatrixSubspace sub,
                   lsp::ResolveSubspace(row->m, row->n, row->d, 0.0, row->r, rule));
  if (sub.p.dim != row->d || sub.q.dim != row->d) row->note = sub.Describe();
  if (g_cal.abs().max().item<float>() == 0 || g_ho.abs().max().item<float>() == 0) {
    row->ok = false;
    row->note = "n/a: a gradient is all zero";
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(lsp::SparseProjector p,
                   lsp::SparseProjector::ForSide(row->m, sub.p.dim, sub.p.r, sub.p.identity, seed));
  ASSIGN_OR_RETURN(lsp::SparseProjector q, lsp::SparseProjector::ForSide(
                                               row->n, sub.q.dim, sub.q.r, sub.q.identity,
                                               seed + 1));
  row->random_cal = lsp::RelativeBias(g_cal, p, q);
  row->random_ho = lsp::RelativeBias(g_ho, p, q);
  std::tie(row->descent_random, row->step_random) = StepScale(g_ho, p, q);

  lsp::SparseProjector p_s = p, q_s = q;  // same positions, own values
  p_s.value = p.value.clone();
  q_s.value = q.value.clone();
  lsp::FitOptions rescale_only = fit;
  rescale_only.max_iters = 0;
  ASSIGN_OR_RETURN(lsp::FitResult rescaled, lsp::FitProjectors(g_cal, &p_s, &q_s, rescale_only));
  row->rescaled_cal = rescaled.final_error;
  row->rescaled_ho = lsp::RelativeBias(g_ho, p_s, q_s);
  std::tie(row->descent_rescaled, row->step_rescaled) = StepScale(g_ho, p_s, q_s);

  const auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(lsp::FitResult learned, lsp::FitProjectors(g_cal, &p, &q, fit));
  row->fit_seconds = Seconds(t0);
  row->iterations = learned.iterations;
  row->lr_halvings = learned.lr_halvings;
  row->learned_cal = learned.final_error;
  row->learned_ho = lsp::RelativeBias(g_ho, p, q);
  std::tie(row->descent_learned, row->step_learned) = StepScale(g_ho, p, q);
  row->ok = true;
  return absl::OkStatus();
}

// Averages `rows` per (d, r, module) over the rows with ok == true, in the order
// (d in ds, r in rs, module in modules). Cells without an ok row get count 0 and the first
// row's note.
std::vector<BiasSummary> Summarize(absl::Span<const BiasRow> rows, absl::Span<const int64_t> ds,
                                   absl::Span<const int64_t> rs,
                                   absl::Span<const LinearKind> modules) {
  std::vector<BiasSummary> out;
  for (int64_t d : ds) {
    for (int64_t r : rs) {
      for (LinearKind kind : modules) {
        BiasSummary s;
        s.d = d;
        s.r = r;
        s.module = ModuleName(kind);
        double rnd = 0, res = 0, lrn = 0, lcal = 0, floor = 0, svd_cal = 0;
        double scale[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // descent_*, step_* in BiasRow order
        for (const BiasRow& row : rows) {
          if (row.d != d || row.r != r || row.module != s.module) continue;
          if (!row.ok) {
            if (s.note.empty()) s.note = row.note;
            continue;
          }
          ++s.count;
          rnd += row.random_ho;
          res += row.rescaled_ho;
          lrn += row.learned_ho;
          lcal += row.learned_cal;
          floor += row.svd_floor_ho;
          svd_cal += row.svd_cal_ho;
          const double row_scale[8] = {
              row.descent_random, row.descent_rescaled, row.descent_learned, row.descent_svd,
              row.step_random,    row.step_rescaled,    row.step_learned,    row.step_svd};
          for (int i = 0; i < 8; ++i) scale[i] += row_scale[i];
          if (row.learned_ho >= row.random_ho) ++s.learned_not_below_random;
          if (row.learned_ho >= row.rescaled_ho) ++s.learned_not_below_rescaled;
        }
        if (s.count > 0) {
          const double c = static_cast<double>(s.count);
          s.random_ho = rnd / c;
          s.rescaled_ho = res / c;
          s.learned_ho = lrn / c;
          s.learned_cal = lcal / c;
          s.svd_floor_ho = floor / c;
          s.svd_cal_ho = svd_cal / c;
          double* out_scale[8] = {&s.descent_random, &s.descent_rescaled, &s.descent_learned,
                                  &s.descent_svd,    &s.step_random,      &s.step_rescaled,
                                  &s.step_learned,   &s.step_svd};
          for (int i = 0; i < 8; ++i) *out_scale[i] = scale[i] / c;
        }
        out.push_back(s);
      }
    }
  }
  return out;
}

// The markdown report: settings, the detailed table (one row per (d, r, module)), compact
// grids per (d, r) x module, a per-(d, r) mean over modules, and the gradient statistics.
std::string MarkdownReport(const StudyOptions& o, absl::Span<const BiasSummary> summary,
                           absl::Span<const GradStats> grads,
                           const std::map<std::string, int64_t>& label_counts,
                           double grad_seconds, double total_seconds) {
  std::string md;
  absl::StrAppend(&md, "# Projector relative bias: learned vs random (held-out gradients)\n\n");
  absl::StrAppend(&md, "- model `", o.model_path, "`, data `", o.data_path, "`, seq_len ",
                  o.seq_len, "\n");
  absl::StrAppend(&md, "- calibration ", o.cal_examples, " / held-out ", o.heldout_examples,
                  " examples (data::ShuffledOrder seed ", o.seed, ", epoch 0; labels:");
  for (const auto& [k, v] : label_counts) absl::StrAppend(&md, " ", k, "=", v);
  absl::StrAppend(&md, ")\n");
  absl::StrAppend(&md, "- layers ", absl::StrJoin(o.layers, ","), "; projector seed base ",
                  o.projector_seed, "; fit: ", o.fit.max_iters, " Adam iters, lr ", o.fit.lr,
                  " (patience ", o.fit.patience, ")",
                  ", fp32 objective, rescale, alpha 0, beta 0\n");
  absl::StrAppend(&md, absl::StrFormat("- wall time: gradients %.1f s, total %.1f s\n\n",
                                       grad_seconds, total_seconds));
  absl::StrAppend(
      &md,
      "Columns are means over the sampled layers of the relative bias "
      "norm(P P^T G Q Q^T - G) / norm(G) (lsp::RelativeBias). `(ho)` = on the held-out "
      "gradient G_ho, `(cal)` = on the calibration gradient G_cal. random = the raw "
      "SparseProjector::Random draw; rescaled = that draw after the closed-form common rescale "
      "fitted on G_cal (FitProjectors with 0 Adam steps); learned = after FitProjectors on "
      "G_cal; svd-cal = dense rank-d projectors from G_cal's top-d singular vectors; "
      "svd floor = the best any rank-d pair can reach on G_ho (Eckart-Young). "
      "#worse = layers where learned (ho) >= random (ho) / >= rescaled (ho).\n\n");
  absl::StrAppend(&md,
                  "| d | r | module | random (ho) | rescaled (ho) | learned (ho) | learned (cal) "
                  "| svd-cal (ho) | svd floor (ho) | learned/random | learned/rescaled "
                  "| #worse |\n"
                  "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const BiasSummary& s : summary) {
    if (s.count == 0) {
      absl::StrAppend(&md, "| ", s.d, " | ", s.r, " | ", s.module,
                      " | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | - |\n");
      continue;
    }
    absl::StrAppend(
        &md, absl::StrFormat("| %d | %d | %s | %.3f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f "
                             "| %.3f | %d, %d of %d |\n",
                             s.d, s.r, s.module, s.random_ho, s.rescaled_ho, s.learned_ho,
                             s.learned_cal, s.svd_cal_ho, s.svd_floor_ho,
                             s.learned_ho / s.random_ho, s.learned_ho / s.rescaled_ho,
                             s.learned_not_below_random, s.learned_not_below_rescaled, s.count));
  }
  // Compact grids per (d, r) x module.
  const size_t per_dr = o.modules.size();
  const char* titles[] = {"Learned bias on G_ho (mean over layers)",
                          "Learned / random on G_ho (ratio of the means)",
                          "Learned / rescaled-random on G_ho (ratio of the means)"};
  for (int grid = 0; grid < 3; ++grid) {
    absl::StrAppend(&md, "\n", titles[grid], ":\n\n| d, r |");
    for (LinearKind k : o.modules) absl::StrAppend(&md, " ", ModuleName(k), " |");
    absl::StrAppend(&md, "\n|---|");
    for (size_t i = 0; i < per_dr; ++i) absl::StrAppend(&md, "---:|");
    absl::StrAppend(&md, "\n");
    for (size_t i = 0; i < summary.size(); i += per_dr) {
      absl::StrAppend(&md, "| ", summary[i].d, ", ", summary[i].r, " |");
      for (size_t j = 0; j < per_dr; ++j) {
        const BiasSummary& s = summary[i + j];
        const double v = grid == 0   ? s.learned_ho
                         : grid == 1 ? s.learned_ho / s.random_ho
                                     : s.learned_ho / s.rescaled_ho;
        if (s.count == 0) {
          absl::StrAppend(&md, " n/a |");
        } else {
          absl::StrAppend(&md, absl::StrFormat(grid == 1 ? " %.4f |" : " %.3f |", v));
        }
      }
      absl::StrAppend(&md, "\n");
    }
  }
  // Per (d, r): mean over the module cells that are not n/a.
  absl::StrAppend(&md,
                  "\nPer (d, r), mean over the module types that are not n/a (cells = "
                  "module types averaged):\n\n"
                  "| d | r | cells | random (ho) | rescaled (ho) | learned (ho) | learned (cal) "
                  "| svd-cal (ho) | svd floor (ho) |\n"
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < summary.size(); i += per_dr) {
    double acc[6] = {0, 0, 0, 0, 0, 0};
    int cells = 0;
    for (size_t j = 0; j < per_dr; ++j) {
      const BiasSummary& s = summary[i + j];
      if (s.count == 0) continue;
      ++cells;
      acc[0] += s.random_ho;
      acc[1] += s.rescaled_ho;
      acc[2] += s.learned_ho;
      acc[3] += s.learned_cal;
      acc[4] += s.svd_cal_ho;
      acc[5] += s.svd_floor_ho;
    }
    if (cells == 0) {
      absl::StrAppend(&md, "| ", summary[i].d, " | ", summary[i].r,
                      " | 0 | n/a | n/a | n/a | n/a | n/a | n/a |\n");
      continue;
    }
    for (double& v : acc) v /= cells;
    absl::StrAppend(&md, absl::StrFormat("| %d | %d | %d | %.3f | %.4f | %.4f | %.4f | %.4f "
                                         "| %.4f |\n",
                                         summary[i].d, summary[i].r, cells, acc[0], acc[1],
                                         acc[2], acc[3], acc[4], acc[5]));
  }
  // Per (d, r): the learning-rate meaning of a subspace step (BiasRow::descent_*, step_*).
  absl::StrAppend(
      &md,
      "\nLearning-rate meaning of the first subspace Adam step, per (d, r), mean over the module "
      "types that are not n/a. The first Adam step is -lr sign(S), S = P^T G Q, applied as "
      "P sign(S) Q^T; full Adam's is -lr sign(G). On G_ho and per unit lr, relative to full "
      "Adam: descent = |S|_1 / |G|_1 (first-order loss decrease), step = "
      "norm(P sign(S) Q^T) / sqrt(m n) (Frobenius size of the update). A subspace lr equal to "
      "full Adam's lr times 1 / descent gives the same first-order decrease.\n\n"
      "| d | r | descent random | rescaled | learned | svd-cal | step random | rescaled | "
      "learned | svd-cal |\n"
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (size_t i = 0; i < summary.size(); i += per_dr) {
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int cells = 0;
    for (size_t j = 0; j < per_dr; ++j) {
      const BiasSummary& s = summary[i + j];
      if (s.count == 0) continue;
      ++cells;
      const double v[8] = {s.descent_random, s.descent_rescaled, s.descent_learned, s.descent_svd,
                           s.step_random,    s.step_rescaled,    s.step_learned,    s.step_svd};
      for (int k = 0; k < 8; ++k) acc[k] += v[k];
    }
    if (cells == 0) continue;
    for (double& v : acc) v /= cells;
    absl::StrAppend(&md, absl::StrFormat("| %d | %d | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f "
                                         "| %.4f | %.4f |\n",
                                         summary[i].d, summary[i].r, acc[0], acc[1], acc[2], acc[3],
                                         acc[4], acc[5], acc[6], acc[7]));
  }
  absl::StrAppend(&md,
                  "\nGradient statistics (Frobenius norms, cosine between G_cal and G_ho, "
                  "share of norm(G_ho)^2 in its top singular direction):\n\n"
                  "| layer | module | norm G_cal | norm G_ho | cosine | top-1 share (ho) |\n"
                  "|---:|---|---:|---:|---:|---:|\n");
  for (const GradStats& g : grads) {
    absl::StrAppend(&md, absl::StrFormat("| %d | %s | %.4g | %.4g | %.4f | %.3f |\n", g.layer,
                                         g.module, g.cal_norm, g.ho_norm, g.cosine, g.ho_top1));
  }
  return md;
}

// Every row, summary cell and gradient statistic as JSON (NaN written as null).
nlohmann::json ToJson(const StudyOptions& o, absl::Span<const BiasRow> rows,
                      absl::Span<const BiasSummary> summary, absl::Span<const GradStats> grads,
                      const std::map<std::string, int64_t>& label_counts, double grad_seconds,
                      double total_seconds) {
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); };
  nlohmann::json j;
  j["config"] = {{"model", o.model_path},
                 {"data", o.data_path},
                 {"seq_len", o.seq_len},
                 {"cal_examples", o.cal_examples},
                 {"heldout_examples", o.heldout_examples},
                 {"micro_batch", o.micro_batch},
                 {"seed", o.seed},
                 {"projector_seed", o.projector_seed},
                 {"layers", o.layers},
                 {"d", o.ds},
                 {"r", o.rs},
                 {"fit_iters", o.fit.max_iters},
                 {"fit_lr", o.fit.lr},
                 {"fit_float64", o.fit.float64},
                 {"fit_rescale", o.fit.rescale},
                 {"fit_patience", o.fit.patience},
                 {"label_counts", label_counts}};
  j["seconds"] = {{"gradients", grad_seconds}, {"total", total_seconds}};
  j["rows"] = nlohmann::json::array();
  for (const BiasRow& r : rows) {
    j["rows"].push_back({{"layer", r.layer},
                         {"module", r.module},
                         {"name", r.name},
                         {"m", r.m},
                         {"n", r.n},
                         {"d", r.d},
                         {"r", r.r},
                         {"ok", r.ok},
                         {"note", r.note},
                         {"random_cal", num(r.random_cal)},
                         {"random_ho", num(r.random_ho)},
                         {"rescaled_cal", num(r.rescaled_cal)},
                         {"rescaled_ho", num(r.rescaled_ho)},
                         {"learned_cal", num(r.learned_cal)},
                         {"learned_ho", num(r.learned_ho)},
                         {"svd_cal_ho", num(r.svd_cal_ho)},
                         {"svd_floor_ho", num(r.svd_floor_ho)},
                         {"descent_random", num(r.descent_random)},
                         {"descent_rescaled", num(r.descent_rescaled)},
                         {"descent_learned", num(r.descent_learned)},
                         {"descent_svd", num(r.descent_svd)},
                         {"step_random", num(r.step_random)},
                         {"step_rescaled", num(r.step_rescaled)},
                         {"step_learned", num(r.step_learned)},
                         {"step_svd", num(r.step_svd)},
                         {"iterations", r.iterations},
                         {"lr_halvings", r.lr_halvings},
                         {"fit_seconds", r.fit_seconds}});
  }
  j["summary"] = nlohmann::json::array();
  for (const BiasSummary& s : summary) {
    j["summary"].push_back({{"d", s.d},
                            {"r", s.r},
                            {"module", s.module},
                            {"count", s.count},
                            {"note", s.note},
                            {"random_ho", num(s.random_ho)},
                            {"rescaled_ho", num(s.rescaled_ho)},
                            {"learned_ho", num(s.learned_ho)},
                            {"learned_cal", num(s.learned_cal)},
                            {"svd_cal_ho", num(s.svd_cal_ho)},
                            {"svd_floor_ho", num(s.svd_floor_ho)},
                            {"descent_learned", num(s.descent_learned)},
                            {"step_learned", num(s.step_learned)},
                            {"learned_not_below_random", s.learned_not_below_random},
                            {"learned_not_below_rescaled", s.learned_not_below_rescaled}});
  }
  j["gradients"] = nlohmann::json::array();
  for (const GradStats& g : grads) {
    j["gradients"].push_back({{"layer", g.layer},
                              {"module", g.module},
                              {"cal_norm", g.cal_norm},
                              {"ho_norm", g.ho_norm},
                              {"cosine", g.cosine},
                              {"ho_top1", g.ho_top1}});
  }
  return j;
}

// Writes `text` to `path`; kUnavailable naming the path when it cannot be written.
absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) {
    return absl::UnavailableError(absl::StrCat("cannot write '", path,
                                               "': check that its directory exists"));
  }
  return absl::OkStatus();
}

// The whole study (see the file comment).
absl::Status Run(const StudyOptions& o) {
  const auto t_start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto loaded, LoadModelAndTokenizer(o.model_path));
  model::LlamaModel& llama = loaded.first;
  const model::BpeTokenizer& tok = loaded.second;
  const int64_t num_layers = llama.config().num_layers;
  for (int64_t l : o.layers) {
    if (l < 0 || l >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat("--layers: ", l, " is not in [0, ",
                                                     num_layers, ") for this model"));
    }
  }
  std::vector<data::TokenizedExample> cal, ho;
  std::map<std::string, int64_t> label_counts;
  RETURN_IF_ERROR(LoadSubsets(o, tok, &cal, &ho, &label_counts));
  const int32_t pad_id = tok.pad_id() >= 0 ? tok.pad_id() : std::max(0, tok.eos_id());

  // Only the sampled linears carry dense gradients.
  std::vector<int64_t> linears;  // global linear indices, (layer, module) order
  llama.SetLinearMode(model::LinearMode::kFrozen);
  for (int64_t l : o.layers) {
    for (LinearKind k : o.modules) {
      const int64_t i = model::LinearIndex(l, k);
      llama.SetLinearMode(i, model::LinearMode::kDense);
      linears.push_back(i);
    }
  }
  LOG(INFO) << "gradients of " << linears.size() << " linears over " << cal.size()
            << " calibration + " << ho.size() << " held-out examples";
  const auto t_grad = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::vector<at::Tensor> g_cal,
                   MeanDenseGradients(llama, cal, linears, o.micro_batch, pad_id));
  ASSIGN_OR_RETURN(std::vector<at::Tensor> g_ho,
                   MeanDenseGradients(llama, ho, linears, o.micro_batch, pad_id));
  const double grad_seconds = Seconds(t_grad);
  LOG(INFO) << absl::StrFormat("gradients done in %.1f s", grad_seconds);
  llama.SetLinearMode(model::LinearMode::kFrozen);

  std::vector<GradStats> grad_stats;
  std::vector<SvdReference> svd_refs;
  for (size_t k = 0; k < linears.size(); ++k) {
    GradStats g;
    g.layer = linears[k] / model::kLinearsPerLayer;
    g.module = ModuleName(static_cast<LinearKind>(linears[k] % model::kLinearsPerLayer));
    const at::Tensor a = g_cal[k].to(at::kDouble), b = g_ho[k].to(at::kDouble);  // (m, n) fp64
    if (!at::isfinite(a).all().item<bool>() || !at::isfinite(b).all().item<bool>()) {
      return absl::InternalError(absl::StrCat("non-finite gradient for ",
                                              llama.LinearName(linears[k])));
    }
    g.cal_norm = a.norm().item<double>();
    g.ho_norm = b.norm().item<double>();
    g.cosine = (a * b).sum().item<double>() / (g.cal_norm * g.ho_norm);
    ASSIGN_OR_RETURN(SvdReference ref, MakeSvdReference(g_cal[k], g_ho[k]));
    g.ho_top1 = ref.ho_energy[0].item<double>();
    grad_stats.push_back(g);
    svd_refs.push_back(std::move(ref));
  }

  std::vector<BiasRow> rows;
  for (int64_t d : o.ds) {
    for (int64_t r : o.rs) {
      const auto t_dr = std::chrono::steady_clock::now();
      for (size_t k = 0; k < linears.size(); ++k) {
        const at::Tensor& w = llama.LinearWeight(linears[k]);  // (m, n) fp32
        BiasRow row;
        row.layer = grad_stats[k].layer;
        row.module = grad_stats[k].module;
        row.name = llama.LinearName(linears[k]);
        row.m = w.size(0);
        row.n = w.size(1);
        row.d = d;
        row.r = r;
        const absl::Status st =
            MeasureRow(g_cal[k], g_ho[k], ProjectorSeed(o.projector_seed, linears[k], d, r),
                       o.fit, &row);
        if (!st.ok()) {
          return absl::Status(st.code(), absl::StrCat(row.name, " d=", d, " r=", r, ": ",
                                                      st.message()));
        }
        if (row.ok) MeasureSvdReference(svd_refs[k], g_ho[k], &row);
        rows.push_back(row);
      }
      LOG(INFO) << absl::StrFormat("d=%d r=%d done in %.1f s (total %.1f s)", d, r,
                                   Seconds(t_dr), Seconds(t_start));
    }
  }
  const std::vector<BiasSummary> summary = Summarize(rows, o.ds, o.rs, o.modules);
  const double total_seconds = Seconds(t_start);
  const std::string md =
      MarkdownReport(o, summary, grad_stats, label_counts, grad_seconds, total_seconds);
  std::printf("%s", md.c_str());
  if (!absl::GetFlag(FLAGS_md_out).empty()) {
    RETURN_IF_ERROR(WriteFile(absl::GetFlag(FLAGS_md_out), md));
  }
  if (!absl::GetFlag(FLAGS_json_out).empty()) {
    RETURN_IF_ERROR(WriteFile(
        absl::GetFlag(FLAGS_json_out),
        ToJson(o, rows, summary, grad_stats, label_counts, grad_seconds, total_seconds)
                .dump(1) +
            "\n"));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace lspo::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Relative estimation bias of learned vs random sparse projectors on held-out gradients. "
      "Run from the repository root: projector_bias_study [--layers=0,10,20,29] [--d=64,128,256] "
      "[--r=2,4,8,16] [--fit_iters=40] [--json_out=PATH] [--md_out=PATH]");
  absl::ParseCommandLine(argc, argv);
  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;
  const int threads = std::max(1, absl::GetFlag(FLAGS_threads));
  at::set_num_threads(threads);
  tbb::global_control tbb_threads(tbb::global_control::max_allowed_parallelism,
                                  static_cast<size_t>(threads));
  auto options = lspo::bench::ParseStudyOptions();
  absl::Status st = options.ok() ? lspo::bench::Run(*options) : options.status();
  if (!st.ok()) {
    LOG(ERROR) << "projector_bias_study: " << st;
    return 1;
  }
  return 0;
}
