#include "runtime/cpu_blas.h"

#include <dlfcn.h>

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

// Referenced by the linker flag --undefined=lspo_cpu_blas_anchor (CMake's lspo_use_torch), so
// that this object, and the constructor below, are linked into every LibTorch binary.
extern "C" {
int lspo_cpu_blas_anchor = 0;
}

namespace lspo::runtime {
namespace {

struct CoreEntry {
  const char* name;
  SimdLevel level;
  bool amd_only;
};

// OpenBLAS 0.3.x's x86-64 core names (driver/others/dynamic.c, corename[]; SapphireRapids
// from 0.3.22) and what their kernels need.
constexpr CoreEntry kCores[] = {
    {"Katmai", SimdLevel::kSse, false},        {"Coppermine", SimdLevel::kSse, false},
    {"Northwood", SimdLevel::kSse, false},     {"Prescott", SimdLevel::kSse, false},
    {"Banias", SimdLevel::kSse, false},        {"Atom", SimdLevel::kSse, false},
    {"Core2", SimdLevel::kSse, false},         {"Penryn", SimdLevel::kSse, false},
    {"Dunnington", SimdLevel::kSse, false},    {"Nehalem", SimdLevel::kSse, false},
    {"Athlon", SimdLevel::kSse, true},         {"Opteron", SimdLevel::kSse, true},
    {"Opteron_SSE3", SimdLevel::kSse, true},   {"Barcelona", SimdLevel::kSse, true},
    {"Nano", SimdLevel::kSse, false},          {"Sandybridge", SimdLevel::kAvx, false},
    {"Bobcat", SimdLevel::kSse, true},         {"Bulldozer", SimdLevel::kAvx, true},
    {"Piledriver", SimdLevel::kAvx, true},     {"Haswell", SimdLevel::kAvx2, false},
    {"Steamroller", SimdLevel::kAvx, true},    {"Excavator", SimdLevel::kAvx2, true},
    {"Zen", SimdLevel::kAvx2, false},          {"SkylakeX", SimdLevel::kAvx512, false},
    {"Cooperlake", SimdLevel::kAvx512, false}, {"SapphireRapids", SimdLevel::kAvx512, false},
};

const CoreEntry* FindCore(absl::string_view name) {
  for (const CoreEntry& c : kCores) {
    if (absl::EqualsIgnoreCase(name, c.name)) return &c;
  }
  return nullptr;
}

bool Runs(const CoreEntry& core, SimdLevel cpu, bool cpu_is_amd) {
  return core.level <= cpu && (!core.amd_only || cpu_is_amd);
}

// OpenBLAS's entry points, looked up in the process (nullptr when absent).
template <typename Fn>
Fn Symbol(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

std::string OpenBlasCoreName() {
  auto corename = Symbol<char* (*)()>("openblas_get_corename");
  if (corename == nullptr) return "";
  const char* s = corename();
  return s == nullptr ? "" : s;
}

// Asks OpenBLAS to re-run its start-up choice with OPENBLAS_CORETYPE=core, restoring the
// variable (or its absence) after. False when the entry points are missing.
bool ForceOpenBlasCore(const std::string& core) {
  auto quit = Symbol<void (*)()>("gotoblas_dynamic_quit");
  auto init = Symbol<void (*)()>("gotoblas_dynamic_init");
  if (quit == nullptr || init == nullptr) return false;
  const char* old = std::getenv("OPENBLAS_CORETYPE");
  const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
  setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  quit();
  init();
  if (saved) {
    setenv("OPENBLAS_CORETYPE", saved->c_str(), 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
  return true;
}

CpuBlasInfo Select() {
  CpuBlasInfo info;
  info.cpu = DetectCpuSimdLevel();
  const bool amd = CpuIsAmd();
  if (void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_"); sgemm != nullptr) {
    Dl_info dl{};
    if (dladdr(sgemm, &dl) != 0 && dl.dli_fname != nullptr) info.provider = dl.dli_fname;
  }
  auto config = Symbol<char* (*)()>("openblas_get_config");
  info.is_openblas = config != nullptr;
  if (!info.is_openblas) {
    info.library = info.provider.empty() ? "no sgemm_ found" : info.provider;
    // Debian's reference BLAS lives in .../blas/libblas.so.3 (the alternatives' netlib entry).
    if (absl::StrContains(info.provider, "/blas/libblas.so")) {
      info.warning = absl::StrCat(
          "sgemm_ comes from the reference BLAS ", info.provider,
          " (unoptimised, 10-50x slower): install libopenblas0-pthread (scripts/setup does) or "
          "point libblas.so.3 at it: update-alternatives --config libblas.so.3-x86_64-linux-gnu");
    }
    return info;
  }
  // Our constructor may run before OpenBLAS's own (gotoblas_init): with dynamically linked
  // libraries that do not depend on each other (Bazel's tests) the loader's order is not
  // ours to choose. Its core is then not chosen yet ("Unknown"); gotoblas_dynamic_init makes
  // the choice now, and does nothing when OpenBLAS's constructor calls it again later.
  if (const std::string now = OpenBlasCoreName(); now.empty() || now == "Unknown") {
    if (auto init = Symbol<void (*)()>("gotoblas_dynamic_init"); init != nullptr) init();
  }
  info.detected = OpenBlasCoreName();
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const std::optional<std::string> user = env ? std::optional<std::string>(env) : std::nullopt;
  const char* automatic = std::getenv("LSPO_CPU_BLAS_AUTO");
  CoreChoice choice;
  if (automatic != nullptr && std::string(automatic) == "0") {
    choice.reason = "OpenBLAS (LSPO_CPU_BLAS_AUTO=0)";
  } else {
    choice = ChooseOpenBlasCore(info.detected, user, info.cpu, amd);
  }
  info.chosen_by = choice.reason;
  info.warning = choice.warning;
  if (!choice.core.empty()) {
    if (!ForceOpenBlasCore(choice.core)) {
      info.warning = absl::StrCat(
          "this OpenBLAS has no gotoblas_dynamic_init (not a DYNAMIC_ARCH build), so its ",
          info.detected, " kernels stay; set OPENBLAS_CORETYPE=", choice.core,
          " or install Debian's libopenblas0-pthread");
      info.chosen_by = "OpenBLAS";
    }
  }
  info.kernels = OpenBlasCoreName();
  if (!choice.core.empty() && !absl::EqualsIgnoreCase(info.kernels, choice.core) &&
      info.warning.empty()) {
    info.warning =
        absl::StrCat("OpenBLAS was asked for its ", choice.core, " kernels and runs ", info.kernels,
                     "; set OPENBLAS_CORETYPE=", choice.core, " or report the OpenBLAS version");
  }
  if (info.warning.empty()) {
    const CoreEntry* in_use = FindCore(info.kernels);
    // A generic (SSE or AVX) kernel set where AVX2 + FMA is there: 4-7x slower fp32 GEMMs.
    if (in_use != nullptr && in_use->level < SimdLevel::kAvx2 && info.cpu >= SimdLevel::kAvx2) {
      info.warning = absl::StrCat("OpenBLAS runs its ", info.kernels, " kernels (",
                                  SimdLevelName(in_use->level), ") on an ", SimdLevelName(info.cpu),
                                  " CPU, several times slower than it could: unset "
                                  "OPENBLAS_CORETYPE and LSPO_CPU_BLAS_AUTO, or set "
                                  "OPENBLAS_CORETYPE=",
                                  OpenBlasCoreFor(info.cpu));
    }
  }
  const char* cfg = config();
  info.library = cfg == nullptr ? "OpenBLAS" : cfg;
  if (auto threads = Symbol<int (*)()>("openblas_get_num_threads"); threads != nullptr) {
    info.threads = threads();
  }
  return info;
}

// Runs the choice at load time, after the shared libraries' constructors (OpenBLAS's
// gotoblas_init among them) and before main() or any thread of this program.
__attribute__((constructor)) void SelectAtLoad() { SelectCpuBlasKernels(); }

}  // namespace

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kSse:
      return "SSE";
    case SimdLevel::kAvx:
      return "AVX";
    case SimdLevel::kAvx2:
      return "AVX2";
    case SimdLevel::kAvx512:
      return "AVX-512";
  }
  return "?";
}

SimdLevel DetectCpuSimdLevel() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq")) {
    return SimdLevel::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
  if (__builtin_cpu_supports("avx")) return SimdLevel::kAvx;
#endif
  return SimdLevel::kSse;
}

bool CpuIsAmd() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

std::optional<SimdLevel> OpenBlasCoreLevel(absl::string_view core) {
  const CoreEntry* c = FindCore(core);
  if (c == nullptr) return std::nullopt;
  return c->level;
}

bool OpenBlasCoreIsAmdOnly(absl::string_view core) {
  const CoreEntry* c = FindCore(core);
  return c != nullptr && c->amd_only;
}

const char* OpenBlasCoreFor(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return "SkylakeX";
    case SimdLevel::kAvx2:
      return "Haswell";
    case SimdLevel::kAvx:
      return "Sandybridge";
    case SimdLevel::kSse:
      return "";
  }
  return "";
}

CoreChoice ChooseOpenBlasCore(absl::string_view detected,
                              const std::optional<std::string>& user_coretype, SimdLevel cpu,
                              bool cpu_is_amd) {
  CoreChoice out;
  const std::string best = OpenBlasCoreFor(cpu);
  if (user_coretype.has_value()) {
    const std::string& u = *user_coretype;
    const CoreEntry* wanted = FindCore(u);
    if (wanted == nullptr) {
      out.reason = "OpenBLAS (OPENBLAS_CORETYPE not recognised)";
      out.warning =
          absl::StrCat("OPENBLAS_CORETYPE=", u, " is not a core OpenBLAS knows, so it chose ",
                       detected, " by itself; unset OPENBLAS_CORETYPE or give one such as ",
                       best.empty() ? "Nehalem" : best);
      return out;
    }
    if (Runs(*wanted, cpu, cpu_is_amd)) {
      out.reason = "OPENBLAS_CORETYPE";
      return out;
    }
    out.core = best;  // may be empty on an SSE-only CPU: then OpenBLAS's detection stands
    out.reason = absl::StrCat("lsp-offload (OPENBLAS_CORETYPE=", u, " is not for this CPU)");
    out.warning = absl::StrCat(
        "OPENBLAS_CORETYPE=", u, " names kernels for ", SimdLevelName(wanted->level),
        wanted->amd_only ? " on AMD CPUs" : "", ", which this ", SimdLevelName(cpu),
        cpu_is_amd ? " AMD" : "", " CPU cannot run (the first GEMM would die of SIGILL); using ",
        best.empty() ? std::string(detected) : best, " instead: unset OPENBLAS_CORETYPE",
        best.empty() ? "" : absl::StrCat(" or set it to ", best));
    return out;
  }
  const CoreEntry* have = FindCore(detected);
  if (have == nullptr) {
    out.reason = "OpenBLAS";  // a core this table does not know (a newer OpenBLAS): trust it
    return out;
  }
  if (have->level < cpu && !best.empty()) {
    out.core = best;
    out.reason = absl::StrCat("lsp-offload: OpenBLAS's detection gave ", detected, " for this ",
                              SimdLevelName(cpu), " CPU");
    return out;
  }
  out.reason = "OpenBLAS";
  return out;
}

const CpuBlasInfo& SelectCpuBlasKernels() {
  static const CpuBlasInfo* info = new CpuBlasInfo(Select());
  return *info;
}

std::string CpuBlasInfo::Line() const {
  std::string s = library;
  if (is_openblas) {
    absl::StrAppend(&s, ", ", threads, " thread", threads == 1 ? "" : "s", "; kernels ", kernels,
                    " on an ", SimdLevelName(cpu), " CPU (chosen by ", chosen_by, ")");
  } else {
    absl::StrAppend(&s, " (not OpenBLAS; an ", SimdLevelName(cpu), " CPU)");
  }
  if (!warning.empty()) absl::StrAppend(&s, " WARNING: ", warning);
  return s;
}

}  // namespace lspo::runtime
