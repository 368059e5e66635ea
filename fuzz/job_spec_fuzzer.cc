// Fuzzes the job-spec parser (spec/job_spec.h) the way lspctl and the scheduler use it
// (LoadJobSpecFile -> ParseJobSpec{Json,Yaml}; then ResolveDefaults + ValidateJobSpec). The
// input is spec text; it goes through both parsers (JSON is YAML, so the JSON seeds reach the
// YAML path too). For every spec that parses:
//   - ResolveDefaults, ValidateJobSpec (paths are only checked with access(2)) and
//     JobSpecToJson run;
//   - the JSON rendering parses back to the same spec (JobSpecToJson is what the scheduler
//     writes to summary files and logs).
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_harness.h"
#include "spec/job_spec.h"

namespace lspo::fuzz {
namespace {

void Check(const lspo::v1::JobSpec& parsed) {
  const std::string json = spec::JobSpecToJson(parsed);
  auto back = spec::ParseJobSpecJson(json, "<round trip>");
  if (!back.ok()) {
    std::fprintf(stderr, "JobSpecToJson output does not parse back: %s\n%s\n",
                 std::string(back.status().message()).c_str(), json.c_str());
  }
  LSPO_FUZZ_CHECK(back.ok());
  LSPO_FUZZ_CHECK(spec::JobSpecToJson(*back) == json);
  lspo::v1::JobSpec spec = parsed;
  spec::ResolveDefaults(&spec);
  (void)spec::ValidateJobSpec(spec);
}

}  // namespace

int FuzzJobSpec(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  auto json = spec::ParseJobSpecJson(text, "<fuzz>");
  if (json.ok()) Check(*json);
  absl::StatusOr<lspo::v1::JobSpec> yaml = spec::ParseJobSpecYaml(text, "<fuzz>");
  if (yaml.ok()) Check(*yaml);
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzJobSpec)
