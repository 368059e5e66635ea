// Shared pieces of the libFuzzer harnesses in fuzz/.
//
// Each harness is a plain function `int Fuzz<Name>(const uint8_t* data, size_t size)` (the
// libFuzzer contract: must not crash, leak or trip a sanitizer on any input; returns 0). A
// harness file ends with LSPO_FUZZ_ENTRY(Fuzz<Name>), which defines LLVMFuzzerTestOneInput
// for the libFuzzer binary; the replay test (fuzz/replay_test.cc, built with
// LSPO_FUZZ_REPLAY defined) links every harness into one GoogleTest binary and feeds it the
// committed seeds and the crash inputs under fuzz/regressions/.
//
// LSPO_FUZZ_CHECK(cond) aborts with a message: the harnesses use it for the readers'
// documented invariants (e.g. Decode(Encode(s)) == s), so a broken invariant is a crash that
// libFuzzer saves like any other.
#ifndef LSPO_FUZZ_FUZZ_HARNESS_H_
#define LSPO_FUZZ_FUZZ_HARNESS_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace lspo::fuzz {

int FuzzGguf(const uint8_t* data, size_t size);
int FuzzSafetensors(const uint8_t* data, size_t size);
int FuzzTokenizerGguf(const uint8_t* data, size_t size);
int FuzzTokenizer(const uint8_t* data, size_t size);
int FuzzTokenizerHf(const uint8_t* data, size_t size);
int FuzzJobSpec(const uint8_t* data, size_t size);
int FuzzJinja(const uint8_t* data, size_t size);
int FuzzHfConfig(const uint8_t* data, size_t size);
int FuzzGenerationConfig(const uint8_t* data, size_t size);
int FuzzSafetensorsIndex(const uint8_t* data, size_t size);
int FuzzPeftConfig(const uint8_t* data, size_t size);
int FuzzDataRecords(const uint8_t* data, size_t size);
int FuzzJobStore(const uint8_t* data, size_t size);
int FuzzCheckpointManifest(const uint8_t* data, size_t size);
int FuzzTrainerState(const uint8_t* data, size_t size);

// Loads the vocabulary FuzzTokenizer encodes with (once; later calls do nothing): the GGUF
// named by $LSPO_FUZZ_VOCAB, else the real model models/SmolLM2-135M-Instruct.Q4_1.gguf,
// else the small vocabulary fuzz/corpus/tokenizer_gguf/smollm2_vocab_small.gguf (paths
// relative to the repository root, the working directory of scripts/fuzz and of CTest).
// Aborts if none loads.
void InitTokenizerFuzzer();

}  // namespace lspo::fuzz

#define LSPO_FUZZ_CHECK(cond)                                                        \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", __FILE__, __LINE__, \
                   #cond);                                                           \
      std::abort();                                                                  \
    }                                                                                \
  } while (0)

#ifdef LSPO_FUZZ_REPLAY
#define LSPO_FUZZ_ENTRY(fn)
#define LSPO_FUZZ_ENTRY_WITH_INIT(fn, init)
#else
#define LSPO_FUZZ_ENTRY(fn)                                                       \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {       \
    return ::lspo::fuzz::fn(data, size);                                          \
  }
#define LSPO_FUZZ_ENTRY_WITH_INIT(fn, init)                                       \
  extern "C" int LLVMFuzzerInitialize(int*, char***) {                            \
    ::lspo::fuzz::init();                                                         \
    return 0;                                                                     \
  }                                                                               \
  LSPO_FUZZ_ENTRY(fn)
#endif

#endif  // LSPO_FUZZ_FUZZ_HARNESS_H_
