// The operations a template calls on values: the methods of str and dict (`s.strip()`,
// `d.items()`), the filters (`x|join(", ")`) and the tests (`x is defined`) of the Jinja
// interpreter, with jinja2's filters.py / tests.py and Python's str semantics. KnownFilter and
// KnownTest list them for the parser.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/status_macros.h"
#include "text/jinja_internal.h"
#include "text/jinja_renderer.h"

namespace lspo::model::jinja::internal {

// The filters and tests Renderer::ApplyFilter / ApplyTest implement; others are refused at
// parse time, as jinja2 refuses an unknown filter when it compiles a template.
bool KnownFilter(absl::string_view name) {
  static const char* const kNames[] = {
      "abs",    "capitalize", "count",      "d",          "default",  "dictsort", "first",
      "float",  "int",        "items",      "join",       "last",     "length",   "list",
      "lower",  "map",        "reject",     "rejectattr", "replace",  "reverse",  "round",
      "safe",   "select",     "selectattr", "sort",       "string",   "sum",      "title",
      "tojson", "trim",       "unique",     "upper",      "wordcount"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}
bool KnownTest(absl::string_view name) {
  static const char* const kNames[] = {
      "boolean",     "callable", "defined",  "divisibleby", "eq",        "equalto",
      "==",          "even",     "false",    "float",       "ge",        ">=",
      "greaterthan", "gt",       ">",        "in",          "integer",   "iterable",
      "le",          "<=",       "lessthan", "lower",       "lt",        "<",
      "mapping",     "ne",       "!=",       "none",        "number",    "odd",
      "sameas",      "sequence", "string",   "true",        "undefined", "upper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

namespace {

// Python's str.replace (at most `count` replacements, all when negative), str.capitalize and
// str.title on ASCII letters.
std::string Replace(const std::string& s, const std::string& from, const std::string& to,
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

std::string Capitalize(const std::string& s) {
  std::string out = absl::AsciiStrToLower(s);
  if (!out.empty()) out[0] = absl::ascii_toupper(static_cast<unsigned char>(out[0]));
  return out;
}

std::string Title(const std::string& s) {
  std::string out = s;
  bool prev_alpha = false;
  for (char& c : out) {
    const bool alpha = absl::ascii_isalpha(static_cast<unsigned char>(c));
    if (alpha)
      c = prev_alpha ? absl::ascii_tolower(static_cast<unsigned char>(c))
                     : absl::ascii_toupper(static_cast<unsigned char>(c));
    prev_alpha = alpha;
  }
  return out;
}

// The methods of str whose bodies are longer than a line: what `s.<method>(a)` returns.
absl::StatusOr<Value> StartsEndsMethod(const std::string& s, bool starts, const Value::Args& a) {
  if (a.positional.empty())
    return absl::InvalidArgumentError("startswith/endswith need an argument");
  Value::List options = a.positional[0].kind() == Value::Kind::kList ? a.positional[0].as_list()
                                                                     : Value::List{a.positional[0]};
  for (const Value& o : options) {
    if (!o.is_string()) return absl::InvalidArgumentError("startswith/endswith take strings");
    if (starts ? absl::StartsWith(s, o.as_string()) : absl::EndsWith(s, o.as_string())) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

absl::StatusOr<Value> SplitMethod(const std::string& s, const Value::Args& a) {
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
}

absl::StatusOr<Value> SplitlinesMethod(const std::string& s) {
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
}

absl::StatusOr<Value> FindCountMethod(const std::string& s, bool find, const Value::Args& a) {
  if (a.positional.empty() || !a.positional[0].is_string()) {
    return absl::InvalidArgumentError("str.find()/count() take a string");
  }
  const std::string& sub = a.positional[0].as_string();
  if (find) {
    const size_t at = s.find(sub);
    return Value::Int(at == std::string::npos
                          ? -1
                          : static_cast<int64_t>(CodePointOffsets(s.substr(0, at)).size() - 1));
  }
  if (sub.empty()) return Value::Int(static_cast<int64_t>(CodePointOffsets(s).size()));
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
  return Value::Int(n);
}

absl::StatusOr<Value> JoinMethod(const std::string& s, int line, const Value::Args& a) {
  if (a.positional.empty()) return absl::InvalidArgumentError("str.join() takes an iterable");
  ASSIGN_OR_RETURN(Value::List items, Iterate(a.positional[0], line));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string())
      return absl::InvalidArgumentError("str.join(): items must be strings");
    if (i > 0) out += s;
    out += items[i].as_string();
  }
  return Value::Str(std::move(out));
}

// The filters ApplyFilter hands on that need nothing of the renderer: length / count, tojson,
// int / float, dictsort, round, reverse, unique (of `items`), wordcount.
absl::StatusOr<Value> FilterLength(const Value& v, int line) {
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

absl::StatusOr<Value> FilterToJson(const Value& v, const ArgReader& r, int line) {
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

absl::StatusOr<Value> FilterNumber(const std::string& name, const Value& v, const ArgReader& r) {
  const bool to_int = name == "int";
  Value fallback = r.Get(0, "default", to_int ? Value::Int(0) : Value::Float(0));
  if (v.is_number())
    return to_int ? Value::Int(static_cast<int64_t>(v.as_float())) : Value::Float(v.as_float());
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

absl::StatusOr<Value> FilterDictsort(const Value& v, int line) {
  if (v.kind() != Value::Kind::kDict) return RenderError(line, "dictsort(): a mapping is required");
  Value::Dict items = v.as_dict();
  std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) {
    return absl::AsciiStrToLower(a.first) < absl::AsciiStrToLower(b.first);
  });
  Value::List out;
  for (auto& [k, x] : items) out.push_back(Value::MakeTuple({Value::Str(k), x}));
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> FilterRound(const Value& v, const ArgReader& r, int line) {
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

absl::StatusOr<Value> FilterReverse(const Value& v, int line) {
  if (v.is_string()) {
    const std::vector<size_t> at = CodePointOffsets(v.as_string());
    std::string out;
    for (size_t i = at.size() - 1; i > 0; --i)
      out += v.as_string().substr(at[i - 1], at[i] - at[i - 1]);
    return Value::Str(std::move(out));
  }
  ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
  std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

absl::StatusOr<Value> FilterUnique(const Value::List& items) {
  Value::List out;
  for (const Value& x : items) {
    if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return Equals(x, y); })) {
      out.push_back(x);
    }
  }
  return Value::MakeList(std::move(out));
}

absl::StatusOr<Value> FilterWordcount(const Value& v) {
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

}  // namespace

Value Renderer::DictMethod(const Value& obj, const std::string& name) {
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

Value Renderer::StringMethod(const std::string& s, const std::string& name, int line) {
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
      return StartsEndsMethod(s, starts, a);
    });
  }
  if (name == "split") {
    return Value::Function(
        [s](const Value::Args& a) -> absl::StatusOr<Value> { return SplitMethod(s, a); });
  }
  if (name == "splitlines") {
    return Value::Function(
        [s](const Value::Args&) -> absl::StatusOr<Value> { return SplitlinesMethod(s); });
  }
  if (name == "replace") {
    return Value::Function([s](const Value::Args& a) -> absl::StatusOr<Value> {
      if (a.positional.size() < 2 || !a.positional[0].is_string() || !a.positional[1].is_string()) {
        return absl::InvalidArgumentError("str.replace() takes two strings");
      }
      const int64_t count = a.positional.size() > 2 ? a.positional[2].as_int() : -1;
      return Value::Str(
          Replace(s, a.positional[0].as_string(), a.positional[1].as_string(), count));
    });
  }
  if (name == "find" || name == "count") {
    const bool find = name == "find";
    return Value::Function([s, find](const Value::Args& a) -> absl::StatusOr<Value> {
      return FindCountMethod(s, find, a);
    });
  }
  if (name == "join") {
    return Value::Function([s, line](const Value::Args& a) -> absl::StatusOr<Value> {
      return JoinMethod(s, line, a);
    });
  }
  return Value();
}

absl::StatusOr<Value> Renderer::AttrPath(const Value& v, const std::string& path, int line) {
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

absl::StatusOr<Value> Renderer::ApplyFilter(const std::string& name, const Value& v,
                                            const Value::Args& args, int line) {
  ArgReader r{args, name, line};
  if (name == "trim") {
    Value chars = r.Get(0, "chars", Value::None());
    return Value::Str(
        PyStrip(v.ToString(),
                chars.is_string() ? std::optional<std::string>(chars.as_string()) : std::nullopt,
                true, true));
  }
  if (name == "length" || name == "count") return FilterLength(v, line);
  if (name == "list") {
    ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
    return Value::MakeList(std::move(items));
  }
  if (name == "first" || name == "last") {
    ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
    if (items.empty())
      return Value::Undefined(absl::StrCat("the ", name, " item of an empty sequence"));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "join") return FilterJoin(v, r, line);
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
    return FilterSelect(name, v, args, r, line);
  }
  if (name == "map") return FilterMap(v, args, r, line);
  if (name == "tojson") return FilterToJson(v, r, line);
  if (name == "string") return Value::Str(v.ToString());
  if (name == "safe") return v;
  if (name == "int" || name == "float") return FilterNumber(name, v, r);
  if (name == "items") {
    if (v.is_undefined()) return Value::MakeList({});
    if (v.kind() != Value::Kind::kDict) {
      return RenderError(line, absl::StrCat("items(): a mapping is required, not ", TypeName(v)));
    }
    return DictMethod(v, "items").as_callable()(Value::Args{});
  }
  if (name == "dictsort") return FilterDictsort(v, line);
  if (name == "abs") {
    if (!v.is_number()) return RenderError(line, "abs(): a number is required");
    return v.kind() == Value::Kind::kFloat ? Value::Float(std::fabs(v.as_float()))
                                           : Value::Int(std::llabs(v.as_int()));
  }
  if (name == "round") return FilterRound(v, r, line);
  if (name == "reverse") return FilterReverse(v, line);
  if (name == "sort" || name == "unique") {
    ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
    if (name == "unique") return FilterUnique(items);
    return FilterSort(std::move(items), r, line);
  }
  if (name == "sum") return FilterSum(v, r, line);
  if (name == "wordcount") return FilterWordcount(v);
  return RenderError(line, absl::StrCat("no filter named '", name,
                                        "' in this Jinja subset (text/jinja.h lists the filters)"));
}

absl::StatusOr<Value> Renderer::FilterJoin(const Value& v, const ArgReader& r, int line) {
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

absl::StatusOr<Value> Renderer::FilterSelect(const std::string& name, const Value& v,
                                             const Value::Args& args, const ArgReader& r,
                                             int line) {
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

absl::StatusOr<Value> Renderer::FilterMap(const Value& v, const Value::Args& args,
                                          const ArgReader& r, int line) {
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

absl::StatusOr<Value> Renderer::FilterSort(Value::List items, const ArgReader& r, int line) {
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

absl::StatusOr<Value> Renderer::FilterSum(const Value& v, const ArgReader& r, int line) {
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

absl::StatusOr<bool> Renderer::ApplyTest(const std::string& name, const Value& v,
                                         const Value::Args& args, int line) {
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
  if (name == "lt" || name == "<" || name == "le" || name == "<=" || name == "gt" || name == ">" ||
      name == "ge" || name == ">=" || name == "lessthan" || name == "greaterthan") {
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
                                        "' in this Jinja subset (text/jinja.h lists the tests)"));
}

}  // namespace lspo::model::jinja::internal
