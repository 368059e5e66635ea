// Internal to lspo_jinja (text/jinja*.cc); not part of the API, which is text/jinja.h.
//
// The parser of the Jinja interpreter: builds a Template::Program from the pieces of Lex, as
// jinja2's parser.py does. Statements and the token helpers are in jinja_parser.cc, expressions
// (jinja2's operator precedence) in jinja_parser_expr.cc.
#ifndef LSPO_TEXT_JINJA_PARSER_H_
#define LSPO_TEXT_JINJA_PARSER_H_

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "text/jinja.h"
#include "text/jinja_internal.h"

namespace lspo::model::jinja::internal {

// Parses the pieces of one template. Errors: SyntaxError naming the line (an unexpected token,
// an unbalanced block, blocks or expressions nested deeper than kMaxNesting); kUnimplemented
// naming a statement outside the subset, a recursive loop, or an unknown filter or test.
class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  // Parses all the pieces into `prog` (its nodes and has_generation).
  absl::Status Run(Template::Program* prog);

 private:
  // ----- statements (jinja_parser.cc)
  // Parses nodes until a block tag whose keyword is in `stops` (returned in *stop, its tokens
  // left at toks_/pos_ after the keyword) or the end of the template (*stop empty).
  absl::Status ParseBody(const std::vector<std::string>& stops, std::vector<Node>* out,
                         std::string* stop);
  // The error for a block `what` opened at `line` whose end tag never came (`stop` empty).
  absl::Status Closed(const std::string& stop, absl::string_view what, int line);
  // The rest of an if / for / set / macro statement (its keyword read) and its bodies.
  absl::Status ParseIf(Node* n);
  absl::Status ParseFor(Node* n);
  absl::Status ParseSet(Node* n);
  absl::Status ParseMacro(Node* n);

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

  // ----- expressions (jinja2 parser.py's precedence; jinja_parser_expr.cc)
  // An expression, or a tuple of them without parentheses (`set a = 1, 2`).
  absl::StatusOr<ExprPtr> ParseTupleOrExpression();
  // An expression; with `with_cond`, `x if c else y` too.
  absl::StatusOr<ExprPtr> ParseExpression(bool with_cond);
  // The levels of the grammar, loosest first.
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  // A left-associative chain of the binary operators `ops` over operands parsed by `next`.
  absl::StatusOr<ExprPtr> ParseBinaryLevel(const std::vector<std::string>& ops,
                                           absl::StatusOr<ExprPtr> (Parser::*next)());
  absl::StatusOr<ExprPtr> ParseMath1();
  absl::StatusOr<ExprPtr> ParseConcat();
  absl::StatusOr<ExprPtr> ParseMath2();
  absl::StatusOr<ExprPtr> ParsePow();
  absl::StatusOr<ExprPtr> ParseUnaryF();
  // Unary - / +, then a primary with its postfixes (and its filters and tests `with_filter`).
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter);
  // A literal, a name, a parenthesised expression or tuple, a list or a dict.
  absl::StatusOr<ExprPtr> ParsePrimary();
  // The .attr, [key], [a:b:c] and (call) postfixes of `e`.
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e);
  // The arguments of a call, filter or test, positioned at '(': appended to `call`.
  absl::Status ParseCallArgs(Expr* call);
  // A call of `callee`, positioned at '('.
  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee);
  // The |filter, `is [not] test` and (call) postfixes of `e`.
  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr e);

  std::vector<Piece> pieces_;
  size_t p_ = 0;
  std::vector<Token>* toks_ = nullptr;
  size_t pos_ = 0;
  int line_ = 1;
  int nesting_ = 0;
  int depth_ = 0;
  bool has_generation_ = false;
};

}  // namespace lspo::model::jinja::internal

#endif  // LSPO_TEXT_JINJA_PARSER_H_
