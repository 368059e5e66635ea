// Fuzzes Encode / Decode / PreTokenize (text/tokenizer.h) on a real vocabulary (SmolLM2, see
// InitTokenizerFuzzer in fuzz_harness.h). The input is text (any bytes). Checked:
//   - PreTokenize (both kinds) returns pieces that concatenate to the text;
//   - Encode returns ids inside the vocabulary;
//   - Decode(Encode(s)) == s when every byte of s has a symbol in the vocabulary (the
//     contract in tokenizer.h);
//   - Decode of the input read as little-endian int32 ids does not crash.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "fuzz/fuzz_harness.h"
#include "model/gguf.h"
#include "text/tokenizer.h"

namespace lspo::fuzz {
namespace {

struct Vocab {
  model::BpeTokenizer tok;
  bool byte_has_symbol[256];
};
Vocab* g_vocab = nullptr;

}  // namespace

void InitTokenizerFuzzer() {
  if (g_vocab != nullptr) return;
  std::vector<std::string> paths;
  if (const char* env = std::getenv("LSPO_FUZZ_VOCAB"); env != nullptr && *env != '\0') {
    paths.push_back(env);
  }
  paths.push_back("models/SmolLM2-135M-Instruct.Q4_1.gguf");
  paths.push_back("fuzz/corpus/tokenizer_gguf/smollm2_vocab_small.gguf");
  for (const std::string& path : paths) {
    auto gguf = model::GgufFile::Open(path);
    if (!gguf.ok()) continue;
    auto tok = model::BpeTokenizer::FromGguf(*gguf);
    if (!tok.ok()) {
      std::fprintf(stderr, "tokenizer_fuzzer: %s: %s\n", path.c_str(),
                   std::string(tok.status().message()).c_str());
      continue;
    }
    g_vocab = new Vocab{*std::move(tok), {}};
    for (int b = 0; b < 256; ++b) {
      const char c = static_cast<char>(b);
      g_vocab->byte_has_symbol[b] = !g_vocab->tok.Encode(absl::string_view(&c, 1)).empty();
    }
    std::fprintf(stderr, "tokenizer_fuzzer: vocabulary of %d tokens from %s\n",
                 g_vocab->tok.vocab_size(), path.c_str());
    return;
  }
  std::fprintf(stderr, "tokenizer_fuzzer: no vocabulary found (run from the repository root, "
                       "or set LSPO_FUZZ_VOCAB to a GGUF file)\n");
  std::abort();
}

int FuzzTokenizer(const uint8_t* data, size_t size) {
  InitTokenizerFuzzer();
  if (size > 8192) return 0;  // keeps runs fast; long inputs add no new paths
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  for (auto kind : {model::PreTokenizerKind::kGpt2, model::PreTokenizerKind::kSmolLm}) {
    const std::vector<absl::string_view> pieces = model::PreTokenize(text, kind);
    LSPO_FUZZ_CHECK(absl::StrJoin(pieces, "") == text);
  }
  const model::BpeTokenizer& tok = g_vocab->tok;
  const std::vector<int32_t> ids = tok.Encode(text);
  for (int32_t id : ids) LSPO_FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  bool all_bytes = true;
  for (size_t i = 0; i < size; ++i) all_bytes = all_bytes && g_vocab->byte_has_symbol[data[i]];
  if (all_bytes) LSPO_FUZZ_CHECK(tok.Decode(ids) == text);
  std::vector<int32_t> raw(size / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * 4);
  (void)tok.Decode(raw);
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY_WITH_INIT(FuzzTokenizer, InitTokenizerFuzzer)
