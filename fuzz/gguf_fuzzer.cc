// Fuzzes the GGUF reader (model/gguf.h) over in-memory bytes: GgufFile::FromBytes, then every
// typed getter on every key (the right type and the wrong ones), and every tensor's data,
// whole (when small) and as row ranges, dequantised to f32.
#include <algorithm>
#include <vector>

#include "fuzz/fuzz_harness.h"
#include "model/gguf.h"

namespace lspo::fuzz {

int FuzzGguf(const uint8_t* data, size_t size) {
  // An exact-size copy: a read past the end is a heap overflow ASan reports.
  auto file = model::GgufFile::FromBytes(std::vector<uint8_t>(data, data + size), "<fuzz>");
  if (!file.ok()) return 0;
  LSPO_FUZZ_CHECK(file->version() == 2 || file->version() == 3);
  LSPO_FUZZ_CHECK(file->alignment() != 0 && (file->alignment() & (file->alignment() - 1)) == 0);
  // The data section may start past the end only in a file without tensors (the padding
  // after the last info is then optional).
  LSPO_FUZZ_CHECK(file->tensors().empty() || file->data_start() <= size);
  for (const std::string& key : file->keys()) {
    const model::GgufValue* v = file->FindKey(key);
    LSPO_FUZZ_CHECK(v != nullptr);
    (void)v->size();
    (void)model::GgufValueTypeName(v->elem_type());
    (void)file->GetInt(key);
    (void)file->GetFloat(key);
    (void)file->GetString(key);
    (void)file->GetBool(key);
    (void)file->GetStringArray(key);
    (void)file->GetIntArray(key);
    (void)file->GetFloatArray(key);
  }
  for (const model::GgufTensorInfo& t : file->tensors()) {
    LSPO_FUZZ_CHECK(file->FindTensor(t.name) != nullptr);
    const auto bytes = file->TensorData(t);
    LSPO_FUZZ_CHECK(bytes.size() == t.nbytes);
    LSPO_FUZZ_CHECK(file->data_start() + t.offset + t.nbytes <= size);
    (void)t.TorchShape();
    const int64_t numel = t.numel();
    const int64_t rows = t.num_rows();
    // Dequantising is bounded by the element count, not the bytes (a zero-size row
    // type could ask for a huge output): skip tensors whose f32 copy would exceed 4 MiB.
    if (numel <= (int64_t{1} << 20)) {
      auto all = file->ReadTensorF32(t.name);
      if (all.ok()) LSPO_FUZZ_CHECK(static_cast<int64_t>(all->size()) == numel);
    }
    if (t.row_length() <= (int64_t{1} << 20)) {
      auto first = file->ReadRowsF32(t.name, 0, std::min<int64_t>(rows, 2));
      if (first.ok()) {
        LSPO_FUZZ_CHECK(static_cast<int64_t>(first->size()) ==
                        std::min<int64_t>(rows, 2) * t.row_length());
      }
      (void)file->ReadRowsF32(t.name, rows, 1);   // one past the end: kOutOfRange
      (void)file->ReadRowsF32(t.name, -1, 1);     // negative start: kOutOfRange
    }
  }
  (void)file->FindTensor("");
  (void)file->FindKey("general.architecture");
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzGguf)
