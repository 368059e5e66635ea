// Data parallelism on CUDA workers (issue 17, docs/distributed.md): two ranks share the one
// GPU of the host (each rank a worker, an optimizer and a scheduler embedded in a thread of this
// process) and sum over Gloo through host memory, as two hosts with a GPU each would. The same
// check as data_parallel_test's on the CPU: two ranks at micro-batch 2 train as one rank at 4
// (fp32 weights), under both schedules, the two schedules' weights bitwise equal. Without a
// device every test skips.
#include "third_party/torch/torch_api.h"

#include "gtest/gtest.h"
#include "offload/collective.h"
#include "tests/integration/data_parallel_jobs.h"
#include "tests/integration/test_jobs.h"

namespace lspo {
namespace {

TEST(DataParallelCudaTest, LspTwoRanksOnOneGpuMatchOneRankUnderBothSchedules) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  testing_jobs::ExpectBothSchedulesMatchOne(v1::MODE_LSP, 1e-5, v1::DEVICE_CUDA);
}

TEST(DataParallelCudaTest, ZeroTwoRanksOnOneGpuMatchOneRankUnderBothSchedules) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  testing_jobs::ExpectBothSchedulesMatchOne(v1::MODE_ZERO, /*same_batches_bound=*/0,
                                            v1::DEVICE_CUDA);
}

TEST(DataParallelCudaTest, NativeTwoRanksOnOneGpuMatchOneRank) {
  if (!testing_jobs::HaveTinyAssets()) GTEST_SKIP() << testing_jobs::kNoModel;
  if (!offload::CollectivesAvailable()) GTEST_SKIP() << "built without c10d Gloo";
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  testing_jobs::ExpectTwoRanksMatchOne(v1::MODE_NATIVE, 1e-5, v1::STEP_SCHEDULE_OVERLAP,
                                       v1::DEVICE_CUDA);
}

}  // namespace
}  // namespace lspo
