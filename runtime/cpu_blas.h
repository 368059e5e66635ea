// The CPU BLAS behind LibTorch's fp32 GEMMs, and the choice of its kernel set (issue 46).
//
// Debian's LibTorch calls sgemm_ of the system BLAS, OpenBLAS 0.3.21 built with DYNAMIC_ARCH:
// at load it reads the CPUID model number and picks one of its kernel sets ("cores"). For a
// model number it does not know, its detection (driver/others/dynamic.c, get_coretype) falls
// through to "Prescott", the SSE3 kernels: on this project's Xeon (family 6, model 207, AVX-512
// and AMX) fp32 GEMMs of SmolLM2's shapes ran at 31-53 GFLOP/s instead of 174-289 with the
// SkylakeX kernels (docs/bench.md, "CPU BLAS"). Any CPU newer than the library is affected, and
// virtual machines that hide the model too.
//
// Every binary that links LibTorch links this file (CMake: lspo_use_torch, through the linker
// flag --undefined=lspo_cpu_blas_anchor; Bazel: //third_party/torch:torch, alwayslink), and its
// load-time constructor runs SelectCpuBlasKernels() once, before main() starts a thread (if
// OpenBLAS's own constructor has not chosen its core yet, it is asked to first):
// - OPENBLAS_CORETYPE unset and OpenBLAS's core needs less than the CPU has: the best core the
//   CPU supports is set (SkylakeX for AVX-512, Haswell for AVX2 + FMA, Sandybridge for AVX)
//   through OpenBLAS's own re-initialisation (gotoblas_dynamic_quit, then gotoblas_dynamic_init
//   with OPENBLAS_CORETYPE set for the call and restored after it);
// - OPENBLAS_CORETYPE set: respected, unless it names a core the CPU lacks the instructions
//   for (which would die of SIGILL in the first GEMM): then the best supported core, and a
//   warning naming the variable and the fix;
// - LSPO_CPU_BLAS_AUTO=0: nothing is changed (OpenBLAS's own choice, reported as such).
// CpuBlas() reports what is in use; the run header, `lspctl health` and the bench print it.
#ifndef LSPO_RUNTIME_CPU_BLAS_H_
#define LSPO_RUNTIME_CPU_BLAS_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace lspo::runtime {

// The widest x86-64 vector instruction set a kernel set needs, or a CPU (with the operating
// system's support for its registers) offers. Ordered: a CPU runs every kernel set whose
// level is at most its own.
enum class SimdLevel {
  kSse = 0,     // SSE2 .. SSE4.2 (every x86-64 CPU)
  kAvx = 1,     // AVX
  kAvx2 = 2,    // AVX2 and FMA3
  kAvx512 = 3,  // AVX-512 F, CD, VL, BW, DQ (Skylake-SP and later)
};

// "SSE", "AVX", "AVX2", "AVX-512".
const char* SimdLevelName(SimdLevel level);

// This CPU's level: __builtin_cpu_supports, which also checks that the operating system saves
// the AVX / AVX-512 registers (XGETBV), as OpenBLAS's own support_avx* do. Not x86-64: kSse.
SimdLevel DetectCpuSimdLevel();

// Whether this CPU is an AMD one (__builtin_cpu_is("amd")); false off x86-64.
bool CpuIsAmd();

// The level an OpenBLAS (0.3.x, x86-64 DYNAMIC_ARCH) core needs, by its name as
// openblas_get_corename() prints it or OPENBLAS_CORETYPE gives it (case-insensitive:
// "Prescott", "haswell", "SkylakeX", "Cooperlake", "Zen", ...). nullopt for a name OpenBLAS
// does not have. Source: the kernel files each core's KERNEL.* list uses in OpenBLAS's
// kernel/x86_64 (Haswell and Zen: AVX2 + FMA3; SkylakeX and Cooperlake: AVX-512).
std::optional<SimdLevel> OpenBlasCoreLevel(absl::string_view core);

// Whether an OpenBLAS core's kernels use AMD-only instructions (FMA4, SSE4a, 3DNow!: Athlon,
// Opteron, Opteron_SSE3, Barcelona, Bobcat, Bulldozer, Piledriver, Steamroller, Excavator), so
// that no Intel CPU runs them whatever its level. Unknown names: false.
bool OpenBlasCoreIsAmdOnly(absl::string_view core);

// The core to ask OpenBLAS for on a CPU of `level`: "SkylakeX", "Haswell", "Sandybridge", or
// "" for kSse (OpenBLAS's own choice is as good as any). SkylakeX rather than Cooperlake
// for AVX-512: they share the fp32 kernels, and OpenBLAS 0.3.21 cannot be forced to
// Cooperlake (its force_coretype loop stops one name short).
const char* OpenBlasCoreFor(SimdLevel level);

// The decision SelectCpuBlasKernels() makes, separated from the library for tests.
struct CoreChoice {
  std::string core;     // the core to force; empty: leave OpenBLAS's choice
  std::string reason;   // why (for CpuBlasInfo::chosen_by)
  std::string warning;  // non-empty: what the user should know and do
};
// `detected`: the core OpenBLAS runs now; `user_coretype`: OPENBLAS_CORETYPE, nullopt when
// unset; `cpu`, `cpu_is_amd`: DetectCpuSimdLevel(), CpuIsAmd(). Rules in the file comment; a
// user's core the CPU runs is never changed, an unknown one is left to OpenBLAS (which falls
// back to its detection by feature flags) with a warning.
CoreChoice ChooseOpenBlasCore(absl::string_view detected,
                              const std::optional<std::string>& user_coretype, SimdLevel cpu,
                              bool cpu_is_amd);

// What runs the CPU's fp32 GEMMs in this process.
struct CpuBlasInfo {
  std::string library;   // "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY ..." (openblas_get_config),
                         // or the file that provides sgemm_, or "no sgemm_ found"
  std::string provider;  // the file that provides sgemm_ (dladdr), "" if unknown
  bool is_openblas = false;
  std::string detected;   // the core OpenBLAS chose at load ("" if not OpenBLAS)
  std::string kernels;    // the core in use now ("" if not OpenBLAS)
  std::string chosen_by;  // "OpenBLAS", "OPENBLAS_CORETYPE", "lsp-offload (...)"
  SimdLevel cpu = SimdLevel::kSse;
  int threads = 0;      // openblas_get_num_threads(), 0 if unknown
  std::string warning;  // non-empty: a generic kernel set on an AVX2-or-better CPU, a forced
                        // core the CPU lacks, a reference BLAS; names the fix

  // One line: "OpenBLAS 0.3.21 (pthread, 2 threads), kernels SkylakeX on an AVX-512 CPU
  // (chosen by ...)" and, if any, " WARNING: ...".
  std::string Line() const;
};

// Makes the choice described in the file comment, once per process (later calls return the
// first result). Thread-safe; called by the load-time constructor. Never fails: a missing
// symbol (another BLAS, an OpenBLAS without DYNAMIC_ARCH) leaves the library alone and is
// reported in the result.
const CpuBlasInfo& SelectCpuBlasKernels();

// The result of SelectCpuBlasKernels() (running it if it has not run).
inline const CpuBlasInfo& CpuBlas() { return SelectCpuBlasKernels(); }

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_CPU_BLAS_H_
