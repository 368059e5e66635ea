// The block size of the chunked cross-entropy (model/linear_cross_entropy.h), torch-free so
// that the memory planner (offload/memory_plan.h), which the torch-free scheduler links, counts
// the same blocks the loss allocates.
#ifndef LSPO_MODEL_LOSS_BLOCKS_H_
#define LSPO_MODEL_LOSS_BLOCKS_H_

#include <algorithm>
#include <cstdint>

namespace lspo::model {

// Byte budget of one block of fp32 logits (block_rows = max(1, budget / (4 V))): 64 MiB is 128
// rows of a 128k vocabulary, 512 rows of a 32k one: large enough GEMMs for a GPU, small beside
// the activations. The memory planner counts two such blocks (logits and logsumexp's temporary).
inline constexpr int64_t kLossBlockBytes = int64_t{64} << 20;

// Rows of one logits block of a vocabulary of `vocab` entries under `budget_bytes` (>= 1).
inline int64_t LossBlockRows(int64_t vocab, int64_t budget_bytes = kLossBlockBytes) {
  return std::max<int64_t>(1, budget_bytes / (4 * std::max<int64_t>(vocab, 1)));
}

}  // namespace lspo::model

#endif  // LSPO_MODEL_LOSS_BLOCKS_H_
