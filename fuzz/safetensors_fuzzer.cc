// Fuzzes the safetensors reader (model/safetensors.h) over in-memory bytes:
// SafetensorsFile::FromBytes, then every tensor's shape, dtype, raw bytes and f32 copy.
#include <vector>

#include "fuzz/fuzz_harness.h"
#include "model/safetensors.h"

namespace lspo::fuzz {

int FuzzSafetensors(const uint8_t* data, size_t size) {
  auto file =
      model::SafetensorsFile::FromBytes(std::vector<uint8_t>(data, data + size), "<fuzz>");
  if (!file.ok()) return 0;
  (void)file->metadata();
  for (const std::string& name : file->names()) {
    const model::SafetensorsTensorInfo* info = file->Find(name);
    LSPO_FUZZ_CHECK(info != nullptr);
    LSPO_FUZZ_CHECK(info->begin <= info->end && info->end <= size);
    const int64_t elem = model::SafetensorsDtypeSize(info->dtype);
    LSPO_FUZZ_CHECK(elem > 0);
    LSPO_FUZZ_CHECK(static_cast<uint64_t>(info->numel()) * static_cast<uint64_t>(elem) ==
                    info->end - info->begin);
    LSPO_FUZZ_CHECK(file->shape(name).ok());
    LSPO_FUZZ_CHECK(file->dtype(name).ok());
    auto raw = file->RawData(name);
    LSPO_FUZZ_CHECK(raw.ok() && raw->size() == info->end - info->begin);
    auto f32 = file->ReadF32(name);
    if (f32.ok()) LSPO_FUZZ_CHECK(static_cast<int64_t>(f32->size()) == info->numel());
  }
  (void)file->Find("__metadata__");
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzSafetensors)
