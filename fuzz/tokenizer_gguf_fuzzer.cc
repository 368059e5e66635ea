// Fuzzes BpeTokenizer::FromGguf (text/tokenizer.h) with fuzzed GGUF metadata: the input is a
// whole GGUF file (seeds: fuzz/corpus/tokenizer_gguf/, a cut-down SmolLM2 vocabulary); if
// it parses and yields a tokenizer, fixed texts are encoded and the ids decoded.
//
// Decode(Encode(s)) == s is not asserted here: a fuzzed vocabulary may make a byte symbol or
// a merge result a special token, which then decodes to its literal text (tokenizer_fuzzer
// checks the round trip on the real vocabulary).
#include <string>
#include <vector>

#include "fuzz/fuzz_harness.h"
#include "model/gguf.h"
#include "text/tokenizer.h"

namespace lspo::fuzz {

int FuzzTokenizerGguf(const uint8_t* data, size_t size) {
  auto gguf = model::GgufFile::FromBytes(std::vector<uint8_t>(data, data + size), "<fuzz>");
  if (!gguf.ok()) return 0;
  auto tok = model::BpeTokenizer::FromGguf(*gguf);
  if (!tok.ok()) return 0;
  const int32_t vocab = tok->vocab_size();
  LSPO_FUZZ_CHECK(vocab > 0);
  for (int32_t id : {tok->bos_id(), tok->eos_id(), tok->pad_id(), tok->unk_id()}) {
    LSPO_FUZZ_CHECK(id >= -1 && id < vocab);
  }
  static const char* const kTexts[] = {
      "Hello world! It's 2024, isn't it?",
      "<|im_start|>user\nIs this spam?<|im_end|>\n<|im_start|>assistant\n",
      "  tabs\tand\nnewlines \r\n\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 12345",
      "\x80\xff\xc0 ill-formed \xed\xa0\x80",
      ""};
  for (const char* text : kTexts) {
    const std::vector<int32_t> ids = tok->Encode(text);
    for (int32_t id : ids) LSPO_FUZZ_CHECK(id >= 0 && id < vocab);
    (void)tok->Decode(ids);
  }
  // Every id decodes; a few out of range are skipped.
  std::vector<int32_t> all;
  for (int32_t id = -2; id < vocab + 2 && id < 4096; ++id) all.push_back(id);
  (void)tok->Decode(all);
  for (int32_t id = 0; id < vocab && id < 4096; ++id) {
    const int32_t back = tok->TokenToId(tok->IdToToken(id));
    LSPO_FUZZ_CHECK(back >= 0 && back <= id);  // duplicates: the first one wins
    (void)tok->IsSpecial(id);
  }
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzTokenizerGguf)
