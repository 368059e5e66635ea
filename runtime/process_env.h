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

// One malloc arena for the whole process (mallopt M_ARENA_MAX = 1) unless the user set
// MALLOC_ARENA_MAX. Reason: glibc gives threads their own arenas, and memory a thread frees
// stays in its arena; the worker's forward runs on whichever gRPC thread serves TrainStep, so
// when two steps ran on different threads the first step's freed activations were not reused
// and a CPU job's peak RSS jumped by up to one step's activations (SmolLM2-135M lsp, micro-batch
// 4 x 256: 4.3 to 6.6 GiB over five runs; with one arena 4.36-4.39 GiB over three, step time
// unchanged; docs/bench.md "Memory plan"). The memory plan (offload/memory_plan.h) assumes it.
// Call first thing in main(), before any thread starts (arenas that exist keep their threads).
void UseOneMallocArena();

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_PROCESS_ENV_H_
