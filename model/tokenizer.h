// Byte-level BPE tokenizer (GPT-2 family; SmolLM2 uses it with a digit-splitting
// pre-tokenizer) plus export to Hugging Face tokenizer files. Torch-free.
//
// Spec: docs/formats.md §4 (algorithm), §5 (SmolLM2 specials), §6 (HF files);
// bytes_to_unicode and the split regex follow openai/gpt-2 src/encoder.py.
//
// Encode(text), in order:
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
// Decode(ids) joins the token strings and maps the bytes_to_unicode alphabet back to bytes;
// special tokens decode to their literal text.
//
// Thread-safety: immutable after construction; all const methods are safe to call
// concurrently (Encode keeps its BPE cache per call).
#ifndef LSPO_MODEL_TOKENIZER_H_
#define LSPO_MODEL_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lspo::model {

class GgufFile;

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
  std::string chat_template;         // Jinja source copied into tokenizer_config.json; may be empty
  int64_t model_max_length = 8192;   // tokens; written to tokenizer_config.json
};

class BpeTokenizer {
 public:
  // Builds a tokenizer from plain vectors.
  // Errors: kInvalidArgument if tokens is empty, token_types has a different length, a special
  // id is outside [-1, vocab), a merge line is not "A B", or a merge names a token (A, B or AB)
  // that is not in `tokens`.
  static absl::StatusOr<BpeTokenizer> Create(BpeTokenizerSpec spec);

  // Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,bos_token_id,eos_token_id,
  // unknown_token_id,padding_token_id} and tokenizer.chat_template from a GGUF file.
  // Errors: kUnimplemented if tokenizer.ggml.model != "gpt2" or pre is not "smollm", "gpt2" or
  // "default"; kNotFound / kInvalidArgument from the GGUF accessors for a missing or mistyped
  // key; kDataLoss if the stored vocabulary is inconsistent (Create's kInvalidArgument is
  // reported as kDataLoss since the file is at fault).
  static absl::StatusOr<BpeTokenizer> FromGguf(const GgufFile& gguf);

  // Reads the Hugging Face GPT-2 files: vocab.json ({"token": id}) and merges.txt ("A B" per
  // line, an optional leading "#version" line). Pre-tokenizer kGpt2; "<|endoftext|>" (if
  // present) is the special, bos, eos and unk token; no pad. model_max_length 1024.
  // Errors: kNotFound for a missing file (path named), kDataLoss for malformed JSON, a
  // non-integer or out-of-range id, a gap in the ids, or a malformed merge line (file:line).
  static absl::StatusOr<BpeTokenizer> FromGpt2Files(const std::string& vocab_json_path,
                                                    const std::string& merges_txt_path);

  // UTF-8 text (ill-formed bytes allowed) -> token ids, see the file comment. Throughput:
  // ~1 MB/s or better on one core.
  std::vector<int32_t> Encode(absl::string_view utf8) const;

  // Token ids -> bytes. Ids outside [0, vocab_size()) are skipped. Decode(Encode(s)) == s for
  // every byte string s whose bytes all have a symbol in the vocabulary (see the file comment);
  // unlike HF, ill-formed UTF-8 is returned as is, not replaced by U+FFFD.
  std::string Decode(absl::Span<const int32_t> ids) const;

  // Token string (bytes_to_unicode alphabet, or the literal special text) -> id; -1 if absent.
  int32_t TokenToId(absl::string_view token) const;
  // Id -> token string; "" if out of range.
  const std::string& IdToToken(int32_t id) const;
  // True for ids whose type is control or user-defined (matched verbatim by Encode).
  bool IsSpecial(int32_t id) const;

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  int32_t bos_id() const { return bos_id_; }  // -1 = none
  int32_t eos_id() const { return eos_id_; }  // -1 = none
  int32_t pad_id() const { return pad_id_; }  // -1 = none
  int32_t unk_id() const { return unk_id_; }  // -1 = none
  PreTokenizerKind pre_tokenizer() const { return pre_; }
  const std::string& chat_template() const { return chat_template_; }

  // Writes tokenizer.json, tokenizer_config.json and special_tokens_map.json into `dir`
  // (created if missing), loadable by `tokenizers` / transformers AutoTokenizer
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
  BpeTokenizer() = default;

  // Appends the BPE ids of one pre-token (raw bytes) to `out`.
  void EncodeWord(absl::string_view word, std::vector<int32_t>* out) const;
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
};

}  // namespace lspo::model

#endif  // LSPO_MODEL_TOKENIZER_H_
