// Internal to lspo_jinja (text/jinja*.cc); not part of the API, which is text/jinja.h.
//
// The renderer of the Jinja interpreter: runs a Template::Program with the globals of one
// render, with jinja2's runtime semantics (scopes, loops, macros, Undefined) and the limits of
// jinja_internal.h. Statements and the builtins are in jinja_render.cc, expressions in
// jinja_render_expr.cc, the methods of str and dict, the filters and the tests in
// jinja_filters.cc.
#ifndef LSPO_TEXT_JINJA_RENDERER_H_
#define LSPO_TEXT_JINJA_RENDERER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "text/jinja.h"
#include "text/jinja_internal.h"

namespace lspo::model::jinja::internal {

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
      return RenderError(
          line, absl::StrCat(fn, "(): argument '", name, "' must be a string, not ", TypeName(v)));
    }
    return v.as_string();
  }
};

// One render of a template. Not thread-safe; Template::Render makes one per call.
class Renderer {
 public:
  // Scopes, outermost first: the builtins (range, namespace, dict), `globals`, then the
  // template's own top-level assignments.
  explicit Renderer(const Value::Dict& globals);

  // Renders `nodes` into `result` (the text and the generation spans). Errors: those of the
  // render (RenderError, kResourceExhausted for a limit).
  absl::Status Run(const std::vector<Node>& nodes, RenderOutput* result);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  using Scope = std::unordered_map<std::string, Value>;

  // The value of `name` in the innermost scope that has it, else undefined (named `name`).
  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto f = it->find(name);
      if (f != it->end()) return f->second;
    }
    return Value::Undefined(name);
  }

  // ----- statements (jinja_render.cc)
  // Appends `s` to the output. Errors: kResourceExhausted past kMaxOutputBytes.
  absl::Status Emit(absl::string_view s);
  // Renders `nodes` in order; stops after a break or continue (flow_).
  absl::Status RenderNodes(const std::vector<Node>& nodes);
  // Binds `targets` to `v` in the innermost scope; several targets unpack `v`.
  absl::Status Assign(const std::vector<std::string>& targets, const Value& v, int line);
  // Renders one statement.
  absl::Status RenderNode(const Node& n);
  // The callable a {% macro %} defines: renders its body with its parameters bound.
  Value MakeMacro(const Node& n);
  // A for loop: its filter, the loop object, break / continue, the else body.
  absl::Status RenderFor(const Node& n);

  // ----- expressions (jinja_render_expr.cc)
  // Adds what a built string or list holds to the render's work (kMaxWorkBytes in all).
  absl::Status CountWork(const Value& v);
  // The value of an expression.
  absl::StatusOr<Value> Eval(const Expr& e);
  // The kinds of expression Eval hands on: a list or tuple literal, a dict literal, a call,
  // unary - / +, a comparison chain.
  absl::StatusOr<Value> EvalList(const Expr& e);
  absl::StatusOr<Value> EvalDict(const Expr& e);
  absl::StatusOr<Value> EvalCall(const Expr& e);
  absl::StatusOr<Value> EvalUnary(const Expr& e);
  absl::StatusOr<Value> EvalCompare(const Expr& e);
  // The arguments of a call, filter or test: e.args from `first` on, and e.kwargs.
  absl::StatusOr<Value::Args> EvalArgs(const Expr& e, size_t first);
  // obj[a:b:c] of a list or a string.
  absl::StatusOr<Value> EvalSlice(const Expr& e);
  // obj[key]: a dict's item, a list's or string's element, else an attribute.
  absl::StatusOr<Value> GetItem(const Value& obj, const Value& key, int line);
  // obj.name: a method of a str or dict, a dict's item, else undefined.
  absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name, int line);

  // ----- methods, filters and tests (jinja_filters.cc)
  // The bound method `name` of a dict (items, keys, values, get), or undefined.
  static Value DictMethod(const Value& obj, const std::string& name);
  // The bound method `name` of the str `s` (strip, split, startswith, ...), or undefined.
  static Value StringMethod(const std::string& s, const std::string& name, int line);
  // The item a dotted attribute path ("a.b", "0.content") names in `v`.
  absl::StatusOr<Value> AttrPath(const Value& v, const std::string& path, int line);
  // `v|name(args)`. Errors: RenderError for a failed filter or an unknown name.
  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v,
                                    const Value::Args& args, int line);
  // The filters ApplyFilter hands on that look up attributes or apply tests and filters:
  // join, select / reject / selectattr / rejectattr, map, sort (of `items`), sum.
  absl::StatusOr<Value> FilterJoin(const Value& v, const ArgReader& r, int line);
  absl::StatusOr<Value> FilterSelect(const std::string& name, const Value& v,
                                     const Value::Args& args, const ArgReader& r, int line);
  absl::StatusOr<Value> FilterMap(const Value& v, const Value::Args& args, const ArgReader& r,
                                  int line);
  absl::StatusOr<Value> FilterSort(Value::List items, const ArgReader& r, int line);
  absl::StatusOr<Value> FilterSum(const Value& v, const ArgReader& r, int line);
  // `v is name(args)`. Errors: RenderError for a failed test or an unknown name.
  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v, const Value::Args& args,
                                 int line);

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

}  // namespace lspo::model::jinja::internal

#endif  // LSPO_TEXT_JINJA_RENDERER_H_
