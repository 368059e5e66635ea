// LSPO_CPU_CLONES: compiles a hot CPU loop once per x86-64 ISA level and lets the dynamic
// loader pick the best one for the running CPU (GCC target_clones, an ifunc resolved at load).
//
// The levels are the psABI's microarchitecture levels (x86-64 psABI 1.0, "Micro-
// architecture levels"): x86-64-v4 (AVX-512 F/BW/CD/DQ/VL), x86-64-v3 (AVX2, FMA, BMI2) and
// the baseline. The resolver tests the CPU's feature bits for a level, so every CPU that has
// the features gets the clone, whatever its model. (Clones named by a CPU model, e.g.
// "arch=skylake-avx512", are chosen only when libgcc recognises exactly that model: an
// unknown or newer model, e.g. a Sapphire Rapids or Emerald Rapids Xeon under GCC 12, gets the
// baseline SSE2 clone.)
//
// Expands to nothing off x86-64 GCC and under ASan/TSan (their instrumentation and ifuncs do
// not mix); the plain function is then compiled for the build's target.
#ifndef LSPO_RUNTIME_CPU_CLONES_H_
#define LSPO_RUNTIME_CPU_CLONES_H_

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define LSPO_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LSPO_CPU_CLONES
#endif

#endif  // LSPO_RUNTIME_CPU_CLONES_H_
