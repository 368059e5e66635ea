// Byte-level BPE tokenizer (GPT-2 family; SmolLM2 uses it with a digit-splitting
// pre-tokenizer), SentencePiece-style BPE read from Hugging Face tokenizer.json files (Llama 2,
// Mistral, TinyLlama), plus export to Hugging Face tokenizer files. Torch-free.
//
// Spec: docs/formats.md §4 (algorithm), §5 (SmolLM2 specials), §6 (HF files), §6a
// (tokenizer.json); bytes_to_unicode and the split regex follow openai/gpt-2 src/encoder.py; the
// tokenizer.json pipeline follows the Hugging Face `tokenizers` library (Rust crate, 0.2x).
//
// A BpeTokenizer comes from one of two sources:
//  * GGUF metadata (FromGguf), the GPT-2 files (FromGpt2Files) or plain vectors (Create);
//    Encode(text) then runs, in order:
//   1. Special tokens (GGUF token_type 3 "control" or 4 "user-defined"; "<|endoftext|>" for the
//      GPT-2 files) are cut out by exact, leftmost-longest match and emitted as their ids.
//   2. Each remaining segment is pre-tokenized:
//        kGpt2:   the GPT-2 split
//                 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//        kSmolLm: first every single \p{N} code point becomes its own piece (HF
//                 Digits(individual_digits=true)), then the GPT-2 split runs on each piece.
//      \p{L} = general category L*, \p{N} = N* (Nd, Nl, No), \s = Unicode White_Space (ICU).
//      Ill-formed UTF-8 bytes count as "other" (neither letter, number nor space).
//   3. Each pre-token's bytes are mapped through bytes_to_unicode to one symbol per byte, and
//      adjacent symbols are merged by lowest merge rank (leftmost on ties) until no adjacent
//      pair is in the merge list. No prefix space, no BOS/EOS is added. A byte whose symbol is
//      not in the vocabulary is dropped, as HF tokenizers does for a BPE model without
//      unk_token (SmolLM2 lacks 0x04 0x06 0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5-0xFF;
//      the GPT-2 vocabulary has all 256).
//    Decode(ids) joins the token strings and maps the bytes_to_unicode alphabet back to bytes;
//    special tokens decode to their literal text.
//  * A Hugging Face tokenizer.json (FromHfFolder / FromHfJson). Encode(text) gives the ids of
//    `tokenizers`' Tokenizer.encode(text, add_special_tokens=False):
//   1. added_tokens with normalized=false are cut out of the text (leftmost-longest; honouring
//      single_word, lstrip, rstrip); the rest is normalized (normalizer), then added tokens with
//      normalized=true are cut out of the normalized text (matched against their normalized
//      content).
//   2. Each remaining piece is pre-tokenized (pre_tokenizer: ByteLevel, Digits, Split,
//      Metaspace, or a Sequence of them; Split runs ICU regular expressions).
//   3. The BPE model (model.*): with a ByteLevel pre-tokenizer the symbols are the
//      bytes_to_unicode characters of the piece's bytes (GPT-2, Llama 3, Qwen2); otherwise its
//      Unicode characters (SentencePiece style). A symbol missing from model.vocab becomes its
//      UTF-8 bytes as "<0xNN>" tokens (byte_fallback), else unk_token (fuse_unk joins runs),
//      else is dropped. With ignore_merges a piece found whole in model.vocab is one token.
//      Then merges as above.
//    The post-processor adds nothing (as with add_special_tokens=False); adds_bos() /
//    adds_eos() say what it would add. Decode(ids) runs the file's decoder chain (ByteLevel,
//    Replace, ByteFallback, Fuse, Strip, Metaspace) over the token strings, added tokens
//    included. Everything else a file asks for is refused with kUnimplemented when loading.
//
// Thread-safety: immutable after construction; all const methods are safe to call
// concurrently (Encode keeps its BPE cache and regex matchers per call). Copies share the
// immutable tokenizer.json state.
#ifndef LSPO_TEXT_TOKENIZER_H_
#define LSPO_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lspo::model {

class GgufFile;
namespace internal {
struct HfPipeline;    // text/tokenizer_internal.h
struct HfJsonLoader;  // text/tokenizer_hf_load.cc
}  // namespace internal

// Which pre-tokenizer runs before BPE (see the file comment).
enum class PreTokenizerKind {
  kGpt2,    // GPT-2 regex only (GGUF pre "gpt2"/"default"; the GPT-2 vocab.json files).
  kSmolLm,  // single \p{N} code points first, then the GPT-2 regex (GGUF pre "smollm").
};

// GGUF tokenizer.ggml.token_type values (docs/formats.md §4).
enum TokenType : int32_t {
  kTokenNormal = 1,
  kTokenUnknown = 2,
  kTokenControl = 3,
  kTokenUserDefined = 4,
  kTokenUnused = 5,
  kTokenByte = 6,
};

// The split regex of a GGUF tokenizer.ggml.pre that llama.cpp names by its regex (llama.cpp
// llama-vocab.cpp; the published tokenizer.json files): "llama-bpe" (Llama 3: digits in runs of
// up to 3), "qwen2" (Qwen2 / Qwen2.5 / Qwen3: single digits); "" for any other name. Their
// tokenizer.json pre-tokenizer is Sequence[Split(this regex, Isolated), ByteLevel(no regex)];
// llama-bpe also ignores merges for whole-vocabulary words (BPE ignore_merges) and qwen2
// NFC-normalizes (GgufPreUsesNfc), as those tokenizer.json files do.
absl::string_view GgufPreTokenizerRegex(absl::string_view pre);
bool GgufPreIgnoresMerges(absl::string_view pre);
bool GgufPreUsesNfc(absl::string_view pre);

// Splits `text` (UTF-8, no special tokens) into pre-tokens as described in the file comment.
// Returns views into `text`; their concatenation equals `text`. Never fails.
std::vector<absl::string_view> PreTokenize(absl::string_view text, PreTokenizerKind kind);

// Everything a BpeTokenizer is built from, as plain vectors (what GGUF stores).
struct BpeTokenizerSpec {
  std::vector<std::string> tokens;   // [vocab] token strings in the bytes_to_unicode alphabet
  std::vector<int32_t> token_types;  // [vocab] TokenType; empty = all kTokenNormal
  std::vector<std::string> merges;   // "A B", rank = index
  PreTokenizerKind pre_tokenizer = PreTokenizerKind::kGpt2;
  int32_t bos_id = -1;  // -1 = none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  std::string chat_template;        // Jinja source copied into tokenizer_config.json; may be empty
  int64_t model_max_length = 8192;  // tokens; written to tokenizer_config.json
};

class BpeTokenizer {
 public:
  // Builds a tokenizer from plain vectors.
  // Errors: kInvalidArgument if tokens is empty, token_types has a different length, a special
  // id is outside [-1, vocab), a merge line is not "A B", or a merge names a token (A, B or AB)
  // that is not in `tokens`.
  static absl::StatusOr<BpeTokenizer> Create(BpeTokenizerSpec spec);

  // Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,eos_token_id,
  // unknown_token_id,padding_token_id} and tokenizer.chat_template from a GGUF file. The pre
  // "llama-bpe" and "qwen2" are read through FromHfJson of the tokenizer.json they stand for
  // (GgufPreTokenizerRegex; control (3) and user-defined (4) tokens as added tokens, special
  // for 3; add_bos_token as a TemplateProcessing post-processor), so they tokenize as that
  // file does; from_hf_json() is then true and WriteHfFiles writes that tokenizer.json.
  // Errors: kUnimplemented if tokenizer.ggml.model != "gpt2" or pre is not "smollm", "gpt2",
  // "default", "llama-bpe" or "qwen2"; kNotFound / kInvalidArgument from the GGUF accessors for a
  // missing or mistyped key; kDataLoss if the stored vocabulary is inconsistent (Create's
  // kInvalidArgument is reported as kDataLoss since the file is at fault).
  static absl::StatusOr<BpeTokenizer> FromGguf(const GgufFile& gguf);

  // Reads the Hugging Face GPT-2 files: vocab.json ({"token": id}) and merges.txt ("A B" per
  // line, an optional leading "#version" line). Pre-tokenizer kGpt2; "<|endoftext|>" (if
  // present) is the special, bos, eos and unk token; no pad. model_max_length 1024.
  // Errors: kNotFound for a missing file (path named), kDataLoss for malformed JSON, a
  // non-integer or out-of-range id, a gap in the ids, or a malformed merge line (file:line).
  static absl::StatusOr<BpeTokenizer> FromGpt2Files(const std::string& vocab_json_path,
                                                    const std::string& merges_txt_path);

  // Reads the Hugging Face tokenizer files in the folder `dir`: dir/tokenizer.json (required),
  // dir/tokenizer_config.json, dir/chat_template.jinja and dir/special_tokens_map.json (each
  // when present), and builds the tokenizer with FromHfJson. chat_template.jinja, when present,
  // is the chat template (transformers >= 4.43 keeps it there), else tokenizer_config.json's
  // chat_template. The texts of the files are kept for WriteHfFiles.
  // Errors: those of runtime::ReadFileToString for dir/tokenizer.json (kNotFound when it is
  // missing, the path named) and for a present file that cannot be read; then FromHfJson's.
  static absl::StatusOr<BpeTokenizer> FromHfFolder(const std::string& dir);

  // Builds a tokenizer from the text of a tokenizer.json and of a tokenizer_config.json (empty
  // text = no config file), as `tokenizers`' Tokenizer.from_str and transformers read them
  // (docs/formats.md §6a). `source_name` names the inputs in messages ("<source_name>/
  // tokenizer.json"); FromHfFolder passes the folder. No file is read.
  // Supported (anything else is refused):
  //   model          type "BPE"; vocab; merges as "A B" strings or ["A", "B"] pairs (a repeated
  //                  pair takes its last rank, as in `tokenizers`); unk_token, fuse_unk,
  //                  byte_fallback, ignore_merges; dropout null or 0;
  //                  continuing_subword_prefix / end_of_word_suffix null or "".
  //   added_tokens   any, special or not, with single_word / lstrip / rstrip / normalized.
  //   normalizer     null, NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence.
  //   pre_tokenizer  null, ByteLevel (add_prefix_space, use_regex; must come last), Digits,
  //                  Split (String or Regex pattern, any behavior, invert), Metaspace
  //                  (replacement, prepend_scheme or the older add_prefix_space, split),
  //                  Sequence.
  //   post_processor null, ByteLevel, TemplateProcessing whose single template is
  //                  [one special token] $A [one special token], Sequence of these; recorded in
  //                  adds_bos() / adds_eos(), never applied by Encode.
  //   decoder        null, ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence.
  //   truncation / padding are ignored (transformers resets them on every call).
  //   tokenizer_config.json: bos_token / eos_token / pad_token / unk_token (a string, an
  //   {"content": ...} object or null; a key that is absent falls back to the tokenizer.json:
  //   model.unk_token for unk, the template's leading / trailing token for bos / eos),
  //   chat_template (a string, or a list of {name, template} of which "default" is taken),
  //   model_max_length (an integer; other values are ignored); split_special_tokens must be
  //   false or absent. Other keys (add_bos_token, legacy, add_prefix_space, tokenizer_class,
  //   ...) are not consulted: the tokenizer is what tokenizer.json says, as in `tokenizers`.
  // Regular expressions run on ICU (icu::RegexPattern with UREGEX_MULTILINE | UREGEX_UNIX_LINES,
  // the anchor and dot semantics of the Oniguruma engine `tokenizers` uses; \h / \H mean hex
  // digits as in Oniguruma). Unicode data is ICU's (Unicode 15 for ICU 72), which can differ
  // from `tokenizers`' for characters added in later Unicode versions.
  // Decode: an added token with normalized=true gives its normalized content, as in
  // `tokenizers`.
  // Errors: kUnimplemented when the file asks for something not supported (a model type other
  // than BPE, an unknown normalizer / pre-tokenizer / post-processor / decoder type, dropout,
  // a subword prefix or suffix, ByteLevel not last, a template that adds more than one token
  // on a side, a template bos / eos that contradicts tokenizer_config.json, Sequences nested
  // deeper than 8, a regex ICU cannot compile, split_special_tokens true), naming the JSON
  // field, the value found and what is supported. kDataLoss for malformed JSON, a missing or
  // mistyped field, an id outside [0, 2^31 - 1) or given twice, ids that do not cover
  // 0..N-1, an empty or repeated added-token content, a merge that names a token (left, right
  // or their concatenation) missing from model.vocab, a model.unk_token or config token that
  // is not in the vocabulary, naming the file and the field. Never crashes on any input bytes
  // (fuzzed: fuzz/tokenizer_hf_fuzzer.cc).
  static absl::StatusOr<BpeTokenizer> FromHfJson(std::string tokenizer_json_text,
                                                 std::string tokenizer_config_json_text,
                                                 std::string source_name);

  // UTF-8 text (ill-formed bytes allowed) -> token ids, see the file comment. Throughput:
  // ~1 MB/s or better on one core. No BOS/EOS is added (see adds_bos()).
  std::vector<int32_t> Encode(absl::string_view utf8) const;

  // Token ids -> bytes. Ids outside [0, vocab_size()) are skipped. For GGUF / GPT-2-file
  // tokenizers Decode(Encode(s)) == s for every byte string s whose bytes all have a symbol in
  // the vocabulary (see the file comment). For tokenizer.json tokenizers Decode gives what
  // `tokenizers`' decode(ids, skip_special_tokens=False) gives (which is not always the input:
  // a Strip decoder, a normalizer, a prefix space). Unlike HF, ill-formed UTF-8 (e.g. from a
  // lone <0xNN> byte token) is returned as is, not replaced by U+FFFD.
  std::string Decode(absl::Span<const int32_t> ids) const;

  // Token string -> id; -1 if absent. GGUF / GPT-2 files: the bytes_to_unicode alphabet or the
  // literal special text. tokenizer.json: an added token's content first, then model.vocab
  // (as `tokenizers`' token_to_id).
  int32_t TokenToId(absl::string_view token) const;
  // Id -> token string; "" if out of range. tokenizer.json: an added token's content, else the
  // model.vocab string.
  const std::string& IdToToken(int32_t id) const;
  // GGUF: true for ids whose type is control or user-defined (matched verbatim by Encode).
  // tokenizer.json: true for added tokens with "special": true (non-special added tokens are
  // also matched verbatim by Encode but are not special, as in `tokenizers`).
  bool IsSpecial(int32_t id) const;

  // True when the tokenizer.json post-processor would prepend bos_id() (append eos_id()) to a
  // single sequence encoded with add_special_tokens=True, e.g. Llama 3's <|begin_of_text|>
  // and Llama 2's <s>. Encode never adds them; callers that want them add them. Always false
  // for GGUF / GPT-2-file tokenizers. tokenizer_config.json's add_bos_token is not consulted.
  bool adds_bos() const;
  bool adds_eos() const;
  // True when the tokenizer came from a tokenizer.json (FromHfFolder / FromHfJson).
  bool from_hf_json() const { return hf_ != nullptr; }

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }  // -1 = none
  int32_t eos_id() const { return eos_id_; }  // -1 = none
  int32_t pad_id() const { return pad_id_; }  // -1 = none
  int32_t unk_id() const { return unk_id_; }  // -1 = none
  // GGUF / GPT-2-file tokenizers only (kGpt2 for tokenizer.json ones, see from_hf_json()).
  PreTokenizerKind pre_tokenizer() const { return pre_; }
  const std::string& chat_template() const { return chat_template_; }

  // Writes Hugging Face tokenizer files into `dir` (created if missing), loadable by
  // `tokenizers` / transformers AutoTokenizer.
  // From a tokenizer.json (FromHfFolder / FromHfJson): that tokenizer.json byte for byte; the
  // original tokenizer_config.json, chat_template.jinja and special_tokens_map.json byte for
  // byte where the source had them; without a source tokenizer_config.json, one generated as
  // below, plus a generated special_tokens_map.json. So a fine-tuned model's output folder
  // tokenizes like its input folder.
  // Otherwise (GGUF, GPT-2 files, Create) tokenizer.json, tokenizer_config.json and
  // special_tokens_map.json are generated
  // (docs/formats.md §6): BPE model with vocab + merges, added_tokens = the special ids
  // (special=true, normalized=false), normalizer null, pre_tokenizer
  // Sequence[Digits(individual_digits=true), ByteLevel(add_prefix_space=false)] for kSmolLm or
  // ByteLevel alone for kGpt2, ByteLevel decoder and post-processor. tokenizer_config.json
  // names tokenizer_class PreTrainedTokenizerFast (GPT2Tokenizer would make
  // transformers 5.x drop the Digits split), bos/eos/pad/unk by content, model_max_length and the
  // chat template. Errors: kInvalidArgument if `dir` exists and is not a directory;
  // kPermissionDenied / kInternal if a file cannot be written (path named).
  absl::Status WriteHfFiles(const std::string& dir) const;

 private:
  friend struct internal::HfJsonLoader;  // FromHfJson's steps fill a BpeTokenizer

  BpeTokenizer() = default;

  // Appends the BPE ids of one pre-token (raw bytes) to `out`.
  void EncodeWord(absl::string_view word, std::vector<int32_t>* out) const;
  // Merges adjacent ids of `symbols` by lowest merge rank (leftmost on ties) until no adjacent
  // pair is in merge_ranks_; appends the result to `out`.
  void ApplyMerges(std::vector<int32_t> symbols, std::vector<int32_t>* out) const;
  // tokenizer.json pipeline (text/tokenizer_hf_model.cc; WriteHfSourceFiles in
  // text/tokenizer_export.cc).
  std::vector<int32_t> EncodeHf(absl::string_view text) const;
  void EncodeHfWord(absl::string_view word, std::vector<int32_t>* out) const;
  std::string DecodeHf(absl::Span<const int32_t> ids) const;
  absl::Status WriteHfSourceFiles(const std::string& dir) const;
  // The generated tokenizer_config.json / special_tokens_map.json texts (see WriteHfFiles).
  std::string GeneratedConfigJson() const;
  std::string GeneratedSpecialTokensMapJson() const;
  // Appends the ids of a segment free of special tokens.
  void EncodeOrdinary(absl::string_view text,
                      absl::flat_hash_map<std::string, std::vector<int32_t>>* cache,
                      std::vector<int32_t>* out) const;

  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  std::vector<std::string> tokens_;
  std::vector<int32_t> token_types_;
  std::vector<std::string> merges_;
  absl::flat_hash_map<std::string, int32_t> token_to_id_;
  absl::flat_hash_map<uint64_t, Merge> merge_ranks_;  // key = (left_id << 32) | right_id
  int32_t byte_to_id_[256] = {};                      // id of each single-byte symbol or -1
  std::vector<int32_t> special_ids_;                  // sorted by descending text length
  bool special_first_byte_[256] = {};                 // first bytes of special token texts
  PreTokenizerKind pre_ = PreTokenizerKind::kGpt2;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  int32_t unk_id_ = -1;
  int32_t pad_id_ = -1;
  std::string chat_template_;
  int64_t model_max_length_ = 8192;
  // tokenizer.json tokenizers only: token_to_id_ holds model.vocab alone, and added-token
  // contents map here (TokenToId looks here first, as `tokenizers` does).
  absl::flat_hash_map<std::string, int32_t> added_to_id_;
  std::shared_ptr<const internal::HfPipeline> hf_;  // null for GGUF / GPT-2 / Create
};

}  // namespace lspo::model

#endif  // LSPO_TEXT_TOKENIZER_H_
