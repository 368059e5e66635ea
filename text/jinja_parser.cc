// The statements of the Jinja parser (Parser, jinja_parser.h): the template's body, if / elif /
// else, for, set, macro, generation, break / continue, and the refusal of the statements this
// subset leaves out.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/status_macros.h"
#include "text/jinja_internal.h"
#include "text/jinja_parser.h"

namespace lspo::model::jinja::internal {

absl::Status Parser::Run(Template::Program* prog) {
  std::string end;
  RETURN_IF_ERROR(ParseBody({}, &prog->nodes, &end));
  prog->has_generation = has_generation_;
  return absl::OkStatus();
}

absl::Status Parser::ParseBody(const std::vector<std::string>& stops, std::vector<Node>* out,
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
          " %} statement is not supported by this Jinja subset (text/jinja.h lists what is)"));
    } else {
      return SyntaxError(
          piece.line,
          absl::StrCat("unexpected statement '", kw, "'",
                       stops.empty()
                           ? ""
                           : absl::StrCat(" (expected one of: ", absl::StrJoin(stops, ", "), ")")));
    }
    out->push_back(std::move(n));
  }
  if (!stops.empty()) {
    return SyntaxError(
        line_, absl::StrCat("unexpected end of template: missing {% ", stops.back(), " %}"));
  }
  --nesting_;
  return absl::OkStatus();
}

absl::Status Parser::Closed(const std::string& stop, absl::string_view what, int line) {
  if (stop.empty()) return SyntaxError(line, absl::StrCat("{% ", what, " %} is never closed"));
  return absl::OkStatus();
}

absl::Status Parser::ParseIf(Node* n) {
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

absl::Status Parser::ParseFor(Node* n) {
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
    return absl::UnimplementedError(
        absl::StrCat("chat template line ", n->line, ": recursive for loops are not supported"));
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

absl::Status Parser::ParseSet(Node* n) {
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

absl::Status Parser::ParseMacro(Node* n) {
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

}  // namespace lspo::model::jinja::internal
