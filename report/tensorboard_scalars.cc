// The TensorBoard scalars of a metrics.jsonl line. Contract: tensorboard_scalars.h.
#include "report/tensorboard_scalars.h"

#include <map>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace lspo::scheduler {
namespace {

using Json = nlohmann::json;

// Fields whose tag is not the kind's prefix + the field name, keyed "<kind>.<field>".
const std::map<std::string, std::string>& NamedTags() {
  static const auto* tags = new std::map<std::string, std::string>{
      {"step.loss", "train/loss"},
      {"step.lr", "train/learning_rate"},
      {"step.grad_norm", "train/grad_norm"},
      {"step.tokens_per_second", "train/tokens_per_second"},
      {"step.tokens", "train/loss_tokens"},
      {"step.d2h_bytes", "offload/bytes_to_cpu"},
      {"step.h2d_bytes", "offload/bytes_to_gpu"},
      {"step.all_reduce_bytes", "distributed/all_reduce_bytes"},
      {"step.split_layer", "schedule/split_layer"},
      {"eval.seconds", "eval/time_s"},
      {"projector_fit.mean_initial_relative_bias", "projector/bias_before_fit"},
      {"projector_fit.mean_final_relative_bias", "projector/bias_after_fit"},
      {"projector_fit.refitted", "projector/refitted_matrices"},
      {"projector_fit.seconds", "projector/fit_time_s"},
      {"master_refresh.max_abs_diff_before", "master/worker_max_abs_diff"},
      {"master_refresh.max_abs_drift_beyond_rounding_before", "master/drift_beyond_rounding"},
      {"master_drift.max_abs_diff", "master/worker_max_abs_diff"},
      {"master_drift.max_abs_drift_beyond_rounding", "master/drift_beyond_rounding"},
      {"master_refresh.max_drift_ulps_before", "master/drift_ulps"},
      {"master_drift.max_drift_ulps", "master/drift_ulps"},
  };
  return *tags;
}

std::string Prefix(const std::string& kind) {
  if (kind == "step") return "train/";
  if (kind == "projector_fit") return "projector/";
  if (kind == "master_refresh" || kind == "master_drift") return "master/";
  return kind + "/";  // eval/, and <kind>/ of kinds added later.
}

std::string Tag(const std::string& kind, const std::string& field) {
  const auto& named = NamedTags();
  if (auto it = named.find(absl::StrCat(kind, ".", field)); it != named.end()) return it->second;
  if (kind == "step") {
    constexpr absl::string_view kSeconds = "_seconds";
    if (absl::EndsWith(field, kSeconds)) {
      return absl::StrCat("time/", field.substr(0, field.size() - kSeconds.size()), "_s");
    }
    if (absl::EndsWith(field, "_bytes")) return "memory/" + field;
  }
  return Prefix(kind) + field;
}

// `v` as a number: a JSON number, or (with `int_strings`) a string holding a decimal integer
// (protobuf's JSON mapping of int64).
std::optional<double> Number(const Json& v, bool int_strings) {
  if (v.is_number()) return v.get<double>();
  int64_t i = 0;
  if (int_strings && v.is_string() && absl::SimpleAtoi(v.get_ref<const std::string&>(), &i)) {
    return static_cast<double>(i);
  }
  return std::nullopt;
}

}  // namespace

LineScalars TensorBoardScalars(const Json& line) {
  LineScalars out;
  if (!line.is_object()) return out;
  const auto kind_it = line.find("kind");
  const auto step_it = line.find("step");
  if (kind_it == line.end() || !kind_it->is_string() || step_it == line.end() ||
      !step_it->is_number_integer()) {
    return out;
  }
  const std::string& kind = kind_it->get_ref<const std::string&>();
  out.step = step_it->get<int64_t>();
  // StepMetrics / EvalMetrics / DataSummary (int64 fields as decimal strings).
  const bool proto_line = kind == "step" || kind == "eval" || kind == "data";
  const bool perplexity_measured =
      kind != "eval" || Number(line.value("perplexity", Json()), true).value_or(0) > 0;
  for (const auto& [field, value] : line.items()) {
    if (field == "kind" || field == "step") continue;
    if (!perplexity_measured && absl::StartsWith(field, "perplexity")) continue;
    if (std::optional<double> v = Number(value, proto_line)) {
      out.scalars.push_back({Tag(kind, field), static_cast<float>(*v)});
    } else if (proto_line && value.is_object()) {
      // A map field (StepMetrics device_phase_seconds): one scalar per key, <tag>/<key>.
      for (const auto& [key, item] : value.items()) {
        if (std::optional<double> x = Number(item, true)) {
          out.scalars.push_back({absl::StrCat(Tag(kind, field), "/", key), static_cast<float>(*x)});
        }
      }
    }
  }
  return out;
}

}  // namespace lspo::scheduler
