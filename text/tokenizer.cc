// Byte-level BPE tokenizer; see tokenizer.h and docs/formats.md §4-§6: the bytes_to_unicode
// alphabet, the GPT-2 / SmolLM pre-tokenizer, the tokenizers built from vectors, GGUF metadata
// and the GPT-2 files, and Encode / Decode with BPE merges. The tokenizer.json reader is in
// tokenizer_hf_json.cc and tokenizer_hf_load.cc, its pipeline in tokenizer_hf_pipeline.cc and
// tokenizer_hf_model.cc, the export to HF files in tokenizer_export.cc.
#include "text/tokenizer.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <queue>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "model/gguf.h"
#include "nlohmann/json.hpp"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"
#include "text/tokenizer_internal.h"

namespace lspo::model {
namespace internal {

// bytes_to_unicode (openai/gpt-2 src/encoder.py).
ByteAlphabet::ByteAlphabet() {
  std::fill(std::begin(cp_to_byte), std::end(cp_to_byte), -1);
  int k = 0;
  for (int b = 0; b < 256; ++b) {
    bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    UChar32 cp = keep ? b : 256 + k++;
    byte_to_cp[b] = cp;
    cp_to_byte[cp] = static_cast<int16_t>(b);
    char buf[4];
    int32_t len = 0;
    U8_APPEND_UNSAFE(buf, len, cp);
    byte_to_utf8[b].assign(buf, len);
  }
}

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

}  // namespace internal

namespace {

using internal::Alphabet;
using internal::ByteAlphabet;

// Maps a bytes_to_unicode-encoded token string back to raw bytes. Code points outside the
// alphabet are kept as their UTF-8 encoding.
std::string TokenToBytes(const std::string& token) {
  const ByteAlphabet& a = Alphabet();
  std::string out;
  out.reserve(token.size());
  int32_t i = 0;
  const int32_t n = static_cast<int32_t>(token.size());
  while (i < n) {
    int32_t start = i;
    UChar32 cp;
    U8_NEXT(token.data(), i, n, cp);
    if (cp >= 0 && cp < 512 && a.cp_to_byte[cp] >= 0) {
      out.push_back(static_cast<char>(a.cp_to_byte[cp]));
    } else {
      out.append(token, start, i - start);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer scanner.
enum class CharClass : uint8_t { kLetter, kNumber, kSpace, kOther };

CharClass Classify(UChar32 cp) {
  if (cp < 0) return CharClass::kOther;  // ill-formed UTF-8
  if (cp < 128) {                        // fast path for ASCII
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::kLetter;
    if (cp >= '0' && cp <= '9') return CharClass::kNumber;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::kSpace;
    return CharClass::kOther;
  }
  if (u_isUWhiteSpace(cp)) return CharClass::kSpace;  // White_Space property
  switch (u_charType(cp)) {
    case U_UPPERCASE_LETTER:
    case U_LOWERCASE_LETTER:
    case U_TITLECASE_LETTER:
    case U_MODIFIER_LETTER:
    case U_OTHER_LETTER:
      return CharClass::kLetter;
    case U_DECIMAL_DIGIT_NUMBER:
    case U_LETTER_NUMBER:
    case U_OTHER_NUMBER:
      return CharClass::kNumber;
    default:
      return CharClass::kOther;
  }
}

struct DecodedChar {
  int32_t offset;  // byte offset in the piece
  UChar32 cp;      // < 0 for an ill-formed byte sequence
  CharClass cls;
};

void DecodeChars(absl::string_view s, std::vector<DecodedChar>* chars) {
  chars->clear();
  int32_t i = 0;
  const int32_t n = static_cast<int32_t>(s.size());
  while (i < n) {
    int32_t start = i;
    UChar32 cp;
    U8_NEXT(s.data(), i, n, cp);
    chars->push_back({start, cp, Classify(cp)});
  }
}

// GPT-2 split of one piece:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// The alternatives are tried in order at each position (leftmost-first regex semantics).
void Gpt2Split(absl::string_view s, std::vector<DecodedChar>* scratch,
               std::vector<absl::string_view>* out) {
  DecodeChars(s, scratch);
  const std::vector<DecodedChar>& c = *scratch;
  const int32_t n = static_cast<int32_t>(c.size());
  auto offset = [&](int32_t k) { return k < n ? c[k].offset : static_cast<int32_t>(s.size()); };
  auto emit = [&](int32_t from, int32_t to) {
    out->push_back(s.substr(offset(from), offset(to) - offset(from)));
  };
  int32_t i = 0;
  while (i < n) {
    // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive).
    if (c[i].cp == '\'' && i + 1 < n) {
      UChar32 a = c[i + 1].cp;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') {
        emit(i, i + 2);
        i += 2;
        continue;
      }
      if (i + 2 < n) {
        UChar32 b = c[i + 2].cp;
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
          emit(i, i + 3);
          i += 3;
          continue;
        }
      }
    }
    // ` ?X+` for X in {\p{L}, \p{N}, [^\s\p{L}\p{N}]}: with the optional space if the next char
    // is an X, else without it (a space itself is never an X).
    int32_t j = (c[i].cp == ' ' && i + 1 < n) ? i + 1 : i;
    CharClass cls = c[j].cls;
    if (cls != CharClass::kSpace) {
      int32_t k = j + 1;
      while (k < n && c[k].cls == cls) ++k;
      emit(i, k);
      i = k;
      continue;
    }
    // \s+(?!\S) then \s+ : a whitespace run at the end of the piece is taken whole; a run of
    // length >= 2 followed by a non-space leaves its last char for the next token; a single
    // whitespace char followed by a non-space is taken by \s+.
    int32_t k = i + 1;
    while (k < n && c[k].cls == CharClass::kSpace) ++k;
    if (k < n && k - i >= 2) --k;
    emit(i, k);
    i = k;
  }
}

// ---------------------------------------------------------------------------------------------
uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

// -----------------------------------------------------------------------------------------------
std::vector<absl::string_view> PreTokenize(absl::string_view text, PreTokenizerKind kind) {
  std::vector<absl::string_view> out;
  std::vector<DecodedChar> scratch;
  if (kind == PreTokenizerKind::kGpt2) {
    Gpt2Split(text, &scratch, &out);
    return out;
  }
  // kSmolLm: every \p{N} code point is its own piece; the spans between go through Gpt2Split.
  std::vector<DecodedChar> chars;
  DecodeChars(text, &chars);
  const int32_t n = static_cast<int32_t>(chars.size());
  int32_t span_start = 0;  // byte offset
  for (int32_t k = 0; k < n; ++k) {
    if (chars[k].cls != CharClass::kNumber) continue;
    int32_t begin = chars[k].offset;
    int32_t end = k + 1 < n ? chars[k + 1].offset : static_cast<int32_t>(text.size());
    if (begin > span_start) {
      Gpt2Split(text.substr(span_start, begin - span_start), &scratch, &out);
    }
    out.push_back(text.substr(begin, end - begin));
    span_start = end;
  }
  if (span_start < static_cast<int32_t>(text.size())) {
    Gpt2Split(text.substr(span_start), &scratch, &out);
  }
  return out;
}

// -----------------------------------------------------------------------------------------------
absl::StatusOr<BpeTokenizer> BpeTokenizer::Create(BpeTokenizerSpec spec) {
  const size_t vocab = spec.tokens.size();
  if (vocab == 0) {
    return absl::InvalidArgumentError("BpeTokenizer: empty token list; pass the vocabulary");
  }
  if (vocab > static_cast<size_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat("BpeTokenizer: ", vocab, " tokens exceed the int32 id range"));
  }
  if (spec.token_types.empty()) spec.token_types.assign(vocab, kTokenNormal);
  if (spec.token_types.size() != vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("BpeTokenizer: token_types has ", spec.token_types.size(),
                     " entries but there are ", vocab, " tokens; they must match"));
  }
  for (auto [name, id] : {std::pair<const char*, int32_t>{"bos", spec.bos_id},
                          {"eos", spec.eos_id},
                          {"unk", spec.unk_id},
                          {"pad", spec.pad_id}}) {
    if (id < -1 || id >= static_cast<int64_t>(vocab)) {
      return absl::InvalidArgumentError(
          absl::StrCat("BpeTokenizer: ", name, " id ", id, " is outside [-1, ", vocab, ")"));
    }
  }

  BpeTokenizer t;
  t.tokens_ = std::move(spec.tokens);
  t.token_types_ = std::move(spec.token_types);
  t.pre_ = spec.pre_tokenizer;
  t.bos_id_ = spec.bos_id;
  t.eos_id_ = spec.eos_id;
  t.unk_id_ = spec.unk_id;
  t.pad_id_ = spec.pad_id;
  t.chat_template_ = std::move(spec.chat_template);
  t.model_max_length_ = spec.model_max_length;

  t.token_to_id_.reserve(vocab);
  for (size_t id = 0; id < vocab; ++id) {
    t.token_to_id_.emplace(t.tokens_[id], static_cast<int32_t>(id));  // first one wins
    if (t.IsSpecial(static_cast<int32_t>(id)) && !t.tokens_[id].empty()) {
      t.special_ids_.push_back(static_cast<int32_t>(id));
    }
  }
  for (int32_t id : t.special_ids_) {
    t.special_first_byte_[static_cast<uint8_t>(t.tokens_[id][0])] = true;
  }
  std::stable_sort(t.special_ids_.begin(), t.special_ids_.end(),
                   [&](int32_t a, int32_t b) { return t.tokens_[a].size() > t.tokens_[b].size(); });

  const ByteAlphabet& alphabet = Alphabet();
  for (int b = 0; b < 256; ++b) {
    auto it = t.token_to_id_.find(alphabet.byte_to_utf8[b]);
    t.byte_to_id_[b] = it == t.token_to_id_.end() ? -1 : it->second;
  }

  t.merge_ranks_.reserve(spec.merges.size());
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const std::string& m = spec.merges[rank];
    size_t space = m.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 >= m.size() ||
        m.find(' ', space + 1) != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("BpeTokenizer: merge ", rank, " is '", m,
                       "'; expected two tokens separated by one space"));
    }
    absl::string_view left(m.data(), space);
    absl::string_view right(m.data() + space + 1, m.size() - space - 1);
    auto li = t.token_to_id_.find(left);
    auto ri = t.token_to_id_.find(right);
    auto mi = t.token_to_id_.find(absl::StrCat(left, right));
    if (li == t.token_to_id_.end() || ri == t.token_to_id_.end() || mi == t.token_to_id_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("BpeTokenizer: merge ", rank, " '", m,
                       "' names a token (left, right or their concatenation) that is not in "
                       "the vocabulary"));
    }
    // A repeated pair keeps its first (lowest) rank.
    t.merge_ranks_.emplace(PairKey(li->second, ri->second),
                           Merge{static_cast<int32_t>(rank), mi->second});
  }
  t.merges_ = std::move(spec.merges);
  return t;
}

absl::StatusOr<BpeTokenizer> BpeTokenizer::FromGpt2Files(const std::string& vocab_json_path,
                                                         const std::string& merges_txt_path) {
  ASSIGN_OR_RETURN(std::string vocab_text,
                   runtime::ReadFileToString(vocab_json_path, "GPT-2 vocab.json"));
  ASSIGN_OR_RETURN(std::string merges_text,
                   runtime::ReadFileToString(merges_txt_path, "GPT-2 merges.txt"));

  nlohmann::json vocab = nlohmann::json::parse(vocab_text, nullptr, /*allow_exceptions=*/false);
  if (vocab.is_discarded() || !vocab.is_object() || vocab.empty()) {
    return absl::DataLossError(
        absl::StrCat("'", vocab_json_path, "' is not a non-empty JSON object {\"token\": id}"));
  }
  BpeTokenizerSpec spec;
  spec.tokens.assign(vocab.size(), std::string());
  std::vector<bool> seen(vocab.size(), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer()) {
      return absl::DataLossError(
          absl::StrCat("'", vocab_json_path, "': token '", it.key(), "' has a non-integer id"));
    }
    int64_t id = it.value().get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(vocab.size()) || seen[id]) {
      return absl::DataLossError(absl::StrCat("'", vocab_json_path, "': token '", it.key(),
                                              "' has id ", id, "; ids must be unique and cover 0..",
                                              vocab.size() - 1, " without gaps"));
    }
    seen[id] = true;
    spec.tokens[id] = it.key();
  }
  spec.token_types.assign(spec.tokens.size(), kTokenNormal);

  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(merges_text, '\n')) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line_no == 1 && absl::StartsWith(line, "#version")) continue;
    size_t space = line.find(' ');
    if (space == absl::string_view::npos || space == 0 || space + 1 >= line.size() ||
        line.find(' ', space + 1) != absl::string_view::npos) {
      return absl::DataLossError(absl::StrCat("'", merges_txt_path, "':", line_no, ": '", line,
                                              "' is not two tokens separated by one space"));
    }
    spec.merges.emplace_back(line);
  }

  constexpr absl::string_view kEndOfText = "<|endoftext|>";
  auto eot = vocab.find(std::string(kEndOfText));
  if (eot != vocab.end()) {
    int32_t id = eot.value().get<int32_t>();
    spec.token_types[id] = kTokenControl;
    spec.bos_id = spec.eos_id = spec.unk_id = id;
  }
  spec.pre_tokenizer = PreTokenizerKind::kGpt2;
  spec.model_max_length = 1024;
  auto tok = Create(std::move(spec));
  if (!tok.ok() && absl::IsInvalidArgument(tok.status())) {
    return absl::DataLossError(absl::StrCat("GPT-2 tokenizer files '", vocab_json_path, "', '",
                                            merges_txt_path,
                                            "' are inconsistent: ", tok.status().message()));
  }
  return tok;
}

// -----------------------------------------------------------------------------------------------
bool BpeTokenizer::IsSpecial(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  return token_types_[id] == kTokenControl || token_types_[id] == kTokenUserDefined;
}

int32_t BpeTokenizer::TokenToId(absl::string_view token) const {
  if (!added_to_id_.empty()) {
    auto added = added_to_id_.find(token);
    if (added != added_to_id_.end()) return added->second;
  }
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

const std::string& BpeTokenizer::IdToToken(int32_t id) const {
  static const std::string* empty = new std::string();
  if (id < 0 || id >= vocab_size()) return *empty;
  return tokens_[id];
}

bool BpeTokenizer::adds_bos() const { return hf_ != nullptr && hf_->adds_bos; }
bool BpeTokenizer::adds_eos() const { return hf_ != nullptr && hf_->adds_eos; }

void BpeTokenizer::EncodeWord(absl::string_view word, std::vector<int32_t>* out) const {
  // Bytes without a single-byte symbol are dropped before merging (as HF tokenizers does for a
  // BPE model without unk_token), so their neighbours become adjacent.
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  for (char ch : word) {
    int32_t id = byte_to_id_[static_cast<uint8_t>(ch)];
    if (id >= 0) symbols.push_back(id);
  }
  ApplyMerges(std::move(symbols), out);
}

void BpeTokenizer::ApplyMerges(std::vector<int32_t> symbols, std::vector<int32_t>* out) const {
  // Symbols form a doubly linked list over the word's symbols; a min-heap holds candidate pairs
  // ordered by (rank, position of the left symbol) so ties merge leftmost first. Stale heap
  // entries (either side changed) are skipped when popped. (`tokenizers` Word::merge_all.)
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    int32_t rank;
    int32_t left;  // symbol index
    int32_t left_id;
    int32_t right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::vector<Symbol> sym;
  sym.reserve(symbols.size());
  for (int32_t id : symbols) sym.push_back({id, static_cast<int32_t>(sym.size()) - 1, -1});
  const int32_t n = static_cast<int32_t>(sym.size());
  if (n == 1) {
    out->push_back(sym[0].id);
    return;
  }
  for (int32_t i = 0; i + 1 < n; ++i) sym[i].next = i + 1;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push_pair = [&](int32_t left) {
    if (left < 0) return;
    int32_t right = sym[left].next;
    if (right < 0 || sym[left].id < 0 || sym[right].id < 0) return;
    auto it = merge_ranks_.find(PairKey(sym[left].id, sym[right].id));
    if (it == merge_ranks_.end()) return;
    heap.push({it->second.rank, left, sym[left].id, sym[right].id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.left];
    if (left.id != c.left_id || left.next < 0) continue;  // merged away or changed
    Symbol& right = sym[left.next];
    if (right.id != c.right_id) continue;
    left.id = merge_ranks_.find(PairKey(c.left_id, c.right_id))->second.merged_id;
    int32_t after = right.next;
    right.id = -2;  // dead
    left.next = after;
    if (after >= 0) sym[after].prev = c.left;
    push_pair(left.prev);
    push_pair(c.left);
  }
  for (int32_t i = 0; i >= 0 && i < n; i = sym[i].next) out->push_back(sym[i].id);
}

void BpeTokenizer::EncodeOrdinary(absl::string_view text,
                                  absl::flat_hash_map<std::string, std::vector<int32_t>>* cache,
                                  std::vector<int32_t>* out) const {
  if (text.empty()) return;
  for (absl::string_view piece : PreTokenize(text, pre_)) {
    auto it = cache->find(piece);
    if (it == cache->end()) {
      std::vector<int32_t> ids;
      EncodeWord(piece, &ids);
      it = cache->emplace(std::string(piece), std::move(ids)).first;
    }
    out->insert(out->end(), it->second.begin(), it->second.end());
  }
}

std::vector<int32_t> BpeTokenizer::Encode(absl::string_view utf8) const {
  if (hf_ != nullptr) return EncodeHf(utf8);
  std::vector<int32_t> out;
  out.reserve(utf8.size() / 3 + 8);
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache;
  size_t segment_start = 0;
  size_t pos = 0;
  while (pos < utf8.size()) {
    int32_t match = -1;
    if (special_first_byte_[static_cast<uint8_t>(utf8[pos])]) {
      for (int32_t id : special_ids_) {  // longest first => leftmost-longest
        const std::string& s = tokens_[id];
        if (utf8.size() - pos >= s.size() && utf8.compare(pos, s.size(), s) == 0) {
          match = id;
          break;
        }
      }
    }
    if (match < 0) {
      ++pos;
      continue;
    }
    EncodeOrdinary(utf8.substr(segment_start, pos - segment_start), &cache, &out);
    out.push_back(match);
    pos += tokens_[match].size();
    segment_start = pos;
  }
  EncodeOrdinary(utf8.substr(segment_start), &cache, &out);
  return out;
}

std::string BpeTokenizer::Decode(absl::Span<const int32_t> ids) const {
  if (hf_ != nullptr) return DecodeHf(ids);
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (IsSpecial(id)) {
      out += tokens_[id];
    } else {
      out += TokenToBytes(tokens_[id]);
    }
  }
  return out;
}

}  // namespace lspo::model
