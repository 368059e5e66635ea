// Internal to lspo_jinja (text/jinja*.cc); not part of the API, which is text/jinja.h.
//
// What the lexer, the parser, the renderer and the filters share: the limits of a parse and of a
// render, the tokens (jinja_lexer.cc), the parsed program (Expr, Node, Template::Program), the
// Python semantics of values (str, repr, json.dumps: jinja_value.cc), the value operations of
// the renderer (==, <, in, arithmetic, iteration, slices: jinja_render_expr.cc) and the names of
// the filters and tests (jinja_filters.cc). Semantics follow jinja2 3.x (lexer.py, parser.py,
// runtime.py, filters.py, tests.py) as configured by transformers' chat template utilities.
#ifndef LSPO_TEXT_JINJA_INTERNAL_H_
#define LSPO_TEXT_JINJA_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "text/jinja.h"

namespace lspo::model::jinja {
namespace internal {

// ---------------------------------------------------------------------------------------------
// Limits

// Blocks nested, and operators nested or chained in one expression, at most (parser).
constexpr int kMaxNesting = 200;
// The output, and any one string or list a render builds, at most (bytes).
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
// Loop iterations (and macro calls) of one render in all, at most.
constexpr int64_t kMaxIterations = 1'000'000;
// Macro calls nested at most.
constexpr int kMaxCallDepth = 100;
// Strings and lists one render may build in all (operators and filters), bytes: bounds the work
// of a template that builds 64 MiB values in a loop of 10^6 iterations.
constexpr size_t kMaxWorkBytes = size_t{1} << 30;

// ---------------------------------------------------------------------------------------------
// Lexer (jinja_lexer.cc)

enum class Tok { kName, kString, kInt, kFloat, kOp };

// One token of an expression or statement tag.
struct Token {
  Tok type;
  std::string text;  // name, operator, or the decoded string
  int64_t i = 0;
  double f = 0;
  int line = 0;
};

// A piece of the template: text, an {{ expression }} or a {% statement %} with its tokens.
struct Piece {
  enum class Kind { kText, kVar, kBlock } kind;
  std::string text;
  std::vector<Token> tokens;
  int line = 0;
};

// kInvalidArgument "chat template line <line>: <what>", the error of a failed parse.
absl::Status SyntaxError(int line, absl::string_view what);

// Splits `src` (newlines already normalised to "\n", one trailing newline dropped) into pieces,
// comments dropped, whitespace control, trim_blocks and lstrip_blocks applied as jinja2's lexer
// applies them. Errors: SyntaxError for an unterminated tag, comment or string, an unexpected
// character, an unbalanced bracket or an integer out of the 64-bit range.
absl::StatusOr<std::vector<Piece>> Lex(std::string src);

// ---------------------------------------------------------------------------------------------
// AST

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

// An expression node.
struct Expr {
  enum class Op {
    kLiteral,
    kName,
    kList,
    kDict,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kPos,
    kBinary,
    kCompare,
    kAnd,
    kOr,
    kCond
  };
  Op op = Op::kLiteral;
  int line = 0;
  Value literal;
  std::string name;           // name, attribute, filter, test, binary operator
  std::vector<ExprPtr> args;  // operands; for calls/filters/tests the subject first
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // comparison chain
  bool negated = false;          // "is not"
};

// A statement node (text, an output, or a block with its bodies).
struct Node {
  enum class Kind {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kGeneration,
    kBreak,
    kContinue,
    kMacro
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;                                                 // output, set value, for iterable
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;  // if; else has a null cond
  std::vector<std::string> targets;                             // for / set names; macro params
  std::string attr;                                             // set ns.attr
  ExprPtr filter;                                               // for ... if cond
  std::vector<Node> body, else_body;
  std::vector<ExprPtr> defaults;  // macro parameter defaults (may be null)
};

}  // namespace internal

// The parsed statements of a template (jinja_parser.cc builds them, jinja_render.cc runs them).
struct Template::Program {
  std::vector<internal::Node> nodes;
  bool has_generation = false;
};

namespace internal {

// ---------------------------------------------------------------------------------------------
// UTF-8 and Python string helpers (jinja_value.cc)

// Byte offsets of the code points of `s` (a final entry = s.size()). Invalid bytes count as one
// code point each.
std::vector<size_t> CodePointOffsets(absl::string_view s);
// The code point at byte `i` of `s` and its length in bytes (1 for an invalid byte).
std::pair<uint32_t, size_t> DecodeAt(absl::string_view s, size_t i);
// Appends the UTF-8 encoding of the code point `cp` to `out`.
void AppendUtf8(uint32_t cp, std::string* out);
// Python's str.isspace() for one code point.
bool IsPySpace(uint32_t cp);
// Python's str.strip / lstrip / rstrip: `chars` unset = whitespace.
std::string PyStrip(absl::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right);
// Python's repr(str): quoted, with Python's escapes.
std::string PyRepr(absl::string_view s);
// Python's repr(float).
std::string PyFloat(double f);
// Python's type(v).__name__ ("str", "int", "NoneType", "Undefined", ...).
const char* TypeName(const Value& v);
// Python's repr() of a value: repr for a string, str() for anything else.
std::string Repr(const Value& v);

// JSON (Python's json.dumps with transformers' defaults: ensure_ascii=False)
struct JsonStyle {
  std::optional<std::string> indent;  // unset: one line
  std::string item_sep = ", ";
  std::string key_sep = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};
// Appends json.dumps(v) in style `st` to `out` (`depth`: the nesting level of `v`).
// Errors: kInvalidArgument for nesting deeper than 100 or a value JSON cannot hold (undefined,
// a callable).
absl::Status JsonDump(const Value& v, const JsonStyle& st, int depth, std::string* out);

// ---------------------------------------------------------------------------------------------
// Value operations of the renderer (jinja_render_expr.cc)

// The memory `v` holds, in bytes, counted to at most `cap` (then any value above it): a
// string's bytes, 32 per item, element or key of a list or dict, recursively; items are held
// by value, so a list of copies of a long string counts every copy.
size_t ValueBytes(const Value& v, size_t cap);
// kInvalidArgument "chat template line <line>: <what>", the error of a failed render.
absl::Status RenderError(int line, absl::string_view what);
// The RenderError for using the undefined value `v` ("'name' is undefined").
absl::Status UndefinedError(int line, const Value& v);
// Python's ==.
bool Equals(const Value& a, const Value& b);
// Items for iteration (a dict gives its keys, a string its characters, undefined nothing).
absl::StatusOr<Value::List> Iterate(const Value& v, int line);
// -1, 0 or 1 as Python's < and > order two numbers or two strings; an error for other types.
absl::StatusOr<int> Compare3(const Value& a, const Value& b, int line);
// Python's `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item, int line);
// The binary operator `op` (+ - * / // % ** ~) on two values, with Python's semantics on
// 64-bit integers (an overflow is an error) and the size limits of a render.
absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a, const Value& b, int line);
// Python slice indices over a sequence of length n.
std::vector<int64_t> SliceIndices(int64_t n, const std::optional<int64_t>& start,
                                  const std::optional<int64_t>& stop, int64_t step);

// ---------------------------------------------------------------------------------------------
// Filters and tests (jinja_filters.cc)

// The filters and tests Renderer::ApplyFilter / ApplyTest implement; others are refused at
// parse time, as jinja2 refuses an unknown filter when it compiles a template.
bool KnownFilter(absl::string_view name);
bool KnownTest(absl::string_view name);

}  // namespace internal
}  // namespace lspo::model::jinja

#endif  // LSPO_TEXT_JINJA_INTERNAL_H_
