#include "model/generate.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/status_macros.h"

namespace lspo::model {
namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Picks the next id from last-position logits (V) fp32 (see the file comment).
int64_t NextToken(const at::Tensor& logits_in, const GenerationOptions& o, at::Generator& gen) {
  at::Tensor logits = logits_in.to(at::kFloat).cpu();  // (V)
  if (o.temperature == 0.0) return logits.argmax().item<int64_t>();
  logits = logits / o.temperature;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t V = logits.size(0);
  if (o.top_k > 0 && o.top_k < V) {
    at::Tensor kth = std::get<0>(at::topk(logits, o.top_k)).select(0, o.top_k - 1);
    logits = logits.masked_fill(logits < kth, neg_inf);
  }
  if (o.top_p < 1.0) {
    auto [sorted, order] = at::sort(logits, /*dim=*/0, /*descending=*/false);
    at::Tensor cum = at::softmax(sorted, 0).cumsum(0);  // ascending probabilities
    at::Tensor remove = cum <= (1.0 - o.top_p);
    remove.select(0, V - 1).fill_(false);  // keep the most likely token
    logits = logits.scatter(0, order, sorted.masked_fill(remove, neg_inf));
  }
  at::Tensor probs = at::softmax(logits, 0);
  return at::multinomial(probs, 1, /*replacement=*/false, gen).item<int64_t>();
}

}  // namespace

double GenerationResult::tokens_per_second() const {
  if (tokens.size() < 2 || decode_seconds <= 0.0) return 0.0;
  return static_cast<double>(tokens.size() - 1) / decode_seconds;
}

std::vector<int64_t> StopIds(const LlamaConfig& config, absl::Span<const int64_t> extra) {
  std::vector<int64_t> ids = config.eos_token_ids;
  if (ids.empty() && config.eos_token_id >= 0) ids.push_back(config.eos_token_id);
  for (int64_t id : extra) {
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<GenerationResult> Generate(LlamaModel& model, absl::Span<const int32_t> prompt,
                                          const GenerationOptions& o,
                                          const std::function<void(int32_t)>& on_token) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError("Generate: the prompt is empty; give at least one token");
  }
  if (o.max_new_tokens < 1 || !(o.temperature >= 0.0) || !std::isfinite(o.temperature) ||
      o.top_k < 0 || !(o.top_p > 0.0) || o.top_p > 1.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Generate: max_new_tokens ", o.max_new_tokens, ", temperature ", o.temperature, ", top_k ",
        o.top_k, ", top_p ", o.top_p,
        "; expected max_new_tokens >= 1, a finite temperature >= 0 (0 = greedy), top_k >= 0 "
        "(0 = off) and top_p in (0, 1]"));
  }
  at::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  GenerationResult result;
  KvCache cache;
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  at::Tensor input =
      at::tensor(ids, at::kLong).view({1, static_cast<int64_t>(ids.size())}).to(model.device());
  auto t0 = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(at::Tensor logits, model.ForwardCached(input, &cache));  // (1, V)
  auto t1 = std::chrono::steady_clock::now();
  result.prefill_seconds = Seconds(t0, t1);
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    const int64_t next = NextToken(logits[0], o, gen);
    result.tokens.push_back(static_cast<int32_t>(next));
    if (on_token) on_token(static_cast<int32_t>(next));
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) {
      result.stopped = true;
      break;
    }
    if (step + 1 == o.max_new_tokens) break;
    at::Tensor one =
        at::full({1, 1}, next, at::TensorOptions().dtype(at::kLong)).to(model.device());
    ASSIGN_OR_RETURN(logits, model.ForwardCached(one, &cache));
  }
  result.decode_seconds = Seconds(t1, std::chrono::steady_clock::now());
  return result;
}

}  // namespace lspo::model
