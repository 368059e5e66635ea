// The expressions of the Jinja parser (Parser, jinja_parser.h), with jinja2 parser.py's
// precedence: conditional, or, and, not, comparisons and `in`, + -, ~, * / // %, **, unary
// - +, primaries with their postfixes (.attr, [key], [a:b:c], calls) and filters and tests.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/status_macros.h"
#include "text/jinja_internal.h"
#include "text/jinja_parser.h"

namespace lspo::model::jinja::internal {

absl::StatusOr<ExprPtr> Parser::ParseTupleOrExpression() {
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

absl::StatusOr<ExprPtr> Parser::ParseExpression(bool with_cond) {
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

absl::StatusOr<ExprPtr> Parser::ParseOr() {
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

absl::StatusOr<ExprPtr> Parser::ParseAnd() {
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

absl::StatusOr<ExprPtr> Parser::ParseNot() {
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

absl::StatusOr<ExprPtr> Parser::ParseCompare() {
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

absl::StatusOr<ExprPtr> Parser::ParseBinaryLevel(const std::vector<std::string>& ops,
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

absl::StatusOr<ExprPtr> Parser::ParseMath1() {
  return ParseBinaryLevel({"+", "-"}, &Parser::ParseConcat);
}

absl::StatusOr<ExprPtr> Parser::ParseConcat() {
  return ParseBinaryLevel({"~"}, &Parser::ParseMath2);
}

absl::StatusOr<ExprPtr> Parser::ParseMath2() {
  return ParseBinaryLevel({"*", "/", "//", "%"}, &Parser::ParsePow);
}

absl::StatusOr<ExprPtr> Parser::ParsePow() {
  return ParseBinaryLevel({"**"}, &Parser::ParseUnaryF);
}

absl::StatusOr<ExprPtr> Parser::ParseUnaryF() { return ParseUnary(true); }

absl::StatusOr<ExprPtr> Parser::ParseUnary(bool with_filter) {
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

absl::StatusOr<ExprPtr> Parser::ParsePrimary() {
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

absl::StatusOr<ExprPtr> Parser::ParsePostfix(ExprPtr e) {
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

absl::Status Parser::ParseCallArgs(Expr* call) {
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

absl::StatusOr<ExprPtr> Parser::ParseCall(ExprPtr callee) {
  ExprPtr c = Make(Expr::Op::kCall, Line());
  c->args.push_back(std::move(callee));
  RETURN_IF_ERROR(ParseCallArgs(c.get()));
  return c;
}

absl::StatusOr<ExprPtr> Parser::ParseFilterExpr(ExprPtr e) {
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
        return absl::UnimplementedError(
            absl::StrCat("chat template line ", line, ": no filter named '", name,
                         "' in this Jinja subset (text/jinja.h lists the filters)"));
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
        return absl::UnimplementedError(
            absl::StrCat("chat template line ", line, ": no test named '", t->name,
                         "' in this Jinja subset (text/jinja.h lists the tests)"));
      }
      t->args.push_back(std::move(e));
      if (IsOp("(")) {
        RETURN_IF_ERROR(ParseCallArgs(t.get()));
      } else if (const Token* a = Peek();
                 a != nullptr && (a->type == Tok::kString || a->type == Tok::kInt ||
                                  a->type == Tok::kFloat || IsOp("[") || IsOp("{") ||
                                  (a->type == Tok::kName && a->text != "else" && a->text != "or" &&
                                   a->text != "and" && a->text != "if" && a->text != "is" &&
                                   a->text != "in" && a->text != "not"))) {
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

}  // namespace lspo::model::jinja::internal
