#include "runtime/process_env.h"

#include <malloc.h>
#include <stdlib.h>
#include <unistd.h>

namespace lspo::runtime {

void UsePassiveOpenMpWaits(int argc, char** argv) {
  (void)argc;
  if (getenv("OMP_WAIT_POLICY") != nullptr) return;
  setenv("OMP_WAIT_POLICY", "PASSIVE", /*overwrite=*/1);
  execv("/proc/self/exe", argv);
  // exec failed: carry on with the default policy.
}

void UseOneMallocArena() {
  if (getenv("MALLOC_ARENA_MAX") != nullptr) return;
  mallopt(M_ARENA_MAX, 1);
}

}  // namespace lspo::runtime
