// Fuzzes the model.safetensors.index.json reader (model/hf_checkpoint.h ParseSafetensorsIndex,
// what HfCheckpoint::Open uses for a sharded model folder) on any text. For every input:
//   - a refusal is kDataLoss, never another code or an exception;
//   - an accepted index names only plain file names in the folder (non-empty, no '/'), its
//     shard list is sorted without repeats and is exactly the set of weight_map's values;
//   - round trip: {"weight_map": the map read}, written with nlohmann::json (there is no index
//     writer in the project; transformers writes this layout), reads back to the same map and
//     shards.
#include <set>
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_harness.h"
#include "model/hf_checkpoint.h"
#include "nlohmann/json.hpp"

namespace lspo::fuzz {

int FuzzSafetensorsIndex(const uint8_t* data, size_t size) {
  if (size > (size_t{1} << 20)) return 0;  // deeply nested JSON must fit (regressions/)
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<model::SafetensorsIndex> index =
      model::ParseSafetensorsIndex(text, "<fuzz>/model.safetensors.index.json");
  if (!index.ok()) {
    LSPO_FUZZ_CHECK(index.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  std::set<std::string> values;
  for (const auto& [name, shard] : index->weight_map) {
    LSPO_FUZZ_CHECK(!shard.empty() && shard.find('/') == std::string::npos);
    values.insert(shard);
  }
  for (size_t i = 1; i < index->shards.size(); ++i) {
    LSPO_FUZZ_CHECK(index->shards[i - 1] < index->shards[i]);
  }
  LSPO_FUZZ_CHECK(std::set<std::string>(index->shards.begin(), index->shards.end()) == values);
  nlohmann::json written;
  written["weight_map"] = nlohmann::json::object();
  for (const auto& [name, shard] : index->weight_map) written["weight_map"][name] = shard;
  absl::StatusOr<model::SafetensorsIndex> back =
      model::ParseSafetensorsIndex(written.dump(), "<round trip>");
  LSPO_FUZZ_CHECK(back.ok());
  LSPO_FUZZ_CHECK(back->weight_map == index->weight_map && back->shards == index->shards);
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzSafetensorsIndex)
