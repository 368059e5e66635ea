// Fuzzes the PEFT adapter_config.json reader (baselines/peft_config.h ParsePeftAdapterConfig,
// what ReadPeftAdapter uses before it builds the adapters) on any text. For every input:
//   - a refusal is kInvalidArgument or kUnimplemented, never another code or an exception;
//   - an accepted config's target modules are in kLoraModuleNames order (names outside it
//     last);
//   - round trip through the writer: PeftAdapterConfigJson (what WritePeftAdapter saves) of the
//     settings, with an empty target list made all seven as LoraAdapter::Create does, reads
//     back to the same r, lora_alpha, use_rslora and target modules.
#include <algorithm>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "baselines/peft_config.h"
#include "fuzz/fuzz_harness.h"

namespace lspo::fuzz {
namespace {

// Position of `m` in kLoraModuleNames; 7 for other names.
long ModuleRank(const std::string& m) {
  return std::find_if(std::begin(baselines::kLoraModuleNames),
                      std::end(baselines::kLoraModuleNames),
                      [&](const char* k) { return m == k; }) -
         std::begin(baselines::kLoraModuleNames);
}

}  // namespace

int FuzzPeftConfig(const uint8_t* data, size_t size) {
  if (size > (size_t{1} << 20)) return 0;  // deeply nested JSON must fit (regressions/)
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<baselines::LoraSettings> s =
      baselines::ParsePeftAdapterConfig(text, "<fuzz>/adapter_config.json");
  if (!s.ok()) {
    LSPO_FUZZ_CHECK(s.status().code() == absl::StatusCode::kInvalidArgument ||
                    s.status().code() == absl::StatusCode::kUnimplemented);
    return 0;
  }
  for (size_t i = 1; i < s->target_modules.size(); ++i) {
    LSPO_FUZZ_CHECK(ModuleRank(s->target_modules[i - 1]) <= ModuleRank(s->target_modules[i]));
  }
  baselines::LoraSettings w = *s;
  if (w.target_modules.empty()) {
    w.target_modules.assign(std::begin(baselines::kLoraModuleNames),
                            std::end(baselines::kLoraModuleNames));
  }
  const std::string written = baselines::PeftAdapterConfigJson(w, "base").dump(2);
  absl::StatusOr<baselines::LoraSettings> back =
      baselines::ParsePeftAdapterConfig(written, "<round trip>");
  if (!back.ok()) std::fprintf(stderr, "written config does not read back:\n%s\n", written.c_str());
  LSPO_FUZZ_CHECK(back.ok());
  LSPO_FUZZ_CHECK(back->r == w.r && back->alpha == w.alpha && back->use_rslora == w.use_rslora);
  // Names of equal rank (outside kLoraModuleNames) may come back in another order.
  std::vector<std::string> a = back->target_modules, b = w.target_modules;
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  LSPO_FUZZ_CHECK(a == b);
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzPeftConfig)
