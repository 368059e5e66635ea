// The model side of the Hugging Face tokenizer.json pipeline of BpeTokenizer (text/tokenizer.h):
// Encode of such a tokenizer (added tokens, normalizers, pre-tokenizers, then the BPE model with
// byte_fallback, unk_token / fuse_unk and ignore_merges) and Decode through its decoder chain
// (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace).
//
// Semantics follow the Hugging Face `tokenizers` Rust crate (0.2x): BPE::merge_word and
// Word::merge_all, and the decoders' decode_chain. See docs/formats.md §6a.
#include <unicode/umachine.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "text/tokenizer.h"
#include "text/tokenizer_internal.h"

namespace lspo::model {
namespace {

using internal::Alphabet;
using internal::HfDecoder;
using internal::HfPipeline;
using internal::NextCodePoint;
using internal::Normalize;
using internal::Piece;
using internal::PreTokenizeHf;
using internal::ReplaceAll;
using internal::SplitAdded;
using internal::Word;

constexpr size_t kCacheableWord = 256;  // words up to this many bytes are cached per Encode

// ---------------------------------------------------------------------------------------------
// Decoders (`tokenizers` decode_chain of each decoder; the result is joined with "").

// "<0xNN>" -> the byte, as ByteFallback reads it (u8::from_str_radix also takes "+N").
int ByteFallbackValue(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (t[3] == '+') return hex(t[4]);
  int hi = hex(t[3]);
  int lo = hex(t[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

void RunDecoder(const HfDecoder& d, std::vector<std::string>* tokens) {
  switch (d.kind) {
    case HfDecoder::Kind::kByteLevel: {
      // Each token's characters map back to bytes; a token with a character outside the
      // alphabet is kept as its UTF-8. The result is one string.
      const internal::ByteAlphabet& a = Alphabet();
      std::string joined;
      for (const std::string& t : *tokens) {
        std::string bytes;
        bool all = true;
        int32_t i = 0;
        while (i < static_cast<int32_t>(t.size())) {
          UChar32 cp = NextCodePoint(t, &i);
          if (cp < 0 || cp >= 512 || a.cp_to_byte[cp] < 0) {
            all = false;
            break;
          }
          bytes.push_back(static_cast<char>(a.cp_to_byte[cp]));
        }
        joined += all ? bytes : t;
      }
      tokens->assign(1, std::move(joined));
      break;
    }
    case HfDecoder::Kind::kReplace:
      for (std::string& t : *tokens) t = ReplaceAll(d.pattern, t, d.content);
      break;
    case HfDecoder::Kind::kByteFallback: {
      // Runs of <0xNN> tokens become their bytes (kept as they are when not UTF-8; HF writes
      // one U+FFFD per byte there).
      std::vector<std::string> out;
      std::string bytes;
      bool in_run = false;
      for (std::string& t : *tokens) {
        int b = ByteFallbackValue(t);
        if (b >= 0) {
          bytes.push_back(static_cast<char>(b));
          in_run = true;
          continue;
        }
        if (in_run) {
          out.push_back(std::move(bytes));
          bytes.clear();
          in_run = false;
        }
        out.push_back(std::move(t));
      }
      if (in_run) out.push_back(std::move(bytes));
      tokens->swap(out);
      break;
    }
    case HfDecoder::Kind::kFuse: {
      std::string joined = absl::StrJoin(*tokens, "");
      tokens->assign(1, std::move(joined));
      break;
    }
    case HfDecoder::Kind::kStrip: {
      for (std::string& t : *tokens) {
        // Strip up to `start` leading and `stop` trailing `content` characters.
        size_t begin = 0;
        size_t end = t.size();
        for (int32_t k = 0;
             k < d.start && absl::StartsWith(absl::string_view(t).substr(begin), d.content); ++k) {
          begin += d.content.size();
        }
        for (int32_t k = 0;
             k < d.stop && end >= begin + d.content.size() &&
             absl::EndsWith(absl::string_view(t).substr(begin, end - begin), d.content);
             ++k) {
          end -= d.content.size();
        }
        t = t.substr(begin, end - begin);
      }
      break;
    }
    case HfDecoder::Kind::kMetaspace: {
      for (size_t i = 0; i < tokens->size(); ++i) {
        absl::string_view with = (i == 0 && d.prepend) ? "" : " ";
        (*tokens)[i] = absl::StrReplaceAll((*tokens)[i], {{d.content, with}});
      }
      break;
    }
  }
}

}  // namespace

// -----------------------------------------------------------------------------------------------
void BpeTokenizer::EncodeHfWord(absl::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  const HfPipeline& p = *hf_;
  const internal::ByteAlphabet& alphabet = Alphabet();
  if (p.ignore_merges) {
    std::string key;
    if (p.byte_level) {
      for (char ch : word) key += alphabet.byte_to_utf8[static_cast<uint8_t>(ch)];
    }
    auto it = token_to_id_.find(p.byte_level ? absl::string_view(key) : word);
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  // BPE::merge_word: one symbol per character (per byte for ByteLevel).
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  bool pending_unk = false;
  auto unknown = [&](absl::string_view symbol) {
    if (p.byte_fallback) {
      std::vector<int32_t> bytes;
      for (char ch : symbol) {
        int32_t id = p.byte_token_id[static_cast<uint8_t>(ch)];
        if (id < 0) break;
        bytes.push_back(id);
      }
      if (bytes.size() == symbol.size()) {  // (a pending unk stays pending, as in tokenizers)
        symbols.insert(symbols.end(), bytes.begin(), bytes.end());
        return;
      }
    }
    if (p.model_unk_id < 0) return;  // no unk_token: dropped
    if (pending_unk && !p.fuse_unk) symbols.push_back(p.model_unk_id);
    pending_unk = true;
  };
  auto known = [&](int32_t id) {
    if (pending_unk) {
      symbols.push_back(p.model_unk_id);
      pending_unk = false;
    }
    symbols.push_back(id);
  };
  if (p.byte_level) {
    for (char ch : word) {
      int32_t id = byte_to_id_[static_cast<uint8_t>(ch)];
      if (id >= 0) {
        known(id);
      } else {
        unknown(alphabet.byte_to_utf8[static_cast<uint8_t>(ch)]);
      }
    }
  } else {
    int32_t i = 0;
    while (i < static_cast<int32_t>(word.size())) {
      int32_t start = i;
      NextCodePoint(word, &i);
      absl::string_view ch = word.substr(start, i - start);
      auto it = token_to_id_.find(ch);
      if (it != token_to_id_.end()) {
        known(it->second);
      } else {
        unknown(ch);
      }
    }
  }
  if (pending_unk) symbols.push_back(p.model_unk_id);
  ApplyMerges(std::move(symbols), out);
}

std::vector<int32_t> BpeTokenizer::EncodeHf(absl::string_view text) const {
  const HfPipeline& p = *hf_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 8);
  absl::flat_hash_map<std::string, std::vector<int32_t>> cache;
  std::vector<Word> words;
  auto encode_words = [&](const std::string& piece, bool first) {
    PreTokenizeHf(p, piece, first, &words);
    for (const Word& w : words) {
      if (w.text.size() > kCacheableWord) {
        EncodeHfWord(w.text, &out);
        continue;
      }
      auto it = cache.find(w.text);
      if (it == cache.end()) {
        std::vector<int32_t> ids;
        EncodeHfWord(w.text, &ids);
        it = cache.emplace(w.text, std::move(ids)).first;
      }
      out.insert(out.end(), it->second.begin(), it->second.end());
    }
  };
  std::vector<Piece> raw, normalized;
  SplitAdded(p, p.raw_matcher, text, &raw);
  for (const Piece& piece : raw) {
    if (piece.added_id >= 0) {
      out.push_back(piece.added_id);
      continue;
    }
    // The original offset of a normalized piece is that of its first character; a normalizer
    // that deletes leading characters is not tracked (none of the supported ones is used so).
    std::string norm = Normalize(p.normalizers, text.substr(piece.begin, piece.end - piece.begin));
    const bool first = piece.begin == 0;
    if (p.normalized_matcher.empty()) {
      encode_words(norm, first);
      continue;
    }
    SplitAdded(p, p.normalized_matcher, norm, &normalized);
    for (const Piece& sub : normalized) {
      if (sub.added_id >= 0) {
        out.push_back(sub.added_id);
      } else {
        encode_words(norm.substr(sub.begin, sub.end - sub.begin), first && sub.begin == 0);
      }
    }
  }
  return out;
}

std::string BpeTokenizer::DecodeHf(absl::Span<const int32_t> ids) const {
  const HfPipeline& p = *hf_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) continue;
    if (!p.normalized_added_text.empty()) {
      auto it = p.normalized_added_text.find(id);
      if (it != p.normalized_added_text.end()) {
        tokens.push_back(it->second);
        continue;
      }
    }
    tokens.push_back(tokens_[id]);
  }
  if (!p.has_decoder) return absl::StrJoin(tokens, " ");
  for (const HfDecoder& d : p.decoders) RunDecoder(d, &tokens);
  return absl::StrJoin(tokens, "");
}

}  // namespace lspo::model
