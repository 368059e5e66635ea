// The optimizer's state of its one loaded job: what every mode shares (spec, arena, flags,
// the frozen tensors) and the mode's update rule, which owns the per-matrix state
// (update_rule.h). Internal to cpu_optimizer_service/.
//
// Thread-safety: used under OptimizerCore's mutex only.
#ifndef LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_JOB_H_
#define LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_JOB_H_

#include <memory>
#include <string>

#include "cpu_optimizer_service/update_rule.h"
#include "model/llama.h"
#include "proto/arena.pb.h"
#include "proto/job_spec.pb.h"
#include "runtime/completion_flags.h"
#include "runtime/shm_arena.h"
#include "tbb/global_control.h"

namespace lspo::optimizer {

// One loaded job (see the file comment).
struct OptimizerJob {
  std::string id;
  // Caps oneTBB (the CPU kernels: Adam, sparse projector loops) at JobSpec.num_threads for the
  // job's lifetime, like at::set_num_threads does for ATen (docs/known-failures.md #16).
  std::unique_ptr<tbb::global_control> tbb_threads;
  lspo::v1::JobSpec spec;
  lspo::v1::ArenaLayout layout;
  runtime::ShmArena arena;
  // The model as loaded, less the trained matrices (moved into the rule at LoadJob): the
  // embedding and norms, for the output folder.
  std::unique_ptr<model::LlamaModel> model;
  runtime::CompletionFlags flags;
  // The rule of layout.mode() (MakeUpdateRule), holding every trained matrix's state.
  std::unique_ptr<UpdateRule> rule;
};

}  // namespace lspo::optimizer

#endif  // LSPO_CPU_OPTIMIZER_SERVICE_OPTIMIZER_JOB_H_
