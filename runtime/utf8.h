// UTF-8 validation (header-only, torch-free): used by the data readers (data/records.h) and
// the chat-template interpreter (text/jinja.h) to refuse ill-formed text with its offset, and
// the lossy repair of decoded text bound for protobuf strings (Utf8Lossy).
#ifndef LSPO_RUNTIME_UTF8_H_
#define LSPO_RUNTIME_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace lspo::runtime {

namespace internal {
// The sequence length a non-ASCII lead byte `c` starts (0: not a lead byte) and the allowed
// range [*lo, *hi] of its second byte (RFC 3629's table; callers set 0x80..0xBF first).
inline void LeadByte(uint8_t c, size_t* len, uint8_t* lo, uint8_t* hi) {
  if (c >= 0xC2 && c <= 0xDF) {
    *len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    *len = 3;
    if (c == 0xE0) *lo = 0xA0;
    if (c == 0xED) *hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    *len = 4;
    if (c == 0xF0) *lo = 0x90;
    if (c == 0xF4) *hi = 0x8F;
  }
}
}  // namespace internal

// True if `s` is well-formed UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above
// U+10FFFF). When false and `bad_at` is given, *bad_at is the byte offset of the first
// ill-formed sequence.
inline bool IsValidUtf8(absl::string_view s, size_t* bad_at = nullptr) {
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    internal::LeadByte(c, &len, &lo, &hi);
    bool ok = len > 0 && i + len <= n;
    if (ok) {
      const auto c1 = static_cast<uint8_t>(s[i + 1]);
      ok = c1 >= lo && c1 <= hi;
      for (size_t k = 2; ok && k < len; ++k) ok = (static_cast<uint8_t>(s[i + k]) & 0xC0) == 0x80;
    }
    if (!ok) {
      if (bad_at != nullptr) *bad_at = i;
      return false;
    }
    i += len;
  }
  return true;
}

// `s` with every ill-formed sequence replaced by U+FFFD, one per maximal subpart (Unicode
// 15.0, section 3.9, "U+FFFD Substitution of Maximal Subparts"; what Python's
// bytes.decode("utf-8", "replace") and Rust's String::from_utf8_lossy, hence `tokenizers`'
// ByteLevel decoder, give). Well-formed input is returned unchanged. For text that must be
// valid UTF-8 (protobuf string fields, JSON), e.g. a decoded generation cut mid-character.
inline std::string Utf8Lossy(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    size_t len = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    internal::LeadByte(c, &len, &lo, &hi);
    // The longest prefix of a well-formed sequence starting at i (at least the lead byte).
    size_t k = 1;
    if (len > 0 && i + 1 < n) {
      const auto c1 = static_cast<uint8_t>(s[i + 1]);
      if (c1 >= lo && c1 <= hi) {
        k = 2;
        while (k < len && i + k < n && (static_cast<uint8_t>(s[i + k]) & 0xC0) == 0x80) ++k;
      }
    }
    if (len > 0 && k == len) {
      out.append(s.data() + i, len);
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
    }
    i += k;
  }
  return out;
}

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_UTF8_H_
