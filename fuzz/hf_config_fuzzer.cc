// Fuzzes the Hugging Face config.json reader (model/llama_config.h LlamaConfigFromHfJson), the
// way a model folder's config reaches it: text parsed as JSON (a non-JSON input is the JSON
// parser's to refuse), then read as a Llama-family config. For every input:
//   - a refusal is kInvalidArgument or kUnimplemented (never a crash, never an undefined
//     conversion of a huge or non-integral number: UBSan reports those);
//   - an accepted config passes Validate() (every size positive and within its bound), its
//     parameter count is positive, and ToHfConfigJson reads back to the same sizes.
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_harness.h"
#include "model/llama_config.h"
#include "nlohmann/json.hpp"

namespace lspo::fuzz {

int FuzzHfConfig(const uint8_t* data, size_t size) {
  if (size > 65536) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const nlohmann::json j = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                                 /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  absl::StatusOr<model::LlamaConfig> c = model::LlamaConfigFromHfJson(j, "<fuzz>");
  if (!c.ok()) {
    LSPO_FUZZ_CHECK(c.status().code() == absl::StatusCode::kInvalidArgument ||
                    c.status().code() == absl::StatusCode::kUnimplemented);
    return 0;
  }
  LSPO_FUZZ_CHECK(c->Validate().ok());
  LSPO_FUZZ_CHECK(c->NumParameters() > 0);
  absl::StatusOr<model::LlamaConfig> back =
      model::LlamaConfigFromHfJson(c->ToHfConfigJson("float32"), "<round trip>");
  if (!back.ok()) {
    std::fprintf(stderr, "ToHfConfigJson output does not read back: %s\n",
                 std::string(back.status().message()).c_str());
  }
  LSPO_FUZZ_CHECK(back.ok());
  LSPO_FUZZ_CHECK(back->hidden_size == c->hidden_size && back->num_layers == c->num_layers &&
                  back->vocab_size == c->vocab_size &&
                  back->intermediate_size == c->intermediate_size &&
                  back->NumParameters() == c->NumParameters());
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzHfConfig)
