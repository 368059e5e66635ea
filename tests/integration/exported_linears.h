// The trained matrices a job wrote to its output folder, for comparing jobs' weights.
// Header-only (LibTorch); in Bazel listed in the srcs of the tests that use it.
#ifndef LSPO_TESTS_INTEGRATION_EXPORTED_LINEARS_H_
#define LSPO_TESTS_INTEGRATION_EXPORTED_LINEARS_H_

#include <map>
#include <string>

#include "third_party/torch/torch_api.h"

#include "gtest/gtest.h"
#include "model/llama.h"
#include "model/safetensors.h"

namespace lspo::testing_jobs {

// Every linear of `dir`/model.safetensors as an fp32 (m, n) tensor by HF name, the names and
// shapes taken from `base`; a failed EXPECT names a missing file or tensor.
inline std::map<std::string, at::Tensor> ExportedLinears(const std::string& dir,
                                                         const model::LlamaModel& base) {
  std::map<std::string, at::Tensor> out;
  auto file = model::SafetensorsFile::Open(dir + "/model.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return out;
  for (int64_t i = 0; i < base.num_linears(); ++i) {
    const std::string name = base.LinearName(i);
    auto values = file->ReadF32(name);
    EXPECT_TRUE(values.ok()) << name;
    if (!values.ok()) continue;
    out[name] = torch::from_blob(values->data(), base.LinearWeight(i).sizes(), at::kFloat).clone();
  }
  return out;
}

}  // namespace lspo::testing_jobs

#endif  // LSPO_TESTS_INTEGRATION_EXPORTED_LINEARS_H_
