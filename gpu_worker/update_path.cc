#include "gpu_worker/update_path.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "gpu_worker/worker_job.h"
#include "offload/training_mode.h"

namespace lspo::worker {

// Each mode's factory, defined in its own file.
std::unique_ptr<UpdatePath> MakeNativePath();         // native_path.cc
std::unique_ptr<UpdatePath> MakeLspPath();            // lsp_path.cc
std::unique_ptr<UpdatePath> MakeZeroPath();           // zero_path.cc
std::unique_ptr<UpdatePath> MakeLoraPath();           // lora_path.cc
std::unique_ptr<UpdatePath> MakeGalorePath();         // galore_path.cc
std::unique_ptr<UpdatePath> MakeGaloreOffloadPath();  // galore_offload_path.cc

namespace {

// The registry: a new mode is one line here (and its file).
struct Registration {
  lspo::v1::TrainingMode mode;
  std::unique_ptr<UpdatePath> (*make)();
};
constexpr Registration kRegistry[] = {
    {lspo::v1::MODE_LSP, &MakeLspPath},
    {lspo::v1::MODE_NATIVE, &MakeNativePath},
    {lspo::v1::MODE_ZERO, &MakeZeroPath},
    {lspo::v1::MODE_LORA, &MakeLoraPath},
    {lspo::v1::MODE_GALORE, &MakeGalorePath},
    {lspo::v1::MODE_GALORE_OFFLOAD, &MakeGaloreOffloadPath},
};

}  // namespace

absl::StatusOr<std::unique_ptr<UpdatePath>> MakeUpdatePath(const lspo::v1::JobSpec& spec) {
  // The descriptor's mode: unset is lsp, a spec of mode galore with galore.offload is
  // GaLore-Offload (offload/training_mode.h).
  const lspo::v1::TrainingMode mode = offload::ModeOf(spec).mode;
  for (const Registration& r : kRegistry) {
    if (r.mode == mode) return r.make();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("job spec field mode = ", lspo::v1::TrainingMode_Name(mode),
                   " has no update path on this worker: use ", offload::ModeNames()));
}

int64_t UpdatePath::TrainableParameters(const WorkerJob& job) const {
  int64_t n = 0;
  for (const offload::LinearShape& l : job.linears) n += l.m * l.n;
  return n;
}

offload::NamedTensors UpdatePath::ExportedTensors(WorkerJob* job) {
  return job->model->NamedTensors();
}

absl::StatusOr<std::vector<std::string>> UpdatePath::WriteArtifacts(WorkerJob* job,
                                                                    const std::string& dir) {
  const std::string adapter = dir + "/adapter";
  for (const char* f : {"/adapter_config.json", "/adapter_model.safetensors"}) {
    if (std::remove((adapter + f).c_str()) != 0 && errno != ENOENT) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot remove the stale PEFT adapter file '", adapter, f,
                       "' of an earlier lora job: ", std::strerror(errno)));
    }
  }
  (void)rmdir(adapter.c_str());  // Only when empty: anything else the user put there stays.
  return std::vector<std::string>{};
}

absl::Status UpdatePath::ApplyUpdate(WorkerJob* job, int64_t i, uint32_t step, double decay) {
  return absl::FailedPreconditionError(
      absl::StrCat("mode ", name(),
                   " has no offloaded update to apply (ApplyUpdates needs a mode with an "
                   "optimizer service)"));
}

}  // namespace lspo::worker
