// Jinja2 subset interpreter; see jinja.h. Semantics follow jinja2 3.x (lexer.py, parser.py,
// runtime.py, filters.py, tests.py) as configured by transformers' chat template utilities.
// This file holds Template's entry points; the interpreter is in the jinja_*.cc files (values,
// lexer, parser, renderer, filters; their shared types in jinja_internal.h).
#include "text/jinja.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/status_macros.h"
#include "runtime/utf8.h"
#include "text/jinja_internal.h"
#include "text/jinja_parser.h"
#include "text/jinja_renderer.h"

namespace lspo::model::jinja {

using internal::Lex;
using internal::Parser;
using internal::Piece;
using internal::Renderer;
using internal::SyntaxError;

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
    const int line = 1 + static_cast<int>(std::count(
                             src.begin(), src.begin() + static_cast<ptrdiff_t>(bad), '\n'));
    return SyntaxError(line, absl::StrCat("invalid UTF-8 at byte ", bad + 1,
                                          " of the template; chat templates are UTF-8 text"));
  }
  ASSIGN_OR_RETURN(std::vector<Piece> pieces, Lex(std::move(src)));
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
