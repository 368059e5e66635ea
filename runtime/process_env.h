// Process start-up helpers shared by the service binaries.
#ifndef LSPO_RUNTIME_PROCESS_ENV_H_
#define LSPO_RUNTIME_PROCESS_ENV_H_

namespace lspo::runtime {

// Makes idle OpenMP threads sleep instead of spin (OMP_WAIT_POLICY=PASSIVE) unless the user
// set OMP_WAIT_POLICY. libgomp reads the variable when it is loaded, before main(), so this
// re-executes the binary (/proc/self/exe, same argv) once with the variable set; it returns
// normally when the variable was already set or the re-exec fails. Reason: the worker and
// the optimizer share the host's cores, and spinning workers of one process slow the other
// down by an order of magnitude (docs/known-failures.md #16; measured 12 ms vs 0.16 ms per
// element-wise op on a loaded 2-core machine). Call first thing in main().
void UsePassiveOpenMpWaits(int argc, char** argv);

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_PROCESS_ENV_H_
