// The worker's memory check (memory_check.h).
#include "gpu_worker/memory_check.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "offload/job_assets.h"
#include "offload/memory_plan.h"
#include "offload/training_mode.h"
#include "runtime/cuda/device_runtime.h"
#include "runtime/status_macros.h"

namespace lspo::worker {

using lspo::v1::JobSpec;

absl::Status CheckJobFitsDevice(JobSpec* spec_in, bool cuda, bool skip,
                                std::vector<std::string>* chosen) {
  if (skip) {
    LOG(WARNING) << "worker: --skip_memory_check: the job's memory plan is not checked";
    return absl::OkStatus();
  }
  const JobSpec& spec = *spec_in;
  // A config or a setting the planner cannot use is left to the loaders and the update paths,
  // whose errors name the file or the field.
  absl::StatusOr<model::LlamaConfig> config = offload::LoadJobModelConfig(spec);
  if (!config.ok()) return absl::OkStatus();
  const offload::ModeDescriptor& m = offload::ModeOf(spec);
  const lspo::v1::TrainingMode mode = m.mode;
  absl::StatusOr<offload::MemoryPlan> planned = offload::PlanJobMemory(spec, *config, mode, cuda);
  if (!planned.ok()) return absl::OkStatus();
  int64_t budget = 0;
  std::string what;
  if (cuda && spec.device_memory_limit_mb() > 0) {
    budget = static_cast<int64_t>(spec.device_memory_limit_mb()) << 20;
    what = absl::StrCat("the job's device_memory_limit_mb = ", spec.device_memory_limit_mb());
  } else if (cuda) {
    absl::StatusOr<runtime::cuda::MemoryInfo> info = runtime::cuda::GetMemoryInfo();
    if (!info.ok()) {
      LOG(WARNING) << "worker: memory check skipped, the GPU's memory cannot be read: "
                   << info.status().message();
      return absl::OkStatus();
    }
    budget = static_cast<int64_t>(info->total_bytes) - offload::kCudaContextBytes;
    what = absl::StrFormat("this GPU's %.2f GiB less %.2f GiB of CUDA context",
                           info->total_bytes / double(1LL << 30),
                           offload::kCudaContextBytes / double(1LL << 30));
  } else {
    budget = offload::PhysicalHostMemoryBytes();
    what = "this host's physical memory";
    if (budget <= 0) return absl::OkStatus();
  }
  // Settings the spec left unset, chosen to fit (issue 42): then the plan of the chosen ones.
  absl::StatusOr<std::vector<std::string>> choice =
      offload::ChooseFittingDefaults(spec_in, *config, mode, cuda, budget);
  if (choice.ok() && !choice->empty()) {
    for (const std::string& line : *choice) {
      LOG(INFO) << "worker: " << line;
      chosen->push_back(line);
    }
    planned = offload::PlanJobMemory(spec, *config, mode, cuda);
    if (!planned.ok()) return absl::OkStatus();
  }
  const offload::MemoryPlan& plan = *planned;
  constexpr double kGiB = 1LL << 30;
  const int64_t need = cuda ? plan.device_peak : plan.device_peak + plan.arena;
  LOG(INFO) << absl::StrFormat("worker: memory plan of this %s job: %.2f GiB (%s) of %.2f GiB",
                               std::string(m.name), need / kGiB, cuda ? "GPU" : "host",
                               budget / kGiB);
  if (need <= budget) return absl::OkStatus();
  ASSIGN_OR_RETURN(offload::FitAnswer fit, offload::FitOnDevice(spec, *config, mode, cuda, budget));
  std::vector<offload::PlanTerm> terms = plan.device_static;
  terms.push_back(
      {plan.checkpointing ? "activations (checkpointed)" : "activations", plan.activations});
  std::sort(terms.begin(), terms.end(),
            [](const auto& a, const auto& b) { return a.bytes > b.bytes; });
  std::vector<std::string> largest;
  for (size_t i = 0; i < terms.size() && i < 3; ++i) {
    largest.push_back(absl::StrFormat("%s %.2f GiB", terms[i].name, terms[i].bytes / kGiB));
  }
  std::string advice = fit.largest_micro_batch > 0
                           ? absl::StrCat("micro_batch_size ", fit.largest_micro_batch, " fits")
                           : "no micro-batch fits at this seq_len";
  if (!spec.activation_checkpointing() && fit.largest_micro_batch_checkpointing > 0) {
    absl::StrAppend(&advice, "; with activation_checkpointing: true micro_batch_size ",
                    fit.largest_micro_batch_checkpointing, " fits");
  }
  if (m.learned_projectors && fit.largest_d > 0) {
    absl::StrAppend(&advice, "; lsp.d ", fit.largest_d, " fits at this micro-batch");
  }
  if (fit.fits_with_nearest_rounding) {
    absl::StrAppend(&advice,
                    "; the job fits with lsp.apply_rounding: stochastic or nearest (no residuals)");
  }
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the job will not fit: its memory plan in mode %s needs %.2f GiB of %s memory (%s, ...) "
      "but %s leaves %.2f GiB: %s. `lspctl plan --spec=FILE --device=%s "
      "--device_memory_gb=%.0f` prints the whole plan; the worker's --skip_memory_check (lspctl "
      "run --skip_memory_check) runs it anyway",
      std::string(m.name), need / kGiB, cuda ? "GPU" : "host", absl::StrJoin(largest, ", "), what,
      budget / kGiB, advice, cuda ? "cuda" : "cpu", std::ceil(budget / kGiB)));
}

}  // namespace lspo::worker
