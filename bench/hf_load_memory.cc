// Peak resident memory of loading an HF bf16 checkpoint (LlamaModel::FromHfCheckpoint) against
// the size of the fp32 weights it produces. Not a Google Benchmark: a measurement tool whose
// result is a ratio measured in one run (docs/models.md, docs/bench.md).
//
//   bench/hf_load_memory                 writes a SmolLM2-135M-shaped random model as bf16
//                                        shards (max 100 MB each) to a temporary folder, then
//                                        re-executes itself with --load=FOLDER
//   bench/hf_load_memory --load=FOLDER   loads FOLDER and prints one JSON line:
//     {"folder", "file_bytes", "weights_bytes" (fp32 numel * 4), "rss_before_bytes",
//      "peak_rss_bytes" (VmHWM after the load), "peak_over_weights" = (peak - before) /
//      weights_bytes, "seconds"}
// Run from the repository root after scripts/build.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "model/hf_checkpoint.h"
#include "model/llama.h"
#include "model/safetensors.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, load, "", "HF model folder to load and measure");
ABSL_FLAG(bool, keep, false, "keep the generated folder");

namespace {

// A /proc/self/status field in bytes (VmRSS, VmHWM).
int64_t StatusBytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  }
  return -1;
}

int Load(const std::string& dir) {
  const int64_t before = StatusBytes("VmRSS");
  auto t0 = std::chrono::steady_clock::now();
  auto ckpt = lspo::model::HfCheckpoint::Open(dir);
  if (!ckpt.ok()) {
    std::fprintf(stderr, "%s\n", ckpt.status().ToString().c_str());
    return 1;
  }
  auto model = lspo::model::LlamaModel::FromHfCheckpoint(*ckpt);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t peak = StatusBytes("VmHWM");
  int64_t weights = 0;
  for (const auto& [name, t] : model->NamedTensors()) weights += t.numel() * 4;
  int64_t file_bytes = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") file_bytes += e.file_size();
  }
  nlohmann::json j = {{"folder", dir},
                      {"file_bytes", file_bytes},
                      {"weights_bytes", weights},
                      {"rss_before_bytes", before},
                      {"peak_rss_bytes", peak},
                      {"peak_over_weights", static_cast<double>(peak - before) / weights},
                      {"seconds", seconds}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

// Writes a bf16 SmolLM2-135M-shaped random model as shards of at most `shard_bytes`.
int Write(const std::string& dir, int64_t shard_bytes) {
  lspo::model::LlamaConfig c = lspo::model::TinyLlamaConfig(49152);
  c.hidden_size = 576;
  c.intermediate_size = 1536;
  c.num_layers = 30;
  c.num_heads = 9;
  c.num_kv_heads = 3;
  c.head_dim = 64;
  c.max_position_embeddings = 8192;
  auto model = lspo::model::LlamaModel::RandomInit(c, 1);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (auto& [name, t] : model->NamedTensors()) tensors.emplace_back(name, t.to(at::kBFloat16));
  nlohmann::json weight_map = nlohmann::json::object();
  std::vector<std::vector<size_t>> shards(1);
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t n = tensors[i].second.numel() * 2;
    if (bytes > 0 && bytes + n > shard_bytes) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(i);
    bytes += n;
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    std::vector<lspo::model::SafetensorsEntry> entries;
    for (size_t i : shards[s]) {
      const at::Tensor& t = tensors[i].second;
      entries.push_back({tensors[i].first, "BF16", t.sizes().vec(), t.data_ptr(),
                         static_cast<size_t>(t.numel() * 2)});
      weight_map[tensors[i].first] = name;
    }
    absl::Status st = lspo::model::WriteSafetensors(dir + "/" + name, entries, {});
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  std::ofstream(dir + "/model.safetensors.index.json")
      << nlohmann::json{{"metadata", nlohmann::json::object()}, {"weight_map", weight_map}}.dump();
  std::ofstream(dir + "/config.json") << c.ToHfConfigJson("bfloat16").dump(2);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_load).empty()) return Load(absl::GetFlag(FLAGS_load));
  const std::string dir = "/tmp/hf_load_memory_" + std::to_string(::getpid());
  if (int rc = Write(dir, 100'000'000); rc != 0) return rc;
  // A fresh process, so that the writer's memory is not in the measurement.
  const std::string cmd = std::filesystem::read_symlink("/proc/self/exe").string() + " --load=" + dir;
  std::fflush(stdout);
  const int rc = std::system(cmd.c_str());
  if (!absl::GetFlag(FLAGS_keep)) std::filesystem::remove_all(dir);
  return rc == 0 ? 0 : 1;
}
