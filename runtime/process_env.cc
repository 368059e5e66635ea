#include "runtime/process_env.h"

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

}  // namespace lspo::runtime
