// Fuzzes the generation_config.json reader (model/hf_checkpoint.h GenerationConfigEosIds, the
// stop ids `lspctl generate` adds for an HF model folder) on any text. For every input:
//   - a refusal is kDataLoss (not JSON, not an object), never another code or an exception;
//   - every id read is >= 0 (a huge or negative integer is skipped, never converted);
//   - round trip through the writer: a config holding those ids as its eos list, written by
//     LlamaConfig::ToHfGenerationConfigJson (what the exporter saves when the model folder had
//     no generation_config.json), reads back to the same ids in the same order.
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_harness.h"
#include "model/hf_checkpoint.h"
#include "model/llama_config.h"

namespace lspo::fuzz {

int FuzzGenerationConfig(const uint8_t* data, size_t size) {
  if (size > (size_t{1} << 20)) return 0;  // deeply nested JSON must fit (regressions/)
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<int64_t>> ids =
      model::GenerationConfigEosIds(text, "<fuzz>/generation_config.json");
  if (!ids.ok()) {
    LSPO_FUZZ_CHECK(ids.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  for (int64_t id : *ids) LSPO_FUZZ_CHECK(id >= 0);
  model::LlamaConfig c;
  c.bos_token_id = -1;
  c.pad_token_id = -1;
  c.eos_token_id = ids->empty() ? -1 : ids->front();
  c.eos_token_ids = ids->size() > 1 ? *ids : std::vector<int64_t>{};
  const std::string written = c.ToHfGenerationConfigJson().dump();
  absl::StatusOr<std::vector<int64_t>> back =
      model::GenerationConfigEosIds(written, "<round trip>");
  if (!back.ok()) std::fprintf(stderr, "written config does not read back: %s\n", written.c_str());
  LSPO_FUZZ_CHECK(back.ok());
  LSPO_FUZZ_CHECK(*back == *ids);
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzGenerationConfig)
