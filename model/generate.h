// Text generation with a KV cache (LlamaModel::ForwardCached): greedy decoding or sampling
// with temperature, top-k and top-p, stopping at the model's end-of-sequence ids.
//
// Sampling follows transformers' `generate` logits warpers, in its order: the logits (V) fp32
// are divided by `temperature`, then all but the `top_k` largest are set to -inf, then the
// smallest-probability tokens whose cumulative probability (ascending order) is <= 1 - top_p
// are removed (at least one token is kept), and a token is drawn from the softmax with a
// CPU generator seeded by `seed`. temperature 0 means greedy (argmax; ties -> lowest id, as
// torch.argmax). Greedy output equals transformers' greedy `generate` token for token.
//
// Thread-safety: Generate mutates the model's state only through ForwardCached (which runs no
// hooks and records no graph); not thread-safe with other uses of the same model.
#ifndef LSPO_MODEL_GENERATE_H_
#define LSPO_MODEL_GENERATE_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/llama.h"

namespace lspo::model {

struct GenerationOptions {
  int64_t max_new_tokens = 128;  // tokens generated at most (>= 1)
  double temperature = 0.0;      // 0 = greedy; > 0 = sampling
  int64_t top_k = 0;             // 0 = no top-k filter
  double top_p = 1.0;            // 1 = no nucleus filter; in (0, 1]
  uint64_t seed = 0;             // seed of the sampling generator
  // Generation stops after emitting any of these ids (the emitted stop id is included in
  // the result, as in transformers). Empty = never stop early.
  std::vector<int64_t> stop_ids;
};

struct GenerationResult {
  std::vector<int32_t> tokens;   // generated ids (the prompt is not included)
  bool stopped = false;          // true when the last token is a stop id
  double prefill_seconds = 0.0;  // wall time of the prompt's forward
  double decode_seconds = 0.0;   // wall time of the remaining tokens
  // Generated tokens per second of decoding (tokens after the first / decode_seconds; 0 when
  // fewer than two tokens were generated).
  double tokens_per_second() const;
};

// Generates up to options.max_new_tokens ids after `prompt` (>= 1 id, each in [0, V)).
// `on_token` (may be empty) is called with each id as soon as it is chosen, for streaming.
// Errors: kInvalidArgument for an empty prompt, an id outside the vocabulary, max_new_tokens
// < 1, a temperature that is negative or not finite, top_k < 0 or top_p outside (0, 1];
// ForwardCached's errors.
absl::StatusOr<GenerationResult> Generate(LlamaModel& model, absl::Span<const int32_t> prompt,
                                          const GenerationOptions& options,
                                          const std::function<void(int32_t)>& on_token = {});

// Stop ids of a model: config.eos_token_ids (or eos_token_id), plus `extra` ids >= 0 that are
// not already listed (e.g. the tokenizer's eos, or generation_config.json's list).
std::vector<int64_t> StopIds(const LlamaConfig& config, absl::Span<const int64_t> extra);

}  // namespace lspo::model

#endif  // LSPO_MODEL_GENERATE_H_
