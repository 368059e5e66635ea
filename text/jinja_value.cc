// The values of the Jinja interpreter (text/jinja.h's Value) and the Python semantics of
// their text: UTF-8 code points, str.isspace / strip, repr() of strings and floats, str() of
// any value (Value::ToString) and json.dumps (the tojson filter).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status_macros.h"
#include "text/jinja.h"
#include "text/jinja_internal.h"

namespace lspo::model::jinja {

// ---------------------------------------------------------------------------------------------
// Value

Value Value::Undefined(std::string name) {
  Value v;
  v.s_ = std::move(name);
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::Str(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::move(s);
  return v;
}
Value Value::MakeList(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::MakeTuple(List items) {
  Value v = MakeList(std::move(items));
  v.is_tuple_ = true;
  return v;
}
Value Value::MakeDict(Dict items) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}
Value Value::Namespace(Dict items) {
  Value v = MakeDict(std::move(items));
  v.is_namespace_ = true;
  return v;
}
Value Value::Function(Callable fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<const Callable>(std::move(fn));
  return v;
}

Value Value::Get(absl::string_view key) const {
  if (kind_ == Kind::kDict) {
    for (const auto& [k, v] : *dict_) {
      if (k == key) return v;
    }
  }
  return Undefined(std::string(key));
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->empty();
    case Kind::kCallable:
      return true;
  }
  return false;
}

namespace internal {

// ---------------------------------------------------------------------------------------------
// UTF-8 and Python string helpers

// Byte offsets of the code points of `s` (a final entry = s.size()). Invalid bytes count as one
// code point each.
std::vector<size_t> CodePointOffsets(absl::string_view s) {
  std::vector<size_t> at;
  at.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size();) {
    at.push_back(i);
    const auto c = static_cast<uint8_t>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + len > s.size()) len = 1;
    i += len;
  }
  at.push_back(s.size());
  return at;
}

// The code point at byte `i` of `s` and its length in bytes (1 for an invalid byte).
std::pair<uint32_t, size_t> DecodeAt(absl::string_view s, size_t i) {
  const auto c = static_cast<uint8_t>(s[i]);
  auto cont = [&](size_t k) {
    return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k]) & 0x3F);
  };
  if (c < 0x80) return {c, 1};
  if ((c >> 5) == 6 && i + 1 < s.size()) return {((c & 0x1Fu) << 6) | cont(1), 2};
  if ((c >> 4) == 14 && i + 2 < s.size())
    return {((c & 0x0Fu) << 12) | (cont(1) << 6) | cont(2), 3};
  if ((c >> 3) == 30 && i + 3 < s.size()) {
    return {((c & 0x07u) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3), 4};
  }
  return {c, 1};
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Python's str.isspace() for one code point.
bool IsPySpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Python's str.strip / lstrip / rstrip: `chars` unset = whitespace.
std::string PyStrip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  auto stripped = [&](uint32_t cp) {
    if (!chars.has_value()) return IsPySpace(cp);
    for (size_t j = 0; j < chars->size();) {
      auto [c, n] = DecodeAt(*chars, j);
      if (c == cp) return true;
      j += n;
    }
    return false;
  };
  const std::vector<size_t> at = CodePointOffsets(s);
  size_t b = 0, e = at.size() - 1;  // code point indices
  if (left) {
    while (b < e && stripped(DecodeAt(s, at[b]).first)) ++b;
  }
  if (right) {
    while (e > b && stripped(DecodeAt(s, at[e - 1]).first)) --e;
  }
  return std::string(s.substr(at[b], at[e] - at[b]));
}

std::string PyRepr(absl::string_view s) {
  const bool dq = s.find('\'') != absl::string_view::npos && s.find('"') == absl::string_view::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    const auto u = static_cast<uint8_t>(c);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == q) {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  out += q;
  return out;
}

// Python's repr(float).
std::string PyFloat(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-d.ddde+XX"
  const bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp10 = std::stoi(sci.substr(e + 1));
  std::string out = neg ? "-" : "";
  if (exp10 >= -5 && exp10 < 16) {
    if (exp10 < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp10 - 1), '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp10 + 1) {
      out += digits + std::string(static_cast<size_t>(exp10 + 1) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp10 + 1)) + "." +
             digits.substr(static_cast<size_t>(exp10 + 1));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char eb[16];
  std::snprintf(eb, sizeof(eb), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
  return out + eb;
}

const char* TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return v.is_namespace() ? "Namespace" : "dict";
    case Value::Kind::kCallable:
      return "function";
  }
  return "?";
}

std::string Repr(const Value& v) { return v.is_string() ? PyRepr(v.as_string()) : v.ToString(); }

}  // namespace internal

using internal::PyFloat;
using internal::PyRepr;
using internal::Repr;

std::string Value::ToString() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return PyFloat(f_);
    case Kind::kString:
      return s_;
    case Kind::kList: {
      std::vector<std::string> parts;
      for (const Value& x : *list_) parts.push_back(Repr(x));
      if (is_tuple_) {
        return absl::StrCat("(", absl::StrJoin(parts, ", "), parts.size() == 1 ? ",)" : ")");
      }
      return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
    }
    case Kind::kDict: {
      std::vector<std::string> parts;
      for (const auto& [k, x] : *dict_) parts.push_back(absl::StrCat(PyRepr(k), ": ", Repr(x)));
      return absl::StrCat(is_namespace_ ? "<Namespace " : "", "{", absl::StrJoin(parts, ", "), "}",
                          is_namespace_ ? ">" : "");
    }
    case Kind::kCallable:
      return "<function>";
  }
  return "";
}

namespace internal {
namespace {

// ---------------------------------------------------------------------------------------------
// JSON (Python's json.dumps with transformers' defaults: ensure_ascii=False)

void JsonString(absl::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    auto [cp, n] = DecodeAt(s, i);
    char buf[16];
    switch (cp) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
          if (cp >= 0x10000) {
            const uint32_t v = cp - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                          0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
          }
          *out += buf;
        } else {
          out->append(s.data() + i, n);
        }
    }
    i += n;
  }
  out->push_back('"');
}

}  // namespace

absl::Status JsonDump(const Value& v, const JsonStyle& st, int depth, std::string* out) {
  if (depth > 100) return absl::InvalidArgumentError("tojson: nesting deeper than 100");
  auto newline = [&](int d) {
    if (!st.indent.has_value()) return;
    out->push_back('\n');
    for (int k = 0; k < d; ++k) *out += *st.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      *out += std::to_string(v.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double f = v.as_float();
      *out += std::isnan(f)   ? "NaN"
              : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity")
                              : PyFloat(f);
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      JsonString(v.as_string(), st.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (v.as_list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      bool first = true;
      for (const Value& x : v.as_list()) {
        if (!first) *out += st.item_sep;
        first = false;
        newline(depth + 1);
        RETURN_IF_ERROR(JsonDump(x, st, depth + 1, out));
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (v.as_dict().empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      Value::Dict items = v.as_dict();
      if (st.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out->push_back('{');
      bool first = true;
      for (const auto& [k, x] : items) {
        if (!first) *out += st.item_sep;
        first = false;
        newline(depth + 1);
        JsonString(k, st.ensure_ascii, out);
        *out += st.key_sep;
        RETURN_IF_ERROR(JsonDump(x, st, depth + 1, out));
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
    case Value::Kind::kUndefined:
    case Value::Kind::kCallable:
      return absl::InvalidArgumentError(
          absl::StrCat("tojson: Object of type ", TypeName(v), " is not JSON serializable"));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace lspo::model::jinja
