// runtime/cpu_blas: the kernel set chosen for OpenBLAS, the choice's rules, and that GEMMs
// stay correct (against float64) whatever set runs, including with OPENBLAS_CORETYPE values a
// user might set (a child process of this binary, since OpenBLAS reads it at load time).
#include "runtime/cpu_blas.h"

#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "third_party/torch/torch_api.h"

namespace lspo::runtime {
namespace {

using ::testing::HasSubstr;

TEST(CpuBlasTableTest, CoreLevelsFollowTheirKernels) {
  EXPECT_EQ(OpenBlasCoreLevel("Prescott"), SimdLevel::kSse);
  EXPECT_EQ(OpenBlasCoreLevel("Nehalem"), SimdLevel::kSse);
  EXPECT_EQ(OpenBlasCoreLevel("Sandybridge"), SimdLevel::kAvx);
  EXPECT_EQ(OpenBlasCoreLevel("haswell"), SimdLevel::kAvx2);  // OpenBLAS compares ignoring case
  EXPECT_EQ(OpenBlasCoreLevel("Zen"), SimdLevel::kAvx2);
  EXPECT_EQ(OpenBlasCoreLevel("SKYLAKEX"), SimdLevel::kAvx512);
  EXPECT_EQ(OpenBlasCoreLevel("Cooperlake"), SimdLevel::kAvx512);
  EXPECT_EQ(OpenBlasCoreLevel("Pentium9"), std::nullopt);
  EXPECT_EQ(OpenBlasCoreLevel(""), std::nullopt);
  EXPECT_TRUE(OpenBlasCoreIsAmdOnly("Bulldozer"));
  EXPECT_TRUE(OpenBlasCoreIsAmdOnly("barcelona"));
  EXPECT_FALSE(OpenBlasCoreIsAmdOnly("Zen"));
  EXPECT_FALSE(OpenBlasCoreIsAmdOnly("Haswell"));
  EXPECT_STREQ(OpenBlasCoreFor(SimdLevel::kAvx512), "SkylakeX");
  EXPECT_STREQ(OpenBlasCoreFor(SimdLevel::kAvx2), "Haswell");
  EXPECT_STREQ(OpenBlasCoreFor(SimdLevel::kAvx), "Sandybridge");
  EXPECT_STREQ(OpenBlasCoreFor(SimdLevel::kSse), "");
}

TEST(CpuBlasChoiceTest, AGenericDetectionIsRaisedToTheCpusLevel) {
  // The case of this project's machine: OpenBLAS 0.3.21 on family 6 model 207.
  CoreChoice c = ChooseOpenBlasCore("Prescott", std::nullopt, SimdLevel::kAvx512, false);
  EXPECT_EQ(c.core, "SkylakeX");
  EXPECT_THAT(c.reason, HasSubstr("Prescott"));
  EXPECT_EQ(c.warning, "");
  EXPECT_EQ(ChooseOpenBlasCore("Nehalem", std::nullopt, SimdLevel::kAvx2, false).core,
            "Haswell");
  EXPECT_EQ(ChooseOpenBlasCore("Prescott", std::nullopt, SimdLevel::kAvx, true).core,
            "Sandybridge");
}

TEST(CpuBlasChoiceTest, AGoodDetectionOrAnSseCpuIsLeftAlone) {
  for (auto [core, cpu, amd] : {std::tuple{"SkylakeX", SimdLevel::kAvx512, false},
                                {"Cooperlake", SimdLevel::kAvx512, false},
                                {"Haswell", SimdLevel::kAvx2, false},
                                {"Zen", SimdLevel::kAvx2, true},
                                {"Prescott", SimdLevel::kSse, false},
                                {"SapphireRapids", SimdLevel::kAvx512, false},
                                {"SomeFutureCore", SimdLevel::kAvx512, false}}) {
    CoreChoice c = ChooseOpenBlasCore(core, std::nullopt, cpu, amd);
    EXPECT_EQ(c.core, "") << core;
    EXPECT_EQ(c.reason, "OpenBLAS") << core;
    EXPECT_EQ(c.warning, "") << core;
  }
}

TEST(CpuBlasChoiceTest, AUsersCoreThatTheCpuRunsIsRespected) {
  CoreChoice c = ChooseOpenBlasCore("Prescott", std::string("Prescott"), SimdLevel::kAvx512, false);
  EXPECT_EQ(c.core, "");
  EXPECT_EQ(c.reason, "OPENBLAS_CORETYPE");
  c = ChooseOpenBlasCore("Haswell", std::string("haswell"), SimdLevel::kAvx512, false);
  EXPECT_EQ(c.core, "");
  c = ChooseOpenBlasCore("Bulldozer", std::string("Bulldozer"), SimdLevel::kAvx2, true);
  EXPECT_EQ(c.core, "");  // an AMD CPU with AVX runs the Bulldozer kernels
}

TEST(CpuBlasChoiceTest, AUsersCoreTheCpuLacksIsReplacedWithAWarning) {
  CoreChoice c = ChooseOpenBlasCore("SkylakeX", std::string("SkylakeX"), SimdLevel::kAvx2, false);
  EXPECT_EQ(c.core, "Haswell");
  EXPECT_THAT(c.warning, HasSubstr("OPENBLAS_CORETYPE=SkylakeX"));
  EXPECT_THAT(c.warning, HasSubstr("AVX-512"));
  EXPECT_THAT(c.warning, HasSubstr("unset OPENBLAS_CORETYPE or set it to Haswell"));
  c = ChooseOpenBlasCore("Bulldozer", std::string("Bulldozer"), SimdLevel::kAvx512, false);
  EXPECT_EQ(c.core, "SkylakeX");
  EXPECT_THAT(c.warning, HasSubstr("on AMD CPUs"));
  // An SSE-only CPU forced to Haswell: nothing better to ask for, OpenBLAS's detection stands.
  c = ChooseOpenBlasCore("Nehalem", std::string("Haswell"), SimdLevel::kSse, false);
  EXPECT_EQ(c.core, "");
  EXPECT_THAT(c.warning, HasSubstr("using Nehalem instead: unset OPENBLAS_CORETYPE"));
}

TEST(CpuBlasChoiceTest, AnUnknownUserCoreIsNamed) {
  CoreChoice c = ChooseOpenBlasCore("Cooperlake", std::string("Skylake-X"), SimdLevel::kAvx512,
                                    false);
  EXPECT_EQ(c.core, "");
  EXPECT_THAT(c.warning, HasSubstr("OPENBLAS_CORETYPE=Skylake-X is not a core OpenBLAS knows"));
  EXPECT_THAT(c.warning, HasSubstr("SkylakeX"));
}

// C = A B in fp32 through LibTorch's BLAS against the float64 product: the relative error of
// an fp32 dot product of length k is at most ~k * 2^-24 (Higham, "Accuracy and Stability of
// Numerical Algorithms", 2nd ed., eq. 3.5); 1e-4 is that bound for k = 512 with room.
void ExpectGemmMatchesFloat64() {
  torch::manual_seed(7);
  const auto a = torch::randn({96, 512});
  const auto b = torch::randn({512, 80});
  const auto c = torch::mm(a, b);
  const auto ref = torch::mm(a.to(torch::kFloat64), b.to(torch::kFloat64));
  const double err = ((c.to(torch::kFloat64) - ref).abs().max() / ref.abs().max()).item<double>();
  EXPECT_LT(err, 1e-4);
  EXPECT_GT(ref.abs().max().item<double>(), 10.0);  // a real product, not zeros
}

TEST(CpuBlasProcessTest, ThisProcessRunsTheCpusKernelSet) {
  const CpuBlasInfo& info = CpuBlas();
  std::printf("CPU BLAS: %s\n", info.Line().c_str());
  ExpectGemmMatchesFloat64();
  if (!info.is_openblas) GTEST_SKIP() << "not OpenBLAS: " << info.library;
  const auto in_use = OpenBlasCoreLevel(info.kernels);
  ASSERT_TRUE(in_use.has_value()) << info.kernels;
  EXPECT_LE(*in_use, info.cpu) << info.Line();
  if (std::getenv("OPENBLAS_CORETYPE") == nullptr && std::getenv("LSPO_CPU_BLAS_AUTO") == nullptr &&
      OpenBlasCoreLevel(info.detected).has_value()) {
    // The kernels use what the CPU has (OpenBLAS's choice, if it was already that good).
    EXPECT_EQ(*in_use, info.cpu) << info.Line();
    EXPECT_EQ(info.warning, "") << info.Line();
  }
  EXPECT_GE(info.threads, 1);
  EXPECT_THAT(info.library, HasSubstr("OpenBLAS"));
}

// Runs this binary's ThisProcessRunsTheCpusKernelSet with `env` prepended; returns its output.
std::string RunChild(const std::string& env) {
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  exe[n] = '\0';
  const std::string cmd = env + " '" + exe +
                          "' --gtest_filter=CpuBlasProcessTest.ThisProcessRunsTheCpusKernelSet "
                          "2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  std::string out;
  std::array<char, 4096> buf;
  while (p && fgets(buf.data(), buf.size(), p.get()) != nullptr) out += buf.data();
  return out;
}

TEST(CpuBlasProcessTest, UsersSettingsGiveCorrectRunsAndNamedWarnings) {
  if (!CpuBlas().is_openblas) GTEST_SKIP() << "not OpenBLAS";
  const SimdLevel cpu = CpuBlas().cpu;
  // A core for AMD's Bulldozer on an Intel CPU (or any CPU without AVX): replaced, warned.
  if (!CpuIsAmd() || cpu < SimdLevel::kAvx) {
    const std::string out = RunChild("OPENBLAS_CORETYPE=Bulldozer");
    EXPECT_THAT(out, HasSubstr("[  PASSED  ] 1 test")) << out;
    EXPECT_THAT(out, HasSubstr("WARNING: OPENBLAS_CORETYPE=Bulldozer names kernels")) << out;
  }
  // The generic kernels, forced: respected, and warned about on an AVX2-or-better CPU.
  std::string out = RunChild("OPENBLAS_CORETYPE=Prescott");
  EXPECT_THAT(out, HasSubstr("[  PASSED  ] 1 test")) << out;
  EXPECT_THAT(out, HasSubstr("kernels Prescott")) << out;
  if (cpu >= SimdLevel::kAvx2) {
    EXPECT_THAT(out, HasSubstr("WARNING: OpenBLAS runs its Prescott kernels (SSE)")) << out;
  }
  // Switched off: OpenBLAS's own choice stays.
  out = RunChild("LSPO_CPU_BLAS_AUTO=0");
  EXPECT_THAT(out, HasSubstr("[  PASSED  ] 1 test")) << out;
  EXPECT_THAT(out, HasSubstr("chosen by OpenBLAS (LSPO_CPU_BLAS_AUTO=0)")) << out;
  // A name OpenBLAS does not know.
  out = RunChild("OPENBLAS_CORETYPE=Skylake-X");
  EXPECT_THAT(out, HasSubstr("[  PASSED  ] 1 test")) << out;
  EXPECT_THAT(out, HasSubstr("OPENBLAS_CORETYPE=Skylake-X is not a core OpenBLAS knows")) << out;
}

}  // namespace
}  // namespace lspo::runtime
