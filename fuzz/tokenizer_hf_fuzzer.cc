// Fuzzes BpeTokenizer::FromHfJson (text/tokenizer.h), the Hugging Face tokenizer.json reader,
// then Encode / Decode / TokenToId of what it builds. The input is
//   <tokenizer.json text> [\0 <tokenizer_config.json text> [\0 <text to encode>]]
// (seeds: fuzz/corpus/tokenizer_hf/, the committed test tokenizers of
// tests/oracle/data/hf_tokenizers/ cut down to a few hundred tokens). Without a text part a
// few fixed texts are encoded. Checked:
//   - a refusal is kUnimplemented or kDataLoss (never another code);
//   - bos / eos / pad / unk ids are -1 or inside the vocabulary, adds_bos() implies a bos;
//   - Encode returns ids inside the vocabulary; Decode of any ids does not crash;
//   - IdToToken(id) maps back to an id (TokenToId(IdToToken(id)) >= 0).
// Decode(Encode(s)) == s is not asserted: normalizers, Strip decoders and prefix spaces change
// the text by design (tests/text/hf_tokenizer_test.cc checks it against `tokenizers`).
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_harness.h"
#include "text/tokenizer.h"

namespace lspo::fuzz {

int FuzzTokenizerHf(const uint8_t* data, size_t size) {
  if (size > 65536) return 0;  // keeps runs fast; seeds are ~10 KB
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t sep1 = input.find('\0');
  const absl::string_view tj = input.substr(0, sep1);
  absl::string_view config, text;
  bool have_text = false;
  if (sep1 != absl::string_view::npos) {
    const absl::string_view rest = input.substr(sep1 + 1);
    const size_t sep2 = rest.find('\0');
    config = rest.substr(0, sep2);
    if (sep2 != absl::string_view::npos) {
      text = rest.substr(sep2 + 1);
      have_text = true;
    }
  }
  auto tok = model::BpeTokenizer::FromHfJson(std::string(tj), std::string(config), "<fuzz>");
  if (!tok.ok()) {
    LSPO_FUZZ_CHECK(tok.status().code() == absl::StatusCode::kUnimplemented ||
                    tok.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  const int32_t vocab = tok->vocab_size();
  LSPO_FUZZ_CHECK(vocab > 0);
  for (int32_t id : {tok->bos_id(), tok->eos_id(), tok->pad_id(), tok->unk_id()}) {
    LSPO_FUZZ_CHECK(id >= -1 && id < vocab);
  }
  LSPO_FUZZ_CHECK(!tok->adds_bos() || tok->bos_id() >= 0);
  LSPO_FUZZ_CHECK(!tok->adds_eos() || tok->eos_id() >= 0);
  static const char* const kTexts[] = {
      "Hello world! It's 2024, isn't it? DON'T 12345678",
      "<|im_start|>user\nIs this spam?<|im_end|>\n<s>[INST] hi [/INST]</s>",
      "  tabs\tand\nnewlines \r\n\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80 \xe4\xb8\xad\xe6\x96\x87",
      "\x80\xff\xc0 ill-formed \xed\xa0\x80", ""};
  std::vector<absl::string_view> texts;
  if (have_text) {
    texts.push_back(text);
  } else {
    for (const char* t : kTexts) texts.push_back(t);
  }
  for (absl::string_view t : texts) {
    const std::vector<int32_t> ids = tok->Encode(t);
    for (int32_t id : ids) LSPO_FUZZ_CHECK(id >= 0 && id < vocab);
    (void)tok->Decode(ids);
  }
  std::vector<int32_t> all;
  for (int32_t id = -2; id < vocab + 2 && id < 4096; ++id) all.push_back(id);
  (void)tok->Decode(all);
  for (int32_t id = 0; id < vocab && id < 4096; ++id) {
    LSPO_FUZZ_CHECK(tok->TokenToId(tok->IdToToken(id)) >= 0);
    (void)tok->IsSpecial(id);
  }
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzTokenizerHf)
