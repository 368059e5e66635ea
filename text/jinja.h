// A Jinja2 subset interpreter for chat templates. Torch-free.
//
// Hugging Face models carry their chat template as Jinja source (tokenizer_config.json's
// "chat_template", chat_template.jinja, a GGUF's tokenizer.chat_template), and the families'
// templates differ in details that matter for training (Mistral alone has several [INST]
// spacings and puts the system text on the first or on the last user turn). No Jinja engine
// is packaged for C++ on the registries this project builds from (Debian, PyPI), so this file
// implements the part of the language chat templates use, with the semantics transformers
// gives them (transformers/utils/chat_template_utils.py: an ImmutableSandboxedEnvironment
// with trim_blocks and lstrip_blocks, the loopcontrols extension, the `generation` block of
// its AssistantTracker extension, and tojson as json.dumps(ensure_ascii=False)).
//
// Supported:
//   * Text, {{ expression }}, {% statement %}, {# comment #}, whitespace control ({%- -%},
//     {{- -}}, {#- -#}, {%+), trim_blocks / lstrip_blocks, newline normalisation and the
//     removal of one trailing newline, as jinja2's lexer does.
//   * Statements: if / elif / else, for (tuple targets, `if` filter, else, the loop object:
//     index, index0, revindex, revindex0, first, last, length, previtem, nextitem, cycle),
//     break / continue, set (a name, a namespace attribute, or a block `{% set x %}...`),
//     macro (positional and keyword parameters with defaults), generation.
//   * Expressions: literals (strings with Python escapes, ints, floats, true/false/none in both
//     cases, lists, tuples, dicts), names, .attr, [key], [a:b:c] slices, calls with keyword
//     arguments, filters, `is [not]` tests, not / and / or, == != < <= > >= in / not in,
//     + - * / // % ** ~, `x if c else y`.
//   * Filters: abs, capitalize, count, default (d), dictsort, first, float, int, items, join,
//     last, length, list, lower, map, reject, rejectattr, replace, reverse, round, safe,
//     select, selectattr, sort, string, sum, title, tojson, trim, unique, upper, wordcount.
//   * Tests: boolean, callable, defined, divisibleby, eq / equalto / ==, even, false, float,
//     ge / >=, gt / >, in, integer, iterable, le / <=, lower, lt / <, mapping, ne / !=, none,
//     number, odd, sameas, sequence, string, true, undefined, upper.
//   * Methods of str (strip, lstrip, rstrip, split, splitlines, startswith, endswith, upper,
//     lower, title, capitalize, replace, find, count, join, format is not), dict (items,
//     keys, values, get) and the globals range, namespace, dict.
// Anything else (include, import, extends, block, filter blocks, call blocks, raw, an unknown
// filter or test) is an error naming it. Undefined names behave as jinja2's default
// Undefined: printed as "", false, iterable as empty, an error when used in arithmetic or when
// an attribute of them is read.
#ifndef LSPO_TEXT_JINJA_H_
#define LSPO_TEXT_JINJA_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lspo::model::jinja {

// A template value with Python's semantics: undefined, None, bool, int (64-bit), float
// (double), str (UTF-8), list, dict (string keys, insertion order kept) or a callable.
class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };
  using List = std::vector<Value>;
  using Dict = std::vector<std::pair<std::string, Value>>;
  // Positional and keyword arguments of a call.
  struct Args {
    std::vector<Value> positional;
    Dict keyword;
  };
  // Errors it returns become the render's error (e.g. raise_exception).
  using Callable = std::function<absl::StatusOr<Value>(const Args&)>;

  Value() = default;  // undefined
  static Value Undefined(std::string name);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value Str(std::string s);
  static Value MakeList(List items);
  // A list that prints as a Python tuple: (1, 2), (1,), ().
  static Value MakeTuple(List items);
  static Value MakeDict(Dict items);
  static Value Function(Callable fn);
  // A mutable dict (jinja2's namespace): `{% set ns.x = ... %}` writes into it.
  static Value Namespace(Dict items);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_namespace() const { return kind_ == Kind::kDict && is_namespace_; }
  bool is_tuple() const { return kind_ == Kind::kList && is_tuple_; }
  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_float() const { return kind_ == Kind::kFloat ? f_ : static_cast<double>(i_); }
  const std::string& as_string() const { return s_; }  // the str, or an undefined's name
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& mutable_dict() const { return *dict_; }  // namespaces only
  const Callable& as_callable() const { return *fn_; }

  // The item of a dict, or undefined (named `key`) when absent or not a dict.
  Value Get(absl::string_view key) const;
  // Python truthiness (undefined is false).
  bool Truthy() const;
  // Python's str(): "None", "True", 1.5, ['a', 1] (repr of items), {'k': 'v'}; "" if undefined.
  std::string ToString() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool is_namespace_ = false;
  bool is_tuple_ = false;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Callable> fn_;
};

// A rendering, with the byte spans [begin, end) of `text` that {% generation %} blocks
// produced, in order (transformers' return_assistant_tokens_mask uses the same spans).
struct RenderOutput {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

// A parsed template. Copies share the parsed program; Render is const and thread-safe.
class Template {
 public:
  // Parses `source`. Errors: kInvalidArgument naming the line for a syntax error (an
  // unterminated tag or string, an unbalanced block, an unexpected token), kUnimplemented
  // naming the statement for the constructs listed as unsupported above.
  static absl::StatusOr<Template> Parse(absl::string_view source);

  // Renders with `globals` as the top-level variables. Errors: kInvalidArgument naming the
  // line for a failed operation (arithmetic on an undefined name, an unknown filter or test,
  // a type error, a callable's error such as raise_exception's message); kResourceExhausted
  // when the output or any string or list (its real bytes: items held by value count in full)
  // passes 64 MiB, loops pass 10^6 iterations in all, or the strings and lists the operators
  // and filters build pass 1 GiB in all (a bound on the render's work).
  absl::StatusOr<RenderOutput> Render(const Value::Dict& globals) const;

  // True when the source has a {% generation %} block.
  bool has_generation_blocks() const;

  struct Program;  // the parsed statements (jinja_internal.h)

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace lspo::model::jinja

#endif  // LSPO_TEXT_JINJA_H_
