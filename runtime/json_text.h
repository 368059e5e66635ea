// JSON values quoted in error messages without recursing through a hostile file's nesting.
//
// nlohmann's dump() writes a value recursively: a value nested ~10^5 levels deep (a few hundred
// KB of '[') overflows the stack. Parsers that quote a bad value in their error message use
// JsonForMessage, which writes a value nested at most kMaxQuotedDepth levels and names a deeper
// one by its type (fuzz/README.md, finding 2). Header only (CMake: lspo_base's include path;
// Bazel: //runtime:json_text).
//
// Thread-safety: pure functions.
#ifndef LSPO_RUNTIME_JSON_TEXT_H_
#define LSPO_RUNTIME_JSON_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace lspo::runtime {

// Deepest nesting JsonForMessage writes out.
inline constexpr int kMaxQuotedDepth = 16;

// True when `v` (nlohmann::json or ordered_json) nests at most `levels` arrays or objects
// (a scalar is 0 levels). Visits at most `levels` levels: bounded stack for any input.
template <typename Json>
bool JsonNestedAtMost(const Json& v, int levels) {
  if (!v.is_structured()) return true;
  if (levels <= 0) return false;
  for (const auto& child : v) {
    if (!JsonNestedAtMost(child, levels - 1)) return false;
  }
  return true;
}

// `v` as compact JSON text (invalid UTF-8 replaced by U+FFFD), cut to `max_chars` characters
// when > 0; a value nested deeper than kMaxQuotedDepth as "an array nested over 16 levels
// deep" (its type) instead.
template <typename Json>
std::string JsonForMessage(const Json& v, std::size_t max_chars = 0) {
  if (!JsonNestedAtMost(v, kMaxQuotedDepth)) {
    return absl::StrCat("an ", v.type_name(), " nested over ", kMaxQuotedDepth, " levels deep");
  }
  std::string text = v.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (max_chars > 0 && text.size() > max_chars) text.resize(max_chars);
  return text;
}

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_JSON_TEXT_H_
