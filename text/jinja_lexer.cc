// The lexer of the Jinja interpreter: splits a template into text, {{ expression }} and
// {% statement %} pieces and tokenises the tags (names, numbers, Python string literals,
// operators), applying whitespace control, trim_blocks and lstrip_blocks as jinja2's lexer.py
// does for transformers' environment.
#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "runtime/status_macros.h"
#include "text/jinja_internal.h"

namespace lspo::model::jinja::internal {

absl::Status SyntaxError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
}

namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

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
        if (i + k >= body.size() ||
            !absl::ascii_isxdigit(static_cast<unsigned char>(body[i + k]))) {
          return std::nullopt;
        }
        const char h = body[i + k];
        v = v * 16 + static_cast<uint32_t>(
                         absl::ascii_isdigit(static_cast<unsigned char>(h))
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

// Splits one template into pieces and tokens (see Lex in jinja_internal.h).
class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  // The pieces of the whole template.
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
        if (close == std::string::npos)
          return SyntaxError(tag_line, "unterminated comment {# ... #}");
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
  // Adds the newlines of src_[from, to) to line_.
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
        while (j < src_.size() &&
               (absl::ascii_isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_'))
          ++j;
        if (j + 1 < src_.size() && src_[j] == '.' &&
            absl::ascii_isdigit(static_cast<unsigned char>(src_[j + 1]))) {
          is_float = true;
          ++j;
          while (j < src_.size() &&
                 (absl::ascii_isdigit(static_cast<unsigned char>(src_[j])) || src_[j] == '_'))
            ++j;
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
          if (r.ec != std::errc())
            return SyntaxError(line, absl::StrCat("integer ", num, " out of range"));
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
            return SyntaxError(line,
                               absl::StrCat("unexpected character '", std::string(1, c), "'"));
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

}  // namespace

absl::StatusOr<std::vector<Piece>> Lex(std::string src) { return Lexer(std::move(src)).Run(); }

}  // namespace lspo::model::jinja::internal
