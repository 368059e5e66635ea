// Jinja2 subset interpreter; see jinja.h. Semantics follow jinja2 3.x (lexer.py, parser.py,
// runtime.py, filters.py, tests.py) as configured by transformers' chat template utilities.
#include "model/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status_macros.h"
#include "runtime/utf8.h"

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

namespace {

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
  auto cont = [&](size_t k) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i + k]) & 0x3F); };
  if (c < 0x80) return {c, 1};
  if ((c >> 5) == 6 && i + 1 < s.size()) return {((c & 0x1Fu) << 6) | cont(1), 2};
  if ((c >> 4) == 14 && i + 2 < s.size()) return {((c & 0x0Fu) << 12) | (cont(1) << 6) | cont(2), 3};
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

std::string Repr(const Value& v) {
  return v.is_string() ? PyRepr(v.as_string()) : v.ToString();
}

}  // namespace

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
      return absl::StrCat(is_namespace_ ? "<Namespace " : "", "{", absl::StrJoin(parts, ", "),
                          "}", is_namespace_ ? ">" : "");
    }
    case Kind::kCallable:
      return "<function>";
  }
  return "";
}

namespace {

// ---------------------------------------------------------------------------------------------
// JSON (Python's json.dumps with transformers' defaults: ensure_ascii=False)

struct JsonStyle {
  std::optional<std::string> indent;  // unset: one line
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};

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
      *out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity") : PyFloat(f);
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

// ---------------------------------------------------------------------------------------------
// Lexer

enum class Tok { kName, kString, kInt, kFloat, kOp };

struct Token {
  Tok type;
  std::string text;  // name, operator, or the decoded string
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

struct Piece {
  enum class Kind { kText, kVar, kBlock } kind;
  std::string text;
  std::vector<Token> tokens;
  int line = 0;
};

absl::Status SyntaxError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Decodes a Python string literal body (the "unicode-escape" codec jinja2 applies).
std::string Unescape(absl::string_view body) {
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] != '\\' || i + 1 == body.size()) {
      out.push_back(body[i]);
      continue;
    }
    const char c = body[++i];
    auto hex = [&](size_t n) -> std::optional<uint32_t> {
      uint32_t v = 0;
      for (size_t k = 1; k <= n; ++k) {
        if (i + k >= body.size() || !absl::ascii_isxdigit(static_cast<unsigned char>(body[i + k]))) {
          return std::nullopt;
        }
        const char h = body[i + k];
        v = v * 16 + static_cast<uint32_t>(absl::ascii_isdigit(static_cast<unsigned char>(h))
                                               ? h - '0'
                                               : absl::ascii_tolower(static_cast<unsigned char>(h)) - 'a' + 10);
      }
      return v;
    };
    switch (c) {
      case '\n':
        break;  // line continuation
      case '\\':
        out.push_back('\\');
        break;
      case '\'':
        out.push_back('\'');
        break;
      case '"':
        out.push_back('"');
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        if (auto v = hex(n)) {
          AppendUtf8(*v, &out);
          i += n;
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          uint32_t v = 0;
          size_t k = 0;
          while (k < 3 && i + k < body.size() && body[i + k] >= '0' && body[i + k] <= '7') {
            v = v * 8 + static_cast<uint32_t>(body[i + k] - '0');
            ++k;
          }
          i += k - 1;
          AppendUtf8(v, &out);
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  absl::StatusOr<std::vector<Piece>> Run() {
    std::vector<Piece> pieces;
    size_t pos = 0;
    bool line_starting = true;
    bool strip_next = false;  // a '-' closed the previous tag
    while (pos < src_.size()) {
      size_t at = pos;
      while (true) {
        at = src_.find('{', at);
        if (at == std::string::npos || at + 1 >= src_.size()) {
          at = std::string::npos;
          break;
        }
        const char k = src_[at + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++at;
      }
      std::string text = src_.substr(pos, at == std::string::npos ? std::string::npos : at - pos);
      const int text_line = line_;
      CountLines(pos, at == std::string::npos ? src_.size() : at);
      if (strip_next) {
        size_t b = 0;
        while (b < text.size() && IsAsciiSpace(text[b])) ++b;
        text.erase(0, b);
      }
      if (at == std::string::npos) {
        if (!text.empty()) pieces.push_back({Piece::Kind::kText, std::move(text), {}, text_line});
        break;
      }
      const char kind = src_[at + 1];
      const char lmod = at + 2 < src_.size() ? src_[at + 2] : '\0';
      if (lmod == '-') {
        while (!text.empty() && IsAsciiSpace(text.back())) text.pop_back();
      } else if ((kind == '%' || kind == '#') && lmod != '+') {
        // lstrip_blocks: spaces and tabs from the start of the line up to the tag.
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = l_pos < text.size();
          for (size_t j = l_pos; j < text.size(); ++j) blank = blank && IsAsciiSpace(text[j]);
          if (blank) text.resize(l_pos);
        }
      }
      if (!text.empty()) pieces.push_back({Piece::Kind::kText, std::move(text), {}, text_line});
      size_t i = at + 2 + ((lmod == '-' || lmod == '+') ? 1 : 0);
      const int tag_line = line_;
      char rmod = '\0';
      size_t end = 0;
      if (kind == '#') {
        const size_t close = src_.find("#}", i);
        if (close == std::string::npos) return SyntaxError(tag_line, "unterminated comment {# ... #}");
        if (close > i && (src_[close - 1] == '-' || src_[close - 1] == '+')) rmod = src_[close - 1];
        end = close + 2;
      } else {
        Piece p{kind == '{' ? Piece::Kind::kVar : Piece::Kind::kBlock, "", {}, tag_line};
        ASSIGN_OR_RETURN(end, LexTag(i, kind, &p.tokens, &rmod));
        pieces.push_back(std::move(p));
      }
      CountLines(at, end);
      strip_next = rmod == '-';
      if (kind != '{' && rmod != '+' && rmod != '-' && end < src_.size() && src_[end] == '\n') {
        ++end;  // trim_blocks
        ++line_;
      }
      line_starting = end > 0 && src_[end - 1] == '\n';
      if (strip_next) {
        // jinja2 consumes the whitespace with the tag end; line_starting follows it.
        size_t e = end;
        while (e < src_.size() && IsAsciiSpace(src_[e])) ++e;
        line_starting = e > 0 && src_[e - 1] == '\n';
      }
      pos = end;
    }
    return pieces;
  }

 private:
  void CountLines(size_t from, size_t to) {
    for (size_t j = from; j < to && j < src_.size(); ++j) line_ += src_[j] == '\n';
  }

  // Tokenises an expression or statement tag from `i` to its closing delimiter; returns the
  // index just past it.
  absl::StatusOr<size_t> LexTag(size_t i, char kind, std::vector<Token>* out, char* rmod) {
    const std::string close = kind == '{' ? "}}" : "%}";
    int depth = 0;
    int line = line_;
    while (true) {
      while (i < src_.size() && IsAsciiSpace(src_[i])) line += src_[i++] == '\n';
      if (i >= src_.size()) {
        return SyntaxError(line_, absl::StrCat("unterminated tag: no closing ", close));
      }
      if (depth == 0) {
        if ((src_[i] == '-' || src_[i] == '+') && src_.compare(i + 1, 2, close) == 0) {
          *rmod = src_[i];
          return i + 3;
        }
        if (src_.compare(i, 2, close) == 0) return i + 2;
      }
      const char c = src_[i];
      Token t;
      t.line = line;
      if (absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t j = i;
        while (j < src_.size() &&
               (absl::ascii_isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) {
          ++j;
        }
        t.type = Tok::kName;
        t.text = src_.substr(i, j - i);
        i = j;
      } else if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
        size_t j = i;
        bool is_float = false;
        while (j < src_.size() && (absl::ascii_isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
        if (j + 1 < src_.size() && src_[j] == '.' &&
            absl::ascii_isdigit(static_cast<unsigned char>(src_[j + 1]))) {
          is_float = true;
          ++j;
          while (j < src_.size() && (absl::ascii_isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) ++j;
        }
        if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
          size_t k = j + 1;
          if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < src_.size() && absl::ascii_isdigit(static_cast<unsigned char>(src_[k]))) {
            is_float = true;
            j = k;
            while (j < src_.size() && absl::ascii_isdigit(static_cast<unsigned char>(src_[j]))) ++j;
          }
        }
        std::string num = src_.substr(i, j - i);
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        t.type = is_float ? Tok::kFloat : Tok::kInt;
        t.text = num;
        if (is_float) {
          t.f = std::strtod(num.c_str(), nullptr);
        } else {
          auto r = std::from_chars(num.data(), num.data() + num.size(), t.i);
          if (r.ec != std::errc()) return SyntaxError(line, absl::StrCat("integer ", num, " out of range"));
        }
        i = j;
      } else if (c == '\'' || c == '"') {
        size_t j = i + 1;
        while (j < src_.size() && src_[j] != c) {
          if (src_[j] == '\\') ++j;
          ++j;
        }
        if (j >= src_.size()) return SyntaxError(line, "unterminated string literal");
        t.type = Tok::kString;
        t.text = Unescape(absl::string_view(src_).substr(i + 1, j - i - 1));
        for (size_t k = i; k < j; ++k) line += src_[k] == '\n';
        i = j + 1;
      } else {
        static const char* kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        t.type = Tok::kOp;
        for (const char* op : kTwo) {
          if (src_.compare(i, 2, op) == 0) t.text = op;
        }
        if (t.text.empty()) {
          if (std::strchr("+-*/%~<>=()[]{},.:|", c) == nullptr) {
            return SyntaxError(line, absl::StrCat("unexpected character '", std::string(1, c), "'"));
          }
          t.text = std::string(1, c);
        }
        if (c == '(' || c == '[' || c == '{') ++depth;
        if (c == ')' || c == ']' || c == '}') {
          if (--depth < 0) return SyntaxError(line, absl::StrCat("unbalanced '", t.text, "'"));
        }
        i += t.text.size();
      }
      out->push_back(std::move(t));
    }
  }

  std::string src_;
  int line_ = 1;
};

// ---------------------------------------------------------------------------------------------
// AST

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Op {
    kLiteral, kName, kList, kDict, kAttr, kItem, kSlice, kCall, kFilter, kTest,
    kNot, kNeg, kPos, kBinary, kCompare, kAnd, kOr, kCond
  };
  Op op = Op::kLiteral;
  int line = 0;
  Value literal;
  std::string name;                // name, attribute, filter, test, binary operator
  std::vector<ExprPtr> args;       // operands; for calls/filters/tests the subject first
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;    // comparison chain
  bool negated = false;            // "is not"
};

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kGeneration, kBreak, kContinue, kMacro };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;                                             // output, set value, for iterable
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;  // if; else has a null cond
  std::vector<std::string> targets;                         // for / set names; macro params
  std::string attr;                                         // set ns.attr
  ExprPtr filter;                                           // for ... if cond
  std::vector<Node> body, else_body;
  std::vector<ExprPtr> defaults;                            // macro parameter defaults (may be null)
};

}  // namespace

struct Template::Program {
  std::vector<Node> nodes;
  bool has_generation = false;
};

namespace {

// ---------------------------------------------------------------------------------------------
// Parser

// The filters and tests Renderer::ApplyFilter / ApplyTest implement; others are refused at
// parse time, as jinja2 refuses an unknown filter when it compiles a template.
bool KnownFilter(absl::string_view name) {
  static const char* const kNames[] = {
      "abs", "capitalize", "count", "d", "default", "dictsort", "first", "float", "int",
      "items", "join", "last", "length", "list", "lower", "map", "reject", "rejectattr",
      "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum",
      "title", "tojson", "trim", "unique", "upper", "wordcount"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}
bool KnownTest(absl::string_view name) {
  static const char* const kNames[] = {
      "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "even", "false",
      "float", "ge", ">=", "greaterthan", "gt", ">", "in", "integer", "iterable", "le", "<=",
      "lessthan", "lower", "lt", "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas",
      "sequence", "string", "true", "undefined", "upper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  absl::Status Run(Template::Program* prog) {
    std::string end;
    RETURN_IF_ERROR(ParseBody({}, &prog->nodes, &end));
    prog->has_generation = has_generation_;
    return absl::OkStatus();
  }

 private:
  // ----- statements
  // Parses nodes until a block tag whose keyword is in `stops` (returned in *stop, its tokens
  // left at toks_/pos_ after the keyword) or the end of the template (*stop empty).
  absl::Status ParseBody(const std::vector<std::string>& stops, std::vector<Node>* out,
                         std::string* stop) {
    if (++nesting_ > kMaxNesting) return SyntaxError(line_, "blocks nested deeper than 200");
    while (p_ < pieces_.size()) {
      Piece& piece = pieces_[p_++];
      line_ = piece.line;
      if (piece.kind == Piece::Kind::kText) {
        Node n;
        n.kind = Node::Kind::kText;
        n.line = piece.line;
        n.text = std::move(piece.text);
        out->push_back(std::move(n));
        continue;
      }
      toks_ = &piece.tokens;
      pos_ = 0;
      if (piece.kind == Piece::Kind::kVar) {
        Node n;
        n.kind = Node::Kind::kOutput;
        n.line = piece.line;
        ASSIGN_OR_RETURN(n.expr, ParseExpression(true));
        RETURN_IF_ERROR(ExpectEnd());
        out->push_back(std::move(n));
        continue;
      }
      if (toks_->empty() || (*toks_)[0].type != Tok::kName) {
        return SyntaxError(piece.line, "a statement tag must start with a keyword");
      }
      const std::string kw = (*toks_)[0].text;
      pos_ = 1;
      if (std::find(stops.begin(), stops.end(), kw) != stops.end()) {
        *stop = kw;
        --nesting_;
        return absl::OkStatus();
      }
      Node n;
      n.line = piece.line;
      if (kw == "if") {
        RETURN_IF_ERROR(ParseIf(&n));
      } else if (kw == "for") {
        RETURN_IF_ERROR(ParseFor(&n));
      } else if (kw == "set") {
        RETURN_IF_ERROR(ParseSet(&n));
      } else if (kw == "generation") {
        RETURN_IF_ERROR(ExpectEnd());
        n.kind = Node::Kind::kGeneration;
        has_generation_ = true;
        std::string s;
        RETURN_IF_ERROR(ParseBody({"endgeneration"}, &n.body, &s));
        RETURN_IF_ERROR(Closed(s, "generation", n.line));
        RETURN_IF_ERROR(ExpectEnd());
      } else if (kw == "break" || kw == "continue") {
        RETURN_IF_ERROR(ExpectEnd());
        n.kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      } else if (kw == "macro") {
        RETURN_IF_ERROR(ParseMacro(&n));
      } else if (kw == "include" || kw == "import" || kw == "from" || kw == "extends" ||
                 kw == "block" || kw == "filter" || kw == "call" || kw == "raw" || kw == "with" ||
                 kw == "autoescape" || kw == "do" || kw == "trans") {
        return absl::UnimplementedError(absl::StrCat(
            "chat template line ", piece.line, ": the {% ", kw,
            " %} statement is not supported by this Jinja subset (model/jinja.h lists what is)"));
      } else {
        return SyntaxError(piece.line, absl::StrCat("unexpected statement '", kw, "'",
                                                     stops.empty() ? "" : absl::StrCat(
                                                         " (expected one of: ", absl::StrJoin(stops, ", "), ")")));
      }
      out->push_back(std::move(n));
    }
    if (!stops.empty()) {
      return SyntaxError(line_, absl::StrCat("unexpected end of template: missing {% ",
                                              stops.back(), " %}"));
    }
    --nesting_;
    return absl::OkStatus();
  }

  absl::Status Closed(const std::string& stop, absl::string_view what, int line) {
    if (stop.empty()) return SyntaxError(line, absl::StrCat("{% ", what, " %} is never closed"));
    return absl::OkStatus();
  }

  absl::Status ParseIf(Node* n) {
    n->kind = Node::Kind::kIf;
    ExprPtr cond;
    ASSIGN_OR_RETURN(cond, ParseExpression(true));
    RETURN_IF_ERROR(ExpectEnd());
    while (true) {
      std::vector<Node> body;
      std::string stop;
      RETURN_IF_ERROR(ParseBody({"elif", "else", "endif"}, &body, &stop));
      n->branches.emplace_back(std::move(cond), std::move(body));
      if (stop == "endif") return ExpectEnd();
      if (stop == "else") {
        RETURN_IF_ERROR(ExpectEnd());
        std::vector<Node> else_body;
        RETURN_IF_ERROR(ParseBody({"endif"}, &else_body, &stop));
        n->branches.emplace_back(nullptr, std::move(else_body));
        return ExpectEnd();
      }
      ASSIGN_OR_RETURN(cond, ParseExpression(true));  // elif
      RETURN_IF_ERROR(ExpectEnd());
    }
  }

  absl::Status ParseFor(Node* n) {
    n->kind = Node::Kind::kFor;
    const bool paren = AcceptOp("(");
    do {
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      n->targets.push_back(name);
    } while (AcceptOp(","));
    if (paren && !AcceptOp(")")) return SyntaxError(Line(), "expected ')' after the loop targets");
    if (!AcceptName("in")) return SyntaxError(Line(), "expected 'in' in the for statement");
    ASSIGN_OR_RETURN(n->expr, ParseExpression(false));
    if (AcceptName("if")) {
      ASSIGN_OR_RETURN(n->filter, ParseExpression(true));
    }
    if (AcceptName("recursive")) {
      return absl::UnimplementedError(absl::StrCat("chat template line ", n->line,
                                                   ": recursive for loops are not supported"));
    }
    RETURN_IF_ERROR(ExpectEnd());
    std::string stop;
    RETURN_IF_ERROR(ParseBody({"else", "endfor"}, &n->body, &stop));
    if (stop == "else") {
      RETURN_IF_ERROR(ExpectEnd());
      RETURN_IF_ERROR(ParseBody({"endfor"}, &n->else_body, &stop));
    }
    return ExpectEnd();
  }

  absl::Status ParseSet(Node* n) {
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    n->targets.push_back(name);
    if (AcceptOp(".")) {
      ASSIGN_OR_RETURN(n->attr, ExpectName());
    } else {
      while (AcceptOp(",")) {
        ASSIGN_OR_RETURN(std::string more, ExpectName());
        n->targets.push_back(more);
      }
    }
    if (AcceptOp("=")) {
      n->kind = Node::Kind::kSet;
      ASSIGN_OR_RETURN(n->expr, ParseTupleOrExpression());
      return ExpectEnd();
    }
    if (!n->attr.empty() || n->targets.size() != 1) {
      return SyntaxError(n->line, "expected '=' in the set statement");
    }
    n->kind = Node::Kind::kSetBlock;
    RETURN_IF_ERROR(ExpectEnd());
    std::string stop;
    RETURN_IF_ERROR(ParseBody({"endset"}, &n->body, &stop));
    return ExpectEnd();
  }

  absl::Status ParseMacro(Node* n) {
    n->kind = Node::Kind::kMacro;
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    n->targets.push_back(name);
    if (!AcceptOp("(")) return SyntaxError(Line(), "expected '(' after the macro name");
    if (!AcceptOp(")")) {
      do {
        ASSIGN_OR_RETURN(std::string param, ExpectName());
        n->targets.push_back(param);
        if (AcceptOp("=")) {
          ASSIGN_OR_RETURN(ExprPtr d, ParseExpression(true));
          n->defaults.push_back(std::move(d));
        } else {
          n->defaults.push_back(nullptr);
        }
      } while (AcceptOp(","));
      if (!AcceptOp(")")) return SyntaxError(Line(), "expected ')' after the macro parameters");
    }
    RETURN_IF_ERROR(ExpectEnd());
    std::string stop;
    RETURN_IF_ERROR(ParseBody({"endmacro"}, &n->body, &stop));
    return ExpectEnd();
  }

  // Each link of an operator chain (a + b + c, x.a.b, x|f|g, a or b or c) adds a level to the
  // expression tree that Eval recurses through: counted with the nesting depth, so that a long
  // flat chain is refused like a deep nesting instead of overflowing the stack.
  struct Chain {
    Parser* p;
    int links = 0;
    ~Chain() { p->depth_ -= links; }
    absl::Status Link() {
      ++links;
      if (++p->depth_ > kMaxNesting) {
        return SyntaxError(p->Line(), "expression longer or nested deeper than 200 operators");
      }
      return absl::OkStatus();
    }
  };

  // ----- token helpers
  const Token* Peek(size_t ahead = 0) const {
    return pos_ + ahead < toks_->size() ? &(*toks_)[pos_ + ahead] : nullptr;
  }
  int Line() const { return Peek() != nullptr ? Peek()->line : line_; }
  bool IsOp(absl::string_view op, size_t ahead = 0) const {
    const Token* t = Peek(ahead);
    return t != nullptr && t->type == Tok::kOp && t->text == op;
  }
  bool IsName(absl::string_view name, size_t ahead = 0) const {
    const Token* t = Peek(ahead);
    return t != nullptr && t->type == Tok::kName && t->text == name;
  }
  bool AcceptOp(absl::string_view op) {
    if (!IsOp(op)) return false;
    ++pos_;
    return true;
  }
  bool AcceptName(absl::string_view name) {
    if (!IsName(name)) return false;
    ++pos_;
    return true;
  }
  absl::StatusOr<std::string> ExpectName() {
    const Token* t = Peek();
    if (t == nullptr || t->type != Tok::kName) return SyntaxError(Line(), "expected a name");
    ++pos_;
    return t->text;
  }
  absl::Status ExpectEnd() {
    if (const Token* t = Peek()) {
      return SyntaxError(t->line, absl::StrCat("unexpected '", t->text, "'"));
    }
    return absl::OkStatus();
  }
  ExprPtr Make(Expr::Op op, int line) {
    auto e = std::make_unique<Expr>();
    e->op = op;
    e->line = line;
    return e;
  }

  // ----- expressions (jinja2 parser.py's precedence)
  absl::StatusOr<ExprPtr> ParseTupleOrExpression() {
    const int line = Line();
    ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(true));
    if (!IsOp(",")) return first;
    ExprPtr list = Make(Expr::Op::kList, line);
    list->name = "tuple";
    list->args.push_back(std::move(first));
    while (AcceptOp(",")) {
      if (Peek() == nullptr) break;
      ASSIGN_OR_RETURN(ExprPtr more, ParseExpression(true));
      list->args.push_back(std::move(more));
    }
    return list;
  }

  absl::StatusOr<ExprPtr> ParseExpression(bool with_cond) {
    if (++depth_ > kMaxNesting) return SyntaxError(Line(), "expression nested deeper than 200");
    ASSIGN_OR_RETURN(ExprPtr e, ParseOr());
    Chain chain{this};
    while (with_cond && IsName("if")) {
      RETURN_IF_ERROR(chain.Link());
      const int line = Line();
      ++pos_;
      ExprPtr c = Make(Expr::Op::kCond, line);
      ASSIGN_OR_RETURN(ExprPtr cond, ParseOr());
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      if (AcceptName("else")) {
        ASSIGN_OR_RETURN(ExprPtr other, ParseExpression(true));
        c->args.push_back(std::move(other));
      }
      e = std::move(c);
    }
    --depth_;
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseAnd());
    Chain chain{this};
    while (IsName("or")) {
      RETURN_IF_ERROR(chain.Link());
      ExprPtr o = Make(Expr::Op::kOr, Line());
      ++pos_;
      ASSIGN_OR_RETURN(ExprPtr r, ParseAnd());
      o->args.push_back(std::move(e));
      o->args.push_back(std::move(r));
      e = std::move(o);
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr e, ParseNot());
    Chain chain{this};
    while (IsName("and")) {
      RETURN_IF_ERROR(chain.Link());
      ExprPtr o = Make(Expr::Op::kAnd, Line());
      ++pos_;
      ASSIGN_OR_RETURN(ExprPtr r, ParseNot());
      o->args.push_back(std::move(e));
      o->args.push_back(std::move(r));
      e = std::move(o);
    }
    return e;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      if (++depth_ > kMaxNesting) return SyntaxError(Line(), "expression nested deeper than 200");
      ExprPtr n = Make(Expr::Op::kNot, Line());
      ++pos_;
      ASSIGN_OR_RETURN(ExprPtr x, ParseNot());
      n->args.push_back(std::move(x));
      --depth_;
      return n;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = Line();
    ASSIGN_OR_RETURN(ExprPtr e, ParseMath1());
    ExprPtr cmp;
    Chain chain{this};
    while (true) {
      std::string op;
      if (const Token* t = Peek(); t != nullptr && t->type == Tok::kOp &&
                                   (t->text == "==" || t->text == "!=" || t->text == "<" ||
                                    t->text == "<=" || t->text == ">" || t->text == ">=")) {
        op = t->text;
        ++pos_;
      } else if (IsName("in")) {
        op = "in";
        ++pos_;
      } else if (IsName("not") && IsName("in", 1)) {
        op = "notin";
        pos_ += 2;
      } else {
        break;
      }
      RETURN_IF_ERROR(chain.Link());
      if (cmp == nullptr) {
        cmp = Make(Expr::Op::kCompare, line);
        cmp->args.push_back(std::move(e));
      }
      ASSIGN_OR_RETURN(ExprPtr r, ParseMath1());
      cmp->args.push_back(std::move(r));
      cmp->ops.push_back(op);
    }
    return cmp != nullptr ? std::move(cmp) : std::move(e);
  }

  absl::StatusOr<ExprPtr> ParseBinaryLevel(const std::vector<std::string>& ops,
                                           absl::StatusOr<ExprPtr> (Parser::*next)()) {
    ASSIGN_OR_RETURN(ExprPtr e, (this->*next)());
    Chain chain{this};
    while (true) {
      const Token* t = Peek();
      if (t == nullptr || t->type != Tok::kOp ||
          std::find(ops.begin(), ops.end(), t->text) == ops.end()) {
        return e;
      }
      RETURN_IF_ERROR(chain.Link());
      ExprPtr b = Make(Expr::Op::kBinary, t->line);
      b->name = t->text;
      ++pos_;
      ASSIGN_OR_RETURN(ExprPtr r, (this->*next)());
      b->args.push_back(std::move(e));
      b->args.push_back(std::move(r));
      e = std::move(b);
    }
  }
  absl::StatusOr<ExprPtr> ParseMath1() { return ParseBinaryLevel({"+", "-"}, &Parser::ParseConcat); }
  absl::StatusOr<ExprPtr> ParseConcat() { return ParseBinaryLevel({"~"}, &Parser::ParseMath2); }
  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseBinaryLevel({"*", "/", "//", "%"}, &Parser::ParsePow);
  }
  absl::StatusOr<ExprPtr> ParsePow() { return ParseBinaryLevel({"**"}, &Parser::ParseUnaryF); }
  absl::StatusOr<ExprPtr> ParseUnaryF() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    if (++depth_ > kMaxNesting) return SyntaxError(Line(), "expression nested deeper than 200");
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      e = Make(IsOp("-") ? Expr::Op::kNeg : Expr::Op::kPos, Line());
      ++pos_;
      ASSIGN_OR_RETURN(ExprPtr x, ParseUnary(false));
      e->args.push_back(std::move(x));
    } else {
      ASSIGN_OR_RETURN(e, ParsePrimary());
    }
    ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    if (with_filter) {
      ASSIGN_OR_RETURN(e, ParseFilterExpr(std::move(e)));
    }
    --depth_;
    return e;
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    const Token* t = Peek();
    if (t == nullptr) return SyntaxError(line_, "expected an expression");
    const int line = t->line;
    if (t->type == Tok::kName) {
      ++pos_;
      const std::string& n = t->text;
      ExprPtr e = Make(Expr::Op::kLiteral, line);
      if (n == "true" || n == "True") {
        e->literal = Value::Bool(true);
      } else if (n == "false" || n == "False") {
        e->literal = Value::Bool(false);
      } else if (n == "none" || n == "None") {
        e->literal = Value::None();
      } else {
        e->op = Expr::Op::kName;
        e->name = n;
      }
      return e;
    }
    if (t->type == Tok::kString) {
      std::string s;
      while (Peek() != nullptr && Peek()->type == Tok::kString) s += (*toks_)[pos_++].text;
      ExprPtr e = Make(Expr::Op::kLiteral, line);
      e->literal = Value::Str(std::move(s));
      return e;
    }
    if (t->type == Tok::kInt || t->type == Tok::kFloat) {
      ++pos_;
      ExprPtr e = Make(Expr::Op::kLiteral, line);
      e->literal = t->type == Tok::kInt ? Value::Int(t->i) : Value::Float(t->f);
      return e;
    }
    if (AcceptOp("(")) {
      if (AcceptOp(")")) {
        ExprPtr empty = Make(Expr::Op::kList, line);
        empty->name = "tuple";
        return empty;
      }
      ASSIGN_OR_RETURN(ExprPtr first, ParseExpression(true));
      if (AcceptOp(")")) return first;
      ExprPtr list = Make(Expr::Op::kList, line);
      list->name = "tuple";
      list->args.push_back(std::move(first));
      while (AcceptOp(",")) {
        if (IsOp(")")) break;
        ASSIGN_OR_RETURN(ExprPtr more, ParseExpression(true));
        list->args.push_back(std::move(more));
      }
      if (!AcceptOp(")")) return SyntaxError(Line(), "expected ')'");
      return list;
    }
    if (AcceptOp("[")) {
      ExprPtr list = Make(Expr::Op::kList, line);
      while (!IsOp("]")) {
        ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
        list->args.push_back(std::move(item));
        if (!AcceptOp(",")) break;
      }
      if (!AcceptOp("]")) return SyntaxError(Line(), "expected ']'");
      return list;
    }
    if (AcceptOp("{")) {
      ExprPtr dict = Make(Expr::Op::kDict, line);
      while (!IsOp("}")) {
        ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
        if (!AcceptOp(":")) return SyntaxError(Line(), "expected ':' in a dict literal");
        ASSIGN_OR_RETURN(ExprPtr val, ParseExpression(true));
        dict->args.push_back(std::move(key));
        dict->args.push_back(std::move(val));
        if (!AcceptOp(",")) break;
      }
      if (!AcceptOp("}")) return SyntaxError(Line(), "expected '}'");
      return dict;
    }
    return SyntaxError(line, absl::StrCat("unexpected '", t->text, "'"));
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
    Chain chain{this};
    while (true) {
      if (IsOp(".") || IsOp("[") || IsOp("(")) RETURN_IF_ERROR(chain.Link());
      if (IsOp(".")) {
        const int line = Line();
        ++pos_;
        const Token* t = Peek();
        if (t != nullptr && t->type == Tok::kInt) {
          ++pos_;
          ExprPtr item = Make(Expr::Op::kItem, line);
          ExprPtr key = Make(Expr::Op::kLiteral, line);
          key->literal = Value::Int(t->i);
          item->args.push_back(std::move(e));
          item->args.push_back(std::move(key));
          e = std::move(item);
          continue;
        }
        ASSIGN_OR_RETURN(std::string name, ExpectName());
        ExprPtr a = Make(Expr::Op::kAttr, line);
        a->name = name;
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (IsOp("[")) {
        const int line = Line();
        ++pos_;
        ExprPtr parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!IsOp(":") && !IsOp("]")) {
            ASSIGN_OR_RETURN(parts[k], ParseExpression(true));
          }
          if (k < 2 && AcceptOp(":")) {
            slice = true;
            continue;
          }
          break;
        }
        if (!AcceptOp("]")) return SyntaxError(Line(), "expected ']'");
        ExprPtr s = Make(slice ? Expr::Op::kSlice : Expr::Op::kItem, line);
        s->args.push_back(std::move(e));
        if (slice) {
          for (auto& p : parts) s->args.push_back(std::move(p));
        } else {
          if (parts[0] == nullptr) return SyntaxError(line, "empty subscript");
          s->args.push_back(std::move(parts[0]));
        }
        e = std::move(s);
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(e, ParseCall(std::move(e)));
      } else {
        return e;
      }
    }
  }

  absl::Status ParseCallArgs(Expr* call) {
    // Positioned at '('.
    ++pos_;
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**")) return SyntaxError(Line(), "*args / **kwargs are not supported");
      const Token* t = Peek();
      if (t != nullptr && t->type == Tok::kName && IsOp("=", 1)) {
        std::string key = t->text;
        pos_ += 2;
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        call->kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        ASSIGN_OR_RETURN(ExprPtr v, ParseExpression(true));
        call->args.push_back(std::move(v));
      }
      if (!AcceptOp(",")) break;
    }
    if (!AcceptOp(")")) return SyntaxError(Line(), "expected ')' after the arguments");
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    ExprPtr c = Make(Expr::Op::kCall, Line());
    c->args.push_back(std::move(callee));
    RETURN_IF_ERROR(ParseCallArgs(c.get()));
    return c;
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr e) {
    Chain chain{this};
    while (true) {
      if (IsOp("|") || IsName("is") || IsOp("(")) RETURN_IF_ERROR(chain.Link());
      if (IsOp("|")) {
        const int line = Line();
        ++pos_;
        ASSIGN_OR_RETURN(std::string name, ExpectName());
        while (AcceptOp(".")) {
          ASSIGN_OR_RETURN(std::string more, ExpectName());
          name += "." + more;
        }
        if (!KnownFilter(name)) {
          return absl::UnimplementedError(absl::StrCat(
              "chat template line ", line, ": no filter named '", name,
              "' in this Jinja subset (model/jinja.h lists the filters)"));
        }
        ExprPtr f = Make(Expr::Op::kFilter, line);
        f->name = name;
        f->args.push_back(std::move(e));
        if (IsOp("(")) RETURN_IF_ERROR(ParseCallArgs(f.get()));
        e = std::move(f);
      } else if (IsName("is")) {
        const int line = Line();
        ++pos_;
        ExprPtr t = Make(Expr::Op::kTest, line);
        t->negated = AcceptName("not");
        ASSIGN_OR_RETURN(t->name, ExpectName());
        while (AcceptOp(".")) {
          ASSIGN_OR_RETURN(std::string more, ExpectName());
          t->name += "." + more;
        }
        if (!KnownTest(t->name)) {
          return absl::UnimplementedError(absl::StrCat(
              "chat template line ", line, ": no test named '", t->name,
              "' in this Jinja subset (model/jinja.h lists the tests)"));
        }
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          RETURN_IF_ERROR(ParseCallArgs(t.get()));
        } else if (const Token* a = Peek();
                   a != nullptr && (a->type == Tok::kString || a->type == Tok::kInt ||
                                    a->type == Tok::kFloat || IsOp("[") || IsOp("{") ||
                                    (a->type == Tok::kName && a->text != "else" &&
                                     a->text != "or" && a->text != "and" && a->text != "if" &&
                                     a->text != "is" && a->text != "in" && a->text != "not"))) {
          ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
          ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
          t->args.push_back(std::move(arg));
        }
        e = std::move(t);
      } else if (IsOp("(")) {
        ASSIGN_OR_RETURN(e, ParseCall(std::move(e)));
      } else {
        return e;
      }
    }
  }

  std::vector<Piece> pieces_;
  size_t p_ = 0;
  std::vector<Token>* toks_ = nullptr;
  size_t pos_ = 0;
  int line_ = 1;
  int nesting_ = 0;
  int depth_ = 0;
  bool has_generation_ = false;
};

// ---------------------------------------------------------------------------------------------
// Evaluation

constexpr size_t kMaxOutputBytes = size_t{64} << 20;
constexpr int64_t kMaxIterations = 1'000'000;
constexpr int kMaxCallDepth = 100;
// Strings and lists one render may build in all (operators and filters), bytes: bounds the work
// of a template that builds 64 MiB values in a loop of 10^6 iterations.
constexpr size_t kMaxWorkBytes = size_t{1} << 30;

// The memory `v` holds, in bytes, counted to at most `cap` (then any value above it): a
// string's bytes, 32 per item, element or key of a list or dict, recursively; items are held
// by value, so a list of copies of a long string counts every copy.
size_t ValueBytes(const Value& v, size_t cap) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return v.as_string().size() + 32;
    case Value::Kind::kList: {
      size_t total = 32;
      for (const Value& x : v.as_list()) {
        total += ValueBytes(x, cap);
        if (total > cap) return total;
      }
      return total;
    }
    case Value::Kind::kDict: {
      size_t total = 32;
      for (const auto& [key, x] : v.as_dict()) {
        total += key.size() + 32 + ValueBytes(x, cap);
        if (total > cap) return total;
      }
      return total;
    }
    default:
      return 32;
  }
}

absl::Status RenderError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

absl::Status UndefinedError(int line, const Value& v) {
  return RenderError(line, absl::StrCat("'", v.as_string().empty() ? "value" : v.as_string(),
                                        "' is undefined"));
}

bool Equals(const Value& a, const Value& b) {
  using K = Value::Kind;
  if (a.is_number() && b.is_number()) {
    if (a.kind() != K::kFloat && b.kind() != K::kFloat) return a.as_int() == b.as_int();
    return a.as_float() == b.as_float();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case K::kUndefined:
    case K::kNone:
      return true;
    case K::kString:
      return a.as_string() == b.as_string();
    case K::kList: {
      if (a.as_list().size() != b.as_list().size()) return false;
      for (size_t i = 0; i < a.as_list().size(); ++i) {
        if (!Equals(a.as_list()[i], b.as_list()[i])) return false;
      }
      return true;
    }
    case K::kDict: {
      if (a.as_dict().size() != b.as_dict().size()) return false;
      for (const auto& [k, v] : a.as_dict()) {
        const Value other = b.Get(k);
        if (other.is_undefined() || !Equals(v, other)) return false;
      }
      return true;
    }
    case K::kCallable:
      return &a.as_callable() == &b.as_callable();
    default:
      return false;
  }
}

// Items for iteration (a dict gives its keys, a string its characters, undefined nothing).
absl::StatusOr<Value::List> Iterate(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value::List{};
    case Value::Kind::kList:
      return v.as_list();
    case Value::Kind::kDict: {
      Value::List keys;
      for (const auto& [k, x] : v.as_dict()) keys.push_back(Value::Str(k));
      return keys;
    }
    case Value::Kind::kString: {
      Value::List chars;
      const std::vector<size_t> at = CodePointOffsets(v.as_string());
      for (size_t i = 0; i + 1 < at.size(); ++i) {
        chars.push_back(Value::Str(v.as_string().substr(at[i], at[i + 1] - at[i])));
      }
      return chars;
    }
    default:
      return RenderError(line, absl::StrCat("'", TypeName(v), "' object is not iterable"));
  }
}

absl::StatusOr<int> Compare3(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() != Value::Kind::kFloat && b.kind() != Value::Kind::kFloat) {
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
    }
    return a.as_float() < b.as_float() ? -1 : a.as_float() > b.as_float() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_undefined()) return UndefinedError(line, a);
  if (b.is_undefined()) return UndefinedError(line, b);
  return RenderError(line, absl::StrCat("cannot compare '", TypeName(a), "' with '",
                                        TypeName(b), "'"));
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return RenderError(line, absl::StrCat("'in <string>' requires string as left operand, not ",
                                              TypeName(item)));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& x : container.as_list()) {
        if (Equals(x, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return item.is_string() && !container.Get(item.as_string()).is_undefined();
    default:
      return RenderError(line, absl::StrCat("argument of type '", TypeName(container),
                                            "' is not iterable"));
  }
}

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "~") {
    std::string l = a.ToString(), r = b.ToString();
    if (l.size() + r.size() > kMaxOutputBytes) {
      return absl::ResourceExhaustedError("chat template: a string longer than 64 MiB");
    }
    return Value::Str(l + r);
  }
  if (a.is_undefined()) return UndefinedError(line, a);
  if (b.is_undefined()) return UndefinedError(line, b);
  const bool ints = a.is_number() && b.is_number() && a.kind() != Value::Kind::kFloat &&
                    b.kind() != Value::Kind::kFloat;
  if (a.is_number() && b.is_number()) {
    const absl::Status overflow = RenderError(
        line, absl::StrCat("integer overflow in ", a.as_int(), " ", op, " ", b.as_int(),
                           " (Python's unbounded integers are not supported: 64-bit only)"));
    int64_t r = 0;
    if (ints && (op == "+" || op == "-" || op == "*")) {
      const bool over = op == "+" ? __builtin_add_overflow(a.as_int(), b.as_int(), &r)
                        : op == "-" ? __builtin_sub_overflow(a.as_int(), b.as_int(), &r)
                                    : __builtin_mul_overflow(a.as_int(), b.as_int(), &r);
      if (over) return overflow;
      return Value::Int(r);
    }
    if (op == "+") return Value::Float(a.as_float() + b.as_float());
    if (op == "-") return Value::Float(a.as_float() - b.as_float());
    if (op == "*") return Value::Float(a.as_float() * b.as_float());
    if (op == "**") {
      if (ints && b.as_int() >= 0) {
        const int64_t base = a.as_int(), exp = b.as_int();
        if (base == 0) return Value::Int(exp == 0 ? 1 : 0);
        if (base == 1) return Value::Int(1);
        if (base == -1) return Value::Int(exp % 2 == 0 ? 1 : -1);
        r = 1;  // |base| >= 2: overflows within 63 factors
        for (int64_t k = 0; k < exp; ++k) {
          if (__builtin_mul_overflow(r, base, &r)) return overflow;
        }
        return Value::Int(r);
      }
      return Value::Float(std::pow(a.as_float(), b.as_float()));
    }
    if (b.as_float() == 0) return RenderError(line, "division by zero");
    if (ints && b.as_int() == -1 && a.as_int() == INT64_MIN && (op == "//" || op == "%")) {
      return overflow;
    }
    if (op == "/") return Value::Float(a.as_float() / b.as_float());
    if (op == "//") {
      return ints ? Value::Int(FloorDiv(a.as_int(), b.as_int()))
                  : Value::Float(std::floor(a.as_float() / b.as_float()));
    }
    if (op == "%") {
      if (ints) return Value::Int(a.as_int() - b.as_int() * FloorDiv(a.as_int(), b.as_int()));
      const double m = std::fmod(a.as_float(), b.as_float());
      return Value::Float(m != 0 && ((m < 0) != (b.as_float() < 0)) ? m + b.as_float() : m);
    }
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    if (a.as_string().size() + b.as_string().size() > kMaxOutputBytes) {
      return absl::ResourceExhaustedError("chat template: a string longer than 64 MiB");
    }
    return Value::Str(a.as_string() + b.as_string());
  }
  if (op == "+" && a.kind() == Value::Kind::kList && b.kind() == Value::Kind::kList) {
    if (a.as_list().size() + b.as_list().size() > static_cast<size_t>(kMaxIterations)) {
      return absl::ResourceExhaustedError("chat template: a list longer than 10^6 items");
    }
    if (ValueBytes(a, kMaxOutputBytes) + ValueBytes(b, kMaxOutputBytes) > kMaxOutputBytes) {
      return absl::ResourceExhaustedError("chat template: a list larger than 64 MiB");
    }
    Value::List l = a.as_list();
    l.insert(l.end(), b.as_list().begin(), b.as_list().end());
    return Value::MakeList(std::move(l));
  }
  if (op == "*" && (a.is_string() || a.kind() == Value::Kind::kList) && b.kind() == Value::Kind::kInt) {
    // Bytes per repetition: the string's, or every item of the list with what it holds.
    const size_t unit = a.is_string() ? a.as_string().size() : ValueBytes(a, kMaxOutputBytes);
    if (b.as_int() > 1'000'000 ||
        unit * static_cast<size_t>(std::max<int64_t>(b.as_int(), 0)) > kMaxOutputBytes) {
      return absl::ResourceExhaustedError("chat template: repetition larger than 64 MiB");
    }
    if (a.is_string()) {
      std::string s;
      for (int64_t k = 0; k < b.as_int(); ++k) s += a.as_string();
      return Value::Str(std::move(s));
    }
    Value::List l;
    for (int64_t k = 0; k < b.as_int(); ++k) l.insert(l.end(), a.as_list().begin(), a.as_list().end());
    return Value::MakeList(std::move(l));
  }
  return RenderError(line, absl::StrCat("unsupported operand types for ", op, ": '", TypeName(a),
                                        "' and '", TypeName(b), "'"));
}

// Python slice indices over a sequence of length n.
std::vector<int64_t> SliceIndices(int64_t n, const std::optional<int64_t>& start,
                                  const std::optional<int64_t>& stop, int64_t step) {
  auto clamp = [&](int64_t v, int64_t lo, int64_t hi) { return std::min(std::max(v, lo), hi); };
  std::vector<int64_t> out;
  if (step > 0) {
    int64_t b = start.has_value() ? (*start < 0 ? *start + n : *start) : 0;
    int64_t e = stop.has_value() ? (*stop < 0 ? *stop + n : *stop) : n;
    b = clamp(b, 0, n);
    e = clamp(e, 0, n);
    for (int64_t i = b; i < e; i += step) out.push_back(i);
  } else {
    int64_t b = start.has_value() ? (*start < 0 ? *start + n : *start) : n - 1;
    int64_t e = stop.has_value() ? (*stop < 0 ? *stop + n : *stop) : -1;
    b = clamp(b, -1, n - 1);
    e = clamp(e, -1, n - 1);
    if (!stop.has_value()) e = -1;
    for (int64_t i = b; i > e; i += step) out.push_back(i);
  }
  return out;
}

class Renderer;

// Argument access with Python-style positional-or-keyword parameters.
struct ArgReader {
  const Value::Args& args;
  const std::string& fn;
  int line;
  // The parameter at `index` or named `name`, or `fallback`.
  Value Get(size_t index, absl::string_view name, Value fallback = Value()) const {
    if (index < args.positional.size()) return args.positional[index];
    for (const auto& [k, v] : args.keyword) {
      if (k == name) return v;
    }
    return fallback;
  }
  absl::StatusOr<std::string> Str(size_t index, absl::string_view name) const {
    Value v = Get(index, name);
    if (!v.is_string()) {
      return RenderError(line, absl::StrCat(fn, "(): argument '", name, "' must be a string, not ",
                                            TypeName(v)));
    }
    return v.as_string();
  }
};

class Renderer {
 public:
  explicit Renderer(const Value::Dict& globals) {
    scopes_.emplace_back();
    auto& builtins = scopes_.back();
    builtins["range"] = Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
      int64_t start = 0, stop = 0, step = 1;
      for (const Value& v : a.positional) {
        if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool) {
          return absl::InvalidArgumentError("chat template: range() takes integers");
        }
      }
      if (a.positional.size() == 1) {
        stop = a.positional[0].as_int();
      } else if (a.positional.size() >= 2) {
        start = a.positional[0].as_int();
        stop = a.positional[1].as_int();
        if (a.positional.size() > 2) step = a.positional[2].as_int();
      }
      if (step == 0) return absl::InvalidArgumentError("chat template: range() step must not be zero");
      Value::List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= static_cast<size_t>(kMaxIterations)) {
          return absl::ResourceExhaustedError("chat template: range() longer than 10^6");
        }
        out.push_back(Value::Int(i));
      }
      return Value::MakeList(std::move(out));
    });
    builtins["namespace"] = Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
      Value::Dict d;
      for (const Value& p : a.positional) {
        if (p.kind() == Value::Kind::kDict) d.insert(d.end(), p.as_dict().begin(), p.as_dict().end());
      }
      d.insert(d.end(), a.keyword.begin(), a.keyword.end());
      return Value::Namespace(std::move(d));
    });
    builtins["dict"] = Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
      Value::Dict d;
      for (const Value& p : a.positional) {
        if (p.kind() == Value::Kind::kDict) d.insert(d.end(), p.as_dict().begin(), p.as_dict().end());
      }
      for (const auto& kv : a.keyword) d.push_back(kv);
      return Value::MakeDict(std::move(d));
    });
    scopes_.emplace_back();
    for (const auto& [k, v] : globals) scopes_.back()[k] = v;
    scopes_.emplace_back();  // the template's own top-level assignments
  }

  absl::Status Run(const std::vector<Node>& nodes, RenderOutput* result) {
    RETURN_IF_ERROR(RenderNodes(nodes));
    result->text = std::move(out_);
    result->generation_spans = std::move(spans_);
    return absl::OkStatus();
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::unordered_map<std::string, Value>;

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::Undefined(name);
  }

  // Adds what a built string or list holds to the render's work (kMaxWorkBytes in all).
  absl::Status CountWork(const Value& v) {
    if (!v.is_string() && v.kind() != Value::Kind::kList && v.kind() != Value::Kind::kDict) {
      return absl::OkStatus();
    }
    work_bytes_ += ValueBytes(v, kMaxWorkBytes);
    if (work_bytes_ > kMaxWorkBytes) {
      return absl::ResourceExhaustedError(
          "chat template: more than 1 GiB of strings and lists built in one render");
    }
    return absl::OkStatus();
  }

  absl::Status Emit(absl::string_view s) {
    out_.append(s.data(), s.size());
    if (out_.size() > kMaxOutputBytes) {
      return absl::ResourceExhaustedError("chat template: output larger than 64 MiB");
    }
    return absl::OkStatus();
  }

  absl::Status RenderNodes(const std::vector<Node>& nodes) {
    for (const Node& n : nodes) {
      RETURN_IF_ERROR(RenderNode(n));
      if (flow_ != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  absl::Status Assign(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      scopes_.back()[targets[0]] = v;
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
    if (items.size() != targets.size()) {
      return RenderError(line, absl::StrCat("cannot unpack ", items.size(), " values into ",
                                            targets.size(), " names"));
    }
    for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = items[i];
    return absl::OkStatus();
  }

  absl::Status RenderNode(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kText:
        return Emit(n.text);
      case Node::Kind::kOutput: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        return Emit(v.ToString());
      }
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          bool take = cond == nullptr;
          if (!take) {
            ASSIGN_OR_RETURN(Value c, Eval(*cond));
            take = c.Truthy();
          }
          if (take) return RenderNodes(body);
        }
        return absl::OkStatus();
      case Node::Kind::kFor:
        return RenderFor(n);
      case Node::Kind::kSet: {
        ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
        if (!n.attr.empty()) {
          Value ns = Lookup(n.targets[0]);
          if (!ns.is_namespace()) {
            return RenderError(n.line, absl::StrCat("cannot assign attribute on non-namespace '",
                                                    n.targets[0], "'"));
          }
          for (auto& [k, x] : ns.mutable_dict()) {
            if (k == n.attr) {
              x = v;
              return absl::OkStatus();
            }
          }
          ns.mutable_dict().emplace_back(n.attr, v);
          return absl::OkStatus();
        }
        return Assign(n.targets, v, n.line);
      }
      case Node::Kind::kSetBlock: {
        std::string saved = std::move(out_);
        out_.clear();
        absl::Status s = RenderNodes(n.body);
        std::string captured = std::move(out_);
        out_ = std::move(saved);
        RETURN_IF_ERROR(s);
        scopes_.back()[n.targets[0]] = Value::Str(std::move(captured));
        return absl::OkStatus();
      }
      case Node::Kind::kGeneration: {
        const size_t begin = out_.size();
        RETURN_IF_ERROR(RenderNodes(n.body));
        spans_.emplace_back(begin, out_.size());
        return absl::OkStatus();
      }
      case Node::Kind::kBreak:
      case Node::Kind::kContinue:
        if (loop_depth_ == 0) {
          return RenderError(n.line, "break / continue outside a for loop");
        }
        flow_ = n.kind == Node::Kind::kBreak ? Flow::kBreak : Flow::kContinue;
        return absl::OkStatus();
      case Node::Kind::kMacro:
        scopes_.back()[n.targets[0]] = MakeMacro(n);
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  Value MakeMacro(const Node& n) {
    const Node* node = &n;
    return Value::Function([this, node](const Value::Args& a) -> absl::StatusOr<Value> {
      if (++call_depth_ > kMaxCallDepth || ++calls_ > kMaxIterations) {
        --call_depth_;
        return absl::ResourceExhaustedError(
            "chat template: macro calls nested deeper than 100 or more than 10^6 in all");
      }
      Scope params;
      for (size_t i = 1; i < node->targets.size(); ++i) {
        const std::string& p = node->targets[i];
        Value v = i - 1 < a.positional.size() ? a.positional[i - 1] : Value::Undefined(p);
        for (const auto& [k, x] : a.keyword) {
          if (k == p) v = x;
        }
        if (v.is_undefined() && node->defaults[i - 1] != nullptr) {
          ASSIGN_OR_RETURN(v, Eval(*node->defaults[i - 1]));
        }
        params[p] = v;
      }
      std::vector<Scope> saved_scopes(scopes_.begin() + 3, scopes_.end());
      scopes_.resize(3);
      scopes_.push_back(std::move(params));
      std::string saved = std::move(out_);
      out_.clear();
      const int saved_loops = loop_depth_;
      loop_depth_ = 0;
      absl::Status s = RenderNodes(node->body);
      loop_depth_ = saved_loops;
      flow_ = Flow::kNormal;
      std::string captured = std::move(out_);
      out_ = std::move(saved);
      scopes_.resize(3);
      scopes_.insert(scopes_.end(), saved_scopes.begin(), saved_scopes.end());
      --call_depth_;
      RETURN_IF_ERROR(s);
      return Value::Str(std::move(captured));
    });
  }

  absl::Status RenderFor(const Node& n) {
    ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
    ASSIGN_OR_RETURN(Value::List all, Iterate(seq, n.line));
    scopes_.emplace_back();
    struct PopScope {
      std::vector<Scope>* s;
      ~PopScope() { s->pop_back(); }
    } pop{&scopes_};
    Value::List items;
    if (n.filter != nullptr) {
      for (const Value& v : all) {
        RETURN_IF_ERROR(Assign(n.targets, v, n.line));
        ASSIGN_OR_RETURN(Value keep, Eval(*n.filter));
        if (keep.Truthy()) items.push_back(v);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) return RenderNodes(n.else_body);
    ++loop_depth_;
    const int64_t len = static_cast<int64_t>(items.size());
    absl::Status status;
    for (int64_t i = 0; i < len; ++i) {
      if (++iterations_ > kMaxIterations) {
        status = absl::ResourceExhaustedError("chat template: loops ran more than 10^6 iterations");
        break;
      }
      scopes_.back().clear();  // jinja2: assignments in the body do not outlive an iteration
      status = Assign(n.targets, items[static_cast<size_t>(i)], n.line);
      if (!status.ok()) break;
      auto cycle = Value::Function([i](const Value::Args& a) -> absl::StatusOr<Value> {
        if (a.positional.empty()) return absl::InvalidArgumentError("chat template: loop.cycle() needs arguments");
        return a.positional[static_cast<size_t>(i) % a.positional.size()];
      });
      Value::Dict loop = {
          {"index0", Value::Int(i)},
          {"index", Value::Int(i + 1)},
          {"revindex0", Value::Int(len - i - 1)},
          {"revindex", Value::Int(len - i)},
          {"first", Value::Bool(i == 0)},
          {"last", Value::Bool(i == len - 1)},
          {"length", Value::Int(len)},
          {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undefined("loop.previtem")},
          {"nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::Undefined("loop.nextitem")},
          {"cycle", cycle},
      };
      scopes_.back()["loop"] = Value::MakeDict(std::move(loop));
      status = RenderNodes(n.body);
      if (!status.ok()) break;
      const Flow f = flow_;
      flow_ = Flow::kNormal;
      if (f == Flow::kBreak) break;
    }
    --loop_depth_;
    return status;
  }

  // ----- expressions

  absl::StatusOr<Value> Eval(const Expr& e) {
    switch (e.op) {
      case Expr::Op::kLiteral:
        return e.literal;
      case Expr::Op::kName:
        return Lookup(e.name);
      case Expr::Op::kList: {
        Value::List items;
        for (const auto& a : e.args) {
          ASSIGN_OR_RETURN(Value v, Eval(*a));
          items.push_back(std::move(v));
        }
        return e.name == "tuple" ? Value::MakeTuple(std::move(items)) : Value::MakeList(std::move(items));
      }
      case Expr::Op::kDict: {
        Value::Dict items;
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          ASSIGN_OR_RETURN(Value k, Eval(*e.args[i]));
          ASSIGN_OR_RETURN(Value v, Eval(*e.args[i + 1]));
          if (!k.is_string()) return RenderError(e.line, "dict literal keys must be strings");
          bool replaced = false;
          for (auto& [ek, ev] : items) {
            if (ek == k.as_string()) {
              ev = v;
              replaced = true;
            }
          }
          if (!replaced) items.emplace_back(k.as_string(), std::move(v));
        }
        return Value::MakeDict(std::move(items));
      }
      case Expr::Op::kAttr: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        return GetAttr(obj, e.name, e.line);
      }
      case Expr::Op::kItem: {
        ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value key, Eval(*e.args[1]));
        return GetItem(obj, key, e.line);
      }
      case Expr::Op::kSlice:
        return EvalSlice(e);
      case Expr::Op::kCall: {
        ASSIGN_OR_RETURN(Value fn, Eval(*e.args[0]));
        if (fn.kind() != Value::Kind::kCallable) {
          if (fn.is_undefined()) return UndefinedError(e.line, fn);
          return RenderError(e.line, absl::StrCat("'", TypeName(fn), "' object is not callable"));
        }
        ASSIGN_OR_RETURN(Value::Args args, EvalArgs(e, 1));
        absl::StatusOr<Value> r = fn.as_callable()(args);
        if (!r.ok() && r.status().code() == absl::StatusCode::kInvalidArgument &&
            !absl::StartsWith(r.status().message(), "chat template")) {
          return RenderError(e.line, r.status().message());
        }
        return r;
      }
      case Expr::Op::kFilter: {
        ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value::Args args, EvalArgs(e, 1));
        ASSIGN_OR_RETURN(Value r, ApplyFilter(e.name, subject, args, e.line));
        RETURN_IF_ERROR(CountWork(r));
        return r;
      }
      case Expr::Op::kTest: {
        ASSIGN_OR_RETURN(Value subject, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value::Args args, EvalArgs(e, 1));
        ASSIGN_OR_RETURN(bool r, ApplyTest(e.name, subject, args, e.line));
        return Value::Bool(r != e.negated);
      }
      case Expr::Op::kNot: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Op::kNeg:
      case Expr::Op::kPos: {
        ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
        if (v.is_undefined()) return UndefinedError(e.line, v);
        if (!v.is_number()) {
          return RenderError(e.line, absl::StrCat("bad operand type for unary ", e.op == Expr::Op::kNeg ? "-" : "+",
                                                  ": '", TypeName(v), "'"));
        }
        if (e.op == Expr::Op::kPos) return v.kind() == Value::Kind::kFloat ? v : Value::Int(v.as_int());
        return v.kind() == Value::Kind::kFloat ? Value::Float(-v.as_float()) : Value::Int(-v.as_int());
      }
      case Expr::Op::kBinary: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
        ASSIGN_OR_RETURN(Value r, Arithmetic(e.name, a, b, e.line));
        RETURN_IF_ERROR(CountWork(r));
        return r;
      }
      case Expr::Op::kCompare: {
        ASSIGN_OR_RETURN(Value left, Eval(*e.args[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          ASSIGN_OR_RETURN(Value right, Eval(*e.args[i + 1]));
          const std::string& op = e.ops[i];
          bool r = false;
          if (op == "==") {
            r = Equals(left, right);
          } else if (op == "!=") {
            r = !Equals(left, right);
          } else if (op == "in" || op == "notin") {
            ASSIGN_OR_RETURN(r, Contains(right, left, e.line));
            if (op == "notin") r = !r;
          } else {
            ASSIGN_OR_RETURN(int c, Compare3(left, right, e.line));
            r = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
          }
          if (!r) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
      case Expr::Op::kAnd: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (!a.Truthy()) return a;
        return Eval(*e.args[1]);
      }
      case Expr::Op::kOr: {
        ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
        if (a.Truthy()) return a;
        return Eval(*e.args[1]);
      }
      case Expr::Op::kCond: {
        ASSIGN_OR_RETURN(Value c, Eval(*e.args[1]));
        if (c.Truthy()) return Eval(*e.args[0]);
        if (e.args.size() > 2) return Eval(*e.args[2]);
        return Value::Undefined("the else branch");
      }
    }
    return RenderError(e.line, "internal: unknown expression");
  }

  absl::StatusOr<Value::Args> EvalArgs(const Expr& e, size_t first) {
    Value::Args args;
    for (size_t i = first; i < e.args.size(); ++i) {
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      ASSIGN_OR_RETURN(Value v, Eval(*x));
      args.keyword.emplace_back(k, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    ASSIGN_OR_RETURN(Value obj, Eval(*e.args[0]));
    std::optional<int64_t> part[3];
    for (int k = 0; k < 3; ++k) {
      if (e.args[static_cast<size_t>(k) + 1] == nullptr) continue;
      ASSIGN_OR_RETURN(Value v, Eval(*e.args[static_cast<size_t>(k) + 1]));
      if (v.is_none()) continue;
      if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool) {
        return RenderError(e.line, "slice indices must be integers or None");
      }
      part[k] = v.as_int();
    }
    const int64_t step = part[2].value_or(1);
    if (step == 0) return RenderError(e.line, "slice step cannot be zero");
    if (obj.is_undefined()) return UndefinedError(e.line, obj);
    if (obj.kind() == Value::Kind::kList) {
      Value::List out;
      for (int64_t i : SliceIndices(static_cast<int64_t>(obj.as_list().size()), part[0], part[1], step)) {
        out.push_back(obj.as_list()[static_cast<size_t>(i)]);
      }
      return Value::MakeList(std::move(out));
    }
    if (obj.is_string()) {
      const std::vector<size_t> at = CodePointOffsets(obj.as_string());
      std::string out;
      for (int64_t i : SliceIndices(static_cast<int64_t>(at.size()) - 1, part[0], part[1], step)) {
        out += obj.as_string().substr(at[static_cast<size_t>(i)], at[static_cast<size_t>(i) + 1] - at[static_cast<size_t>(i)]);
      }
      return Value::Str(std::move(out));
    }
    return RenderError(e.line, absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
  }

  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) return UndefinedError(line, obj);
    if (obj.kind() == Value::Kind::kDict) {
      if (!key.is_string()) return Value::Undefined(key.ToString());
      Value v = obj.Get(key.as_string());
      if (v.is_undefined()) {
        return Value::Undefined(absl::StrCat(obj.is_namespace() ? "namespace" : "dict", "[",
                                             PyRepr(key.as_string()), "]"));
      }
      return v;
    }
    if ((obj.kind() == Value::Kind::kList || obj.is_string()) &&
        (key.kind() == Value::Kind::kInt || key.kind() == Value::Kind::kBool)) {
      if (obj.kind() == Value::Kind::kList) {
        const int64_t n = static_cast<int64_t>(obj.as_list().size());
        int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
        if (i < 0 || i >= n) return Value::Undefined(absl::StrCat("list[", key.as_int(), "]"));
        return obj.as_list()[static_cast<size_t>(i)];
      }
      const std::vector<size_t> at = CodePointOffsets(obj.as_string());
      const int64_t n = static_cast<int64_t>(at.size()) - 1;
      int64_t i = key.as_int() < 0 ? key.as_int() + n : key.as_int();
      if (i < 0 || i >= n) return Value::Undefined(absl::StrCat("str[", key.as_int(), "]"));
      return Value::Str(obj.as_string().substr(at[static_cast<size_t>(i)],
                                               at[static_cast<size_t>(i) + 1] - at[static_cast<size_t>(i)]));
    }
    if (key.is_string()) return GetAttr(obj, key.as_string(), line);
    return Value::Undefined(key.ToString());
  }

  absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) return UndefinedError(line, obj);
    if (obj.is_string()) {
      if (Value m = StringMethod(obj.as_string(), name, line); !m.is_undefined()) return m;
      return Value::Undefined(absl::StrCat("str.", name));
    }
    if (obj.kind() == Value::Kind::kDict) {
      if (!obj.is_namespace()) {
        if (Value m = DictMethod(obj, name); !m.is_undefined()) return m;
      }
      Value v = obj.Get(name);
      if (v.is_undefined()) return Value::Undefined(name);
      return v;
    }
    return Value::Undefined(absl::StrCat(TypeName(obj), ".", name));
  }

  static Value DictMethod(const Value& obj, const std::string& name) {
    if (name == "items") {
      return Value::Function([obj](const Value::Args&) -> absl::StatusOr<Value> {
        Value::List out;
        for (const auto& [k, v] : obj.as_dict()) out.push_back(Value::MakeTuple({Value::Str(k), v}));
        return Value::MakeList(std::move(out));
      });
    }
    if (name == "keys" || name == "values") {
      const bool keys = name == "keys";
      return Value::Function([obj, keys](const Value::Args&) -> absl::StatusOr<Value> {
        Value::List out;
        for (const auto& [k, v] : obj.as_dict()) out.push_back(keys ? Value::Str(k) : v);
        return Value::MakeList(std::move(out));
      });
    }
    if (name == "get") {
      return Value::Function([obj](const Value::Args& a) -> absl::StatusOr<Value> {
        if (a.positional.empty() || !a.positional[0].is_string()) {
          return absl::InvalidArgumentError("dict.get() takes a string key");
        }
        Value v = obj.Get(a.positional[0].as_string());
        if (v.is_undefined()) return a.positional.size() > 1 ? a.positional[1] : Value::None();
        return v;
      });
    }
    return Value();
  }

  static Value StringMethod(const std::string& s, const std::string& name, int line) {
    auto chars_arg = [](const Value::Args& a) -> std::optional<std::string> {
      if (!a.positional.empty() && a.positional[0].is_string()) return a.positional[0].as_string();
      return std::nullopt;
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      const bool l = name != "rstrip", r = name != "lstrip";
      return Value::Function([s, l, r, chars_arg](const Value::Args& a) -> absl::StatusOr<Value> {
        return Value::Str(PyStrip(s, chars_arg(a), l, r));
      });
    }
    if (name == "upper" || name == "lower") {
      const bool up = name == "upper";
      return Value::Function([s, up](const Value::Args&) -> absl::StatusOr<Value> {
        return Value::Str(up ? absl::AsciiStrToUpper(s) : absl::AsciiStrToLower(s));
      });
    }
    if (name == "title" || name == "capitalize") {
      const bool title = name == "title";
      return Value::Function([s, title](const Value::Args&) -> absl::StatusOr<Value> {
        return Value::Str(title ? Title(s) : Capitalize(s));
      });
    }
    if (name == "startswith" || name == "endswith") {
      const bool starts = name == "startswith";
      return Value::Function([s, starts](const Value::Args& a) -> absl::StatusOr<Value> {
        if (a.positional.empty()) return absl::InvalidArgumentError("startswith/endswith need an argument");
        Value::List options = a.positional[0].kind() == Value::Kind::kList
                                  ? a.positional[0].as_list()
                                  : Value::List{a.positional[0]};
        for (const Value& o : options) {
          if (!o.is_string()) return absl::InvalidArgumentError("startswith/endswith take strings");
          if (starts ? absl::StartsWith(s, o.as_string()) : absl::EndsWith(s, o.as_string())) {
            return Value::Bool(true);
          }
        }
        return Value::Bool(false);
      });
    }
    if (name == "split") {
      return Value::Function([s](const Value::Args& a) -> absl::StatusOr<Value> {
        Value sep = a.positional.empty() ? Value::None() : a.positional[0];
        for (const auto& [k, v] : a.keyword) {
          if (k == "sep") sep = v;
        }
        int64_t maxsplit = a.positional.size() > 1 ? a.positional[1].as_int() : -1;
        Value::List out;
        if (sep.is_none()) {
          size_t i = 0;
          while (true) {
            while (i < s.size() && IsPySpace(static_cast<uint8_t>(s[i]))) ++i;
            if (i >= s.size()) break;
            if (maxsplit == 0) {
              std::string rest = s.substr(i);
              while (!rest.empty() && IsPySpace(static_cast<uint8_t>(rest.back()))) rest.pop_back();
              out.push_back(Value::Str(rest));
              break;
            }
            size_t j = i;
            while (j < s.size() && !IsPySpace(static_cast<uint8_t>(s[j]))) ++j;
            out.push_back(Value::Str(s.substr(i, j - i)));
            --maxsplit;
            i = j;
          }
          return Value::MakeList(std::move(out));
        }
        if (!sep.is_string() || sep.as_string().empty()) {
          return absl::InvalidArgumentError("str.split(): empty or non-string separator");
        }
        size_t i = 0;
        while (true) {
          const size_t j = maxsplit == 0 ? std::string::npos : s.find(sep.as_string(), i);
          if (j == std::string::npos) {
            out.push_back(Value::Str(s.substr(i)));
            break;
          }
          out.push_back(Value::Str(s.substr(i, j - i)));
          i = j + sep.as_string().size();
          --maxsplit;
        }
        return Value::MakeList(std::move(out));
      });
    }
    if (name == "splitlines") {
      return Value::Function([s](const Value::Args&) -> absl::StatusOr<Value> {
        Value::List out;
        size_t i = 0;
        while (i < s.size()) {
          size_t j = s.find_first_of("\r\n", i);
          if (j == std::string::npos) {
            out.push_back(Value::Str(s.substr(i)));
            break;
          }
          out.push_back(Value::Str(s.substr(i, j - i)));
          i = j + ((s[j] == '\r' && j + 1 < s.size() && s[j + 1] == '\n') ? 2 : 1);
        }
        return Value::MakeList(std::move(out));
      });
    }
    if (name == "replace") {
      return Value::Function([s](const Value::Args& a) -> absl::StatusOr<Value> {
        if (a.positional.size() < 2 || !a.positional[0].is_string() || !a.positional[1].is_string()) {
          return absl::InvalidArgumentError("str.replace() takes two strings");
        }
        const int64_t count = a.positional.size() > 2 ? a.positional[2].as_int() : -1;
        return Value::Str(Replace(s, a.positional[0].as_string(), a.positional[1].as_string(), count));
      });
    }
    if (name == "find" || name == "count") {
      const bool find = name == "find";
      return Value::Function([s, find](const Value::Args& a) -> absl::StatusOr<Value> {
        if (a.positional.empty() || !a.positional[0].is_string()) {
          return absl::InvalidArgumentError("str.find()/count() take a string");
        }
        const std::string& sub = a.positional[0].as_string();
        if (find) {
          const size_t at = s.find(sub);
          return Value::Int(at == std::string::npos ? -1 : static_cast<int64_t>(CodePointOffsets(s.substr(0, at)).size() - 1));
        }
        if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointOffsets(s).size()));
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value::Int(n);
      });
    }
    if (name == "join") {
      return Value::Function([s, line](const Value::Args& a) -> absl::StatusOr<Value> {
        if (a.positional.empty()) return absl::InvalidArgumentError("str.join() takes an iterable");
        ASSIGN_OR_RETURN(Value::List items, Iterate(a.positional[0], line));
        std::string out;
        for (size_t i = 0; i < items.size(); ++i) {
          if (!items[i].is_string()) return absl::InvalidArgumentError("str.join(): items must be strings");
          if (i > 0) out += s;
          out += items[i].as_string();
        }
        return Value::Str(std::move(out));
      });
    }
    return Value();
  }

  static std::string Replace(const std::string& s, const std::string& from, const std::string& to,
                             int64_t count) {
    if (from.empty()) return s;
    std::string out;
    size_t i = 0;
    while (count != 0) {
      const size_t j = s.find(from, i);
      if (j == std::string::npos) break;
      if (out.size() + (j - i) + to.size() > kMaxOutputBytes) break;  // bounded, as the output
      out.append(s, i, j - i);
      out += to;
      i = j + from.size();
      --count;
    }
    out.append(s, i, std::string::npos);
    return out;
  }

  static std::string Capitalize(const std::string& s) {
    std::string out = absl::AsciiStrToLower(s);
    if (!out.empty()) out[0] = absl::ascii_toupper(static_cast<unsigned char>(out[0]));
    return out;
  }

  static std::string Title(const std::string& s) {
    std::string out = s;
    bool prev_alpha = false;
    for (char& c : out) {
      const bool alpha = absl::ascii_isalpha(static_cast<unsigned char>(c));
      if (alpha) c = prev_alpha ? absl::ascii_tolower(static_cast<unsigned char>(c)) : absl::ascii_toupper(static_cast<unsigned char>(c));
      prev_alpha = alpha;
    }
    return out;
  }

  // ----- filters and tests

  absl::StatusOr<Value> AttrPath(const Value& v, const std::string& path, int line) {
    Value cur = v;
    size_t i = 0;
    while (i <= path.size()) {
      const size_t j = std::min(path.find('.', i), path.size());
      const std::string part = path.substr(i, j - i);
      if (cur.is_undefined()) return cur;
      if (!part.empty() && absl::ascii_isdigit(static_cast<unsigned char>(part[0])) &&
          cur.kind() == Value::Kind::kList) {
        ASSIGN_OR_RETURN(cur, GetItem(cur, Value::Int(std::stoll(part)), line));
      } else {
        ASSIGN_OR_RETURN(cur, GetItem(cur, Value::Str(part), line));
      }
      i = j + 1;
    }
    return cur;
  }

  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v,
                                    const Value::Args& args, int line) {
    ArgReader r{args, name, line};
    if (name == "trim") {
      Value chars = r.Get(0, "chars", Value::None());
      return Value::Str(PyStrip(v.ToString(),
                                chars.is_string() ? std::optional<std::string>(chars.as_string())
                                                  : std::nullopt,
                                true, true));
    }
    if (name == "length" || name == "count") {
      switch (v.kind()) {
        case Value::Kind::kUndefined:
          return Value::Int(0);
        case Value::Kind::kString:
          return Value::Int(static_cast<int64_t>(CodePointOffsets(v.as_string()).size()) - 1);
        case Value::Kind::kList:
          return Value::Int(static_cast<int64_t>(v.as_list().size()));
        case Value::Kind::kDict:
          return Value::Int(static_cast<int64_t>(v.as_dict().size()));
        default:
          return RenderError(line, absl::StrCat("object of type '", TypeName(v), "' has no len()"));
      }
    }
    if (name == "list") {
      ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
      return Value::MakeList(std::move(items));
    }
    if (name == "first" || name == "last") {
      ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
      if (items.empty()) return Value::Undefined(absl::StrCat("the ", name, " item of an empty sequence"));
      return name == "first" ? items.front() : items.back();
    }
    if (name == "join") {
      Value sep = r.Get(0, "d", Value::Str(""));
      Value attribute = r.Get(1, "attribute", Value::None());
      ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        Value x = items[i];
        if (attribute.is_string()) {
          ASSIGN_OR_RETURN(x, AttrPath(x, attribute.as_string(), line));
        }
        if (i > 0) out += sep.ToString();
        out += x.ToString();
      }
      return Value::Str(std::move(out));
    }
    if (name == "upper") return Value::Str(absl::AsciiStrToUpper(v.ToString()));
    if (name == "lower") return Value::Str(absl::AsciiStrToLower(v.ToString()));
    if (name == "capitalize") return Value::Str(Capitalize(v.ToString()));
    if (name == "title") return Value::Str(Title(v.ToString()));
    if (name == "replace") {
      ASSIGN_OR_RETURN(std::string from, r.Str(0, "old"));
      ASSIGN_OR_RETURN(std::string to, r.Str(1, "new"));
      Value count = r.Get(2, "count", Value::None());
      return Value::Str(Replace(v.ToString(), from, to, count.is_none() ? -1 : count.as_int()));
    }
    if (name == "default" || name == "d") {
      Value fallback = r.Get(0, "default_value", Value::Str(""));
      const bool boolean = r.Get(1, "boolean", Value::Bool(false)).Truthy();
      if (v.is_undefined() || (boolean && !v.Truthy())) return fallback;
      return v;
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool attr = name == "selectattr" || name == "rejectattr";
      const bool keep_if = name == "select" || name == "selectattr";
      ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
      std::string attribute;
      size_t test_at = 0;
      if (attr) {
        ASSIGN_OR_RETURN(attribute, r.Str(0, "attribute"));
        test_at = 1;
      }
      Value::Args test_args;
      std::string test;
      if (args.positional.size() > test_at) {
        if (!args.positional[test_at].is_string()) {
          return RenderError(line, absl::StrCat(name, "(): the test name must be a string"));
        }
        test = args.positional[test_at].as_string();
        test_args.positional.assign(args.positional.begin() + static_cast<ptrdiff_t>(test_at) + 1,
                                    args.positional.end());
      }
      Value::List out;
      for (const Value& x : items) {
        Value subject = x;
        if (attr) {
          ASSIGN_OR_RETURN(subject, AttrPath(x, attribute, line));
        }
        bool t = subject.Truthy();
        if (!test.empty()) {
          ASSIGN_OR_RETURN(t, ApplyTest(test, subject, test_args, line));
        }
        if (t == keep_if) out.push_back(x);
      }
      return Value::MakeList(std::move(out));
    }
    if (name == "map") {
      ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
      Value attribute = r.Get(99, "attribute", Value::None());
      Value::List out;
      if (attribute.is_string()) {
        Value fallback = r.Get(99, "default", Value());
        for (const Value& x : items) {
          ASSIGN_OR_RETURN(Value y, AttrPath(x, attribute.as_string(), line));
          out.push_back(y.is_undefined() && !fallback.is_undefined() ? fallback : y);
        }
        return Value::MakeList(std::move(out));
      }
      if (args.positional.empty() || !args.positional[0].is_string()) {
        return RenderError(line, "map() takes a filter name or attribute=");
      }
      Value::Args rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      for (const Value& x : items) {
        ASSIGN_OR_RETURN(Value y, ApplyFilter(args.positional[0].as_string(), x, rest, line));
        out.push_back(std::move(y));
      }
      return Value::MakeList(std::move(out));
    }
    if (name == "tojson") {
      JsonStyle st;
      Value indent = r.Get(0, "indent", Value::None());
      if (indent.kind() == Value::Kind::kInt) {
        st.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
      } else if (indent.is_string()) {
        st.indent = indent.as_string();
      }
      if (st.indent.has_value()) st.item_sep = ",";
      st.ensure_ascii = r.Get(99, "ensure_ascii", Value::Bool(false)).Truthy();
      st.sort_keys = r.Get(99, "sort_keys", Value::Bool(false)).Truthy();
      Value seps = r.Get(99, "separators", Value::None());
      if (seps.kind() == Value::Kind::kList && seps.as_list().size() == 2) {
        st.item_sep = seps.as_list()[0].ToString();
        st.key_sep = seps.as_list()[1].ToString();
      }
      std::string out;
      if (absl::Status s = JsonDump(v, st, 0, &out); !s.ok()) return RenderError(line, s.message());
      return Value::Str(std::move(out));
    }
    if (name == "string") return Value::Str(v.ToString());
    if (name == "safe") return v;
    if (name == "int" || name == "float") {
      const bool to_int = name == "int";
      Value fallback = r.Get(0, "default", to_int ? Value::Int(0) : Value::Float(0));
      if (v.is_number()) return to_int ? Value::Int(static_cast<int64_t>(v.as_float())) : Value::Float(v.as_float());
      if (v.is_string()) {
        const std::string s = PyStrip(v.as_string(), std::nullopt, true, true);
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size()) {
          return to_int ? Value::Int(static_cast<int64_t>(d)) : Value::Float(d);
        }
      }
      return fallback;
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::MakeList({});
      if (v.kind() != Value::Kind::kDict) {
        return RenderError(line, absl::StrCat("items(): a mapping is required, not ", TypeName(v)));
      }
      return DictMethod(v, "items").as_callable()(Value::Args{});
    }
    if (name == "dictsort") {
      if (v.kind() != Value::Kind::kDict) return RenderError(line, "dictsort(): a mapping is required");
      Value::Dict items = v.as_dict();
      std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
        return absl::AsciiStrToLower(a.first) < absl::AsciiStrToLower(b.first);
      });
      Value::List out;
      for (auto& [k, x] : items) out.push_back(Value::MakeTuple({Value::Str(k), x}));
      return Value::MakeList(std::move(out));
    }
    if (name == "abs") {
      if (!v.is_number()) return RenderError(line, "abs(): a number is required");
      return v.kind() == Value::Kind::kFloat ? Value::Float(std::fabs(v.as_float()))
                                             : Value::Int(std::llabs(v.as_int()));
    }
    if (name == "round") {
      if (!v.is_number()) return RenderError(line, "round(): a number is required");
      const int64_t precision = r.Get(0, "precision", Value::Int(0)).as_int();
      Value method = r.Get(1, "method", Value::Str("common"));
      const double scale = std::pow(10.0, static_cast<double>(precision));
      const double x = v.as_float() * scale;
      const std::string m = method.ToString();
      // Python's round() rounds half to even.
      const double y = m == "floor" ? std::floor(x) : m == "ceil" ? std::ceil(x) : std::nearbyint(x);
      return Value::Float(y / scale);
    }
    if (name == "reverse") {
      if (v.is_string()) {
        const std::vector<size_t> at = CodePointOffsets(v.as_string());
        std::string out;
        for (size_t i = at.size() - 1; i > 0; --i) out += v.as_string().substr(at[i - 1], at[i] - at[i - 1]);
        return Value::Str(std::move(out));
      }
      ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
      std::reverse(items.begin(), items.end());
      return Value::MakeList(std::move(items));
    }
    if (name == "sort" || name == "unique") {
      ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
      if (name == "unique") {
        Value::List out;
        for (const Value& x : items) {
          if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return Equals(x, y); })) {
            out.push_back(x);
          }
        }
        return Value::MakeList(std::move(out));
      }
      const bool reverse = r.Get(0, "reverse", Value::Bool(false)).Truthy();
      Value attribute = r.Get(2, "attribute", Value::None());
      std::vector<std::pair<Value, Value>> keyed;
      for (const Value& x : items) {
        Value key = x;
        if (attribute.is_string()) {
          ASSIGN_OR_RETURN(key, AttrPath(x, attribute.as_string(), line));
        }
        if (key.is_string()) key = Value::Str(absl::AsciiStrToLower(key.as_string()));
        keyed.emplace_back(key, x);
      }
      absl::Status err;
      std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        auto c = Compare3(a.first, b.first, line);
        if (!c.ok()) {
          err = c.status();
          return false;
        }
        return reverse ? *c > 0 : *c < 0;
      });
      RETURN_IF_ERROR(err);
      Value::List out;
      for (auto& [k, x] : keyed) out.push_back(x);
      return Value::MakeList(std::move(out));
    }
    if (name == "sum") {
      ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
      Value attribute = r.Get(0, "attribute", Value::None());
      Value total = r.Get(1, "start", Value::Int(0));
      for (const Value& x : items) {
        Value y = x;
        if (attribute.is_string()) {
          ASSIGN_OR_RETURN(y, AttrPath(x, attribute.as_string(), line));
        }
        ASSIGN_OR_RETURN(total, Arithmetic("+", total, y, line));
      }
      return total;
    }
    if (name == "wordcount") {
      int64_t n = 0;
      bool in_word = false;
      for (char c : v.ToString()) {
        const bool w = absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                       (static_cast<unsigned char>(c) & 0x80) != 0;
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value::Int(n);
    }
    return RenderError(line, absl::StrCat("no filter named '", name,
                                          "' in this Jinja subset (model/jinja.h lists the filters)"));
  }

  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const Value::Args& args,
                                 int line) {
    using K = Value::Kind;
    auto arg = [&]() { return args.positional.empty() ? Value() : args.positional[0]; };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind() == K::kInt;
    if (name == "float") return v.kind() == K::kFloat;
    if (name == "boolean") return v.kind() == K::kBool;
    if (name == "true") return v.kind() == K::kBool && v.as_bool();
    if (name == "false") return v.kind() == K::kBool && !v.as_bool();
    if (name == "mapping") return v.kind() == K::kDict;
    if (name == "iterable") {
      return v.kind() == K::kList || v.kind() == K::kDict || v.is_string() || v.is_undefined();
    }
    if (name == "sequence") return v.kind() == K::kList || v.kind() == K::kDict || v.is_string();
    if (name == "callable") return v.kind() == K::kCallable;
    if (name == "eq" || name == "equalto" || name == "==") return Equals(v, arg());
    if (name == "ne" || name == "!=") return !Equals(v, arg());
    if (name == "lt" || name == "<" || name == "le" || name == "<=" || name == "gt" ||
        name == ">" || name == "ge" || name == ">=" || name == "lessthan" || name == "greaterthan") {
      ASSIGN_OR_RETURN(int c, Compare3(v, arg(), line));
      if (name == "lt" || name == "<" || name == "lessthan") return c < 0;
      if (name == "le" || name == "<=") return c <= 0;
      if (name == "gt" || name == ">" || name == "greaterthan") return c > 0;
      return c >= 0;
    }
    if (name == "in") return Contains(arg(), v, line);
    if (name == "odd" || name == "even" || name == "divisibleby") {
      if (v.kind() != K::kInt && v.kind() != K::kBool) {
        return RenderError(line, absl::StrCat("the '", name, "' test needs an integer"));
      }
      if (name == "odd") return v.as_int() % 2 != 0;
      if (name == "even") return v.as_int() % 2 == 0;
      const Value d = arg();
      if ((d.kind() != K::kInt && d.kind() != K::kBool) || d.as_int() == 0) {
        return RenderError(line, "divisibleby needs a non-zero integer");
      }
      return v.as_int() % d.as_int() == 0;
    }
    if (name == "sameas") {
      const Value o = arg();
      if (v.kind() != o.kind()) return false;
      if (v.kind() == K::kNone || v.kind() == K::kUndefined) return true;
      if (v.kind() == K::kBool) return v.as_bool() == o.as_bool();
      return false;
    }
    if (name == "lower" || name == "upper") {
      const std::string s = v.ToString();
      return name == "lower" ? s == absl::AsciiStrToLower(s) : s == absl::AsciiStrToUpper(s);
    }
    return RenderError(line, absl::StrCat("no test named '", name,
                                          "' in this Jinja subset (model/jinja.h lists the tests)"));
  }

  std::vector<Scope> scopes_;
  std::string out_;
  std::vector<std::pair<size_t, size_t>> spans_;
  Flow flow_ = Flow::kNormal;
  int loop_depth_ = 0;
  int call_depth_ = 0;
  int64_t calls_ = 0;
  int64_t iterations_ = 0;
  size_t work_bytes_ = 0;  // CountWork
};

}  // namespace

absl::StatusOr<Template> Template::Parse(absl::string_view source) {
  // jinja2's lexer: newlines normalised to "\n", one trailing newline dropped.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  if (size_t bad = 0; !runtime::IsValidUtf8(src, &bad)) {
    const int line = 1 + static_cast<int>(std::count(src.begin(), src.begin() + static_cast<ptrdiff_t>(bad), '\n'));
    return SyntaxError(line, absl::StrCat("invalid UTF-8 at byte ", bad + 1,
                                          " of the template; chat templates are UTF-8 text"));
  }
  ASSIGN_OR_RETURN(std::vector<Piece> pieces, Lexer(std::move(src)).Run());
  auto prog = std::make_shared<Program>();
  RETURN_IF_ERROR(Parser(std::move(pieces)).Run(prog.get()));
  Template t;
  t.program_ = std::move(prog);
  return t;
}

absl::StatusOr<RenderOutput> Template::Render(const Value::Dict& globals) const {
  RenderOutput out;
  if (program_ == nullptr) return out;
  Renderer r(globals);
  RETURN_IF_ERROR(r.Run(program_->nodes, &out));
  return out;
}

bool Template::has_generation_blocks() const {
  return program_ != nullptr && program_->has_generation;
}

}  // namespace lspo::model::jinja
