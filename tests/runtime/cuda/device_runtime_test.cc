// lsp/cuda/device_runtime: without a device (this project's CI) every call must fail with a
// clear status and never crash; with a device, pinned round trips through the two kinds of
// stream must return exactly the random bytes sent, and events must time them.
#include "runtime/cuda/device_runtime.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#if LSPO_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace lspo::runtime::cuda {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

TEST(DeviceRuntimeTest, WithoutADeviceEveryCallFailsWithAClearStatus) {
  if (DeviceCount() > 0) GTEST_SKIP() << "a CUDA device is visible: covered by the tests below";
  auto stream = Stream::CreateNonBlocking();
  ASSERT_FALSE(stream.ok());
  EXPECT_THAT(stream.status().message(),
              AnyOf(HasSubstr("cudaStreamCreateWithFlags"), HasSubstr("no CUDA support")));
  EXPECT_FALSE(Event::Create().ok());
  std::vector<float> host(1024, 1.f);
  auto pinned = HostRegistration::Register(host.data(), host.size() * sizeof(float));
  ASSERT_FALSE(pinned.ok());
  EXPECT_THAT(pinned.status().message(),
              AnyOf(HasSubstr("cudaHostRegister"), HasSubstr("no CUDA support")));
  EXPECT_EQ(HostRegistration::Register(nullptr, 16).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(GetMemoryInfo().ok());
  EXPECT_FALSE(DeviceDescription(0).ok());
  EXPECT_FALSE(CopyAsync(host.data(), host.data() + 512, 16, DefaultStream()).ok());
}

#if LSPO_HAS_CUDA
TEST(DeviceRuntimeTest, PinnedRoundTripOnNonBlockingStreamsIsExactAndTimed) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device: compiled, not run";
  auto desc = DeviceDescription(0);
  ASSERT_TRUE(desc.ok()) << desc.status();
  std::printf("device: %s\n", desc->c_str());
  constexpr size_t kN = (32u << 20) / sizeof(float);  // 32 MiB
  std::vector<float> src(kN), dst(kN, std::nanf(""));  // Poisoned destination.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  for (auto& v : src) v = nd(rng);
  auto pin_src = HostRegistration::Register(src.data(), kN * sizeof(float));
  auto pin_dst = HostRegistration::Register(dst.data(), kN * sizeof(float));
  ASSERT_TRUE(pin_src.ok()) << pin_src.status();
  ASSERT_TRUE(pin_dst.ok()) << pin_dst.status();
  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemset(dev, 0xff, kN * sizeof(float)), cudaSuccess);  // NaN pattern.
  auto up = Stream::CreateNonBlocking();
  auto down = Stream::CreateNonBlocking();
  ASSERT_TRUE(up.ok() && down.ok());
  auto e0 = Event::Create(), e1 = Event::Create(), e2 = Event::Create();
  ASSERT_TRUE(e0.ok() && e1.ok() && e2.ok());
  ASSERT_TRUE(e0->Record(up->get()).ok());
  ASSERT_TRUE(CopyAsync(dev, src.data(), kN * sizeof(float), up->get()).ok());
  ASSERT_TRUE(e1->Record(up->get()).ok());
  // The download stream is ordered after the upload by the event only.
  ASSERT_TRUE(StreamWaitEvent(down->get(), *e1).ok());
  ASSERT_TRUE(CopyAsync(dst.data(), dev, kN * sizeof(float), down->get()).ok());
  ASSERT_TRUE(e2->Record(down->get()).ok());
  ASSERT_TRUE(e2->Synchronize().ok());
  auto done = e2->Done();
  ASSERT_TRUE(done.ok() && *done);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), kN * sizeof(float)), 0);
  auto h2d = e1->SecondsSince(*e0), d2h = e2->SecondsSince(*e1);
  ASSERT_TRUE(h2d.ok() && d2h.ok());
  EXPECT_GT(*h2d, 0.0);
  EXPECT_GT(*d2h, 0.0);
  std::printf("pinned 32 MiB: H2D %.1f GB/s, D2H %.1f GB/s\n", kN * 4 / *h2d / 1e9,
              kN * 4 / *d2h / 1e9);
  auto mem = GetMemoryInfo();
  ASSERT_TRUE(mem.ok());
  EXPECT_GE(mem->used_bytes(), kN * sizeof(float));
  cudaFree(dev);
}
#endif

}  // namespace
}  // namespace lspo::runtime::cuda
