// The expressions of the Jinja renderer (Renderer, jinja_renderer.h) and the value operations
// they use with Python's semantics: ==, ordering, `in`, iteration, arithmetic on 64-bit
// integers and floats, string and list concatenation and repetition (bounded), subscripts,
// slices and attributes.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/status_macros.h"
#include "text/jinja_internal.h"
#include "text/jinja_renderer.h"

namespace lspo::model::jinja::internal {
namespace {

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Evaluation

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
  return RenderError(
      line, absl::StrCat("'", v.as_string().empty() ? "value" : v.as_string(), "' is undefined"));
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
  return RenderError(line,
                     absl::StrCat("cannot compare '", TypeName(a), "' with '", TypeName(b), "'"));
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
      return RenderError(
          line, absl::StrCat("argument of type '", TypeName(container), "' is not iterable"));
  }
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
      const bool over = op == "+"   ? __builtin_add_overflow(a.as_int(), b.as_int(), &r)
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
  if (op == "*" && (a.is_string() || a.kind() == Value::Kind::kList) &&
      b.kind() == Value::Kind::kInt) {
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
    for (int64_t k = 0; k < b.as_int(); ++k)
      l.insert(l.end(), a.as_list().begin(), a.as_list().end());
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

absl::Status Renderer::CountWork(const Value& v) {
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

absl::StatusOr<Value> Renderer::Eval(const Expr& e) {
  switch (e.op) {
    case Expr::Op::kLiteral:
      return e.literal;
    case Expr::Op::kName:
      return Lookup(e.name);
    case Expr::Op::kList:
      return EvalList(e);
    case Expr::Op::kDict:
      return EvalDict(e);
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
    case Expr::Op::kCall:
      return EvalCall(e);
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
    case Expr::Op::kPos:
      return EvalUnary(e);
    case Expr::Op::kBinary: {
      ASSIGN_OR_RETURN(Value a, Eval(*e.args[0]));
      ASSIGN_OR_RETURN(Value b, Eval(*e.args[1]));
      ASSIGN_OR_RETURN(Value r, Arithmetic(e.name, a, b, e.line));
      RETURN_IF_ERROR(CountWork(r));
      return r;
    }
    case Expr::Op::kCompare:
      return EvalCompare(e);
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

absl::StatusOr<Value> Renderer::EvalList(const Expr& e) {
  Value::List items;
  for (const auto& a : e.args) {
    ASSIGN_OR_RETURN(Value v, Eval(*a));
    items.push_back(std::move(v));
  }
  return e.name == "tuple" ? Value::MakeTuple(std::move(items)) : Value::MakeList(std::move(items));
}

absl::StatusOr<Value> Renderer::EvalDict(const Expr& e) {
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

absl::StatusOr<Value> Renderer::EvalCall(const Expr& e) {
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

absl::StatusOr<Value> Renderer::EvalUnary(const Expr& e) {
  ASSIGN_OR_RETURN(Value v, Eval(*e.args[0]));
  if (v.is_undefined()) return UndefinedError(e.line, v);
  if (!v.is_number()) {
    return RenderError(
        e.line, absl::StrCat("bad operand type for unary ", e.op == Expr::Op::kNeg ? "-" : "+",
                             ": '", TypeName(v), "'"));
  }
  if (e.op == Expr::Op::kPos) return v.kind() == Value::Kind::kFloat ? v : Value::Int(v.as_int());
  return v.kind() == Value::Kind::kFloat ? Value::Float(-v.as_float()) : Value::Int(-v.as_int());
}

absl::StatusOr<Value> Renderer::EvalCompare(const Expr& e) {
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

absl::StatusOr<Value::Args> Renderer::EvalArgs(const Expr& e, size_t first) {
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

absl::StatusOr<Value> Renderer::EvalSlice(const Expr& e) {
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
    for (int64_t i :
         SliceIndices(static_cast<int64_t>(obj.as_list().size()), part[0], part[1], step)) {
      out.push_back(obj.as_list()[static_cast<size_t>(i)]);
    }
    return Value::MakeList(std::move(out));
  }
  if (obj.is_string()) {
    const std::vector<size_t> at = CodePointOffsets(obj.as_string());
    std::string out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(at.size()) - 1, part[0], part[1], step)) {
      out += obj.as_string().substr(at[static_cast<size_t>(i)],
                                    at[static_cast<size_t>(i) + 1] - at[static_cast<size_t>(i)]);
    }
    return Value::Str(std::move(out));
  }
  return RenderError(e.line, absl::StrCat("'", TypeName(obj), "' object is not subscriptable"));
}

absl::StatusOr<Value> Renderer::GetItem(const Value& obj, const Value& key, int line) {
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
    return Value::Str(obj.as_string().substr(
        at[static_cast<size_t>(i)], at[static_cast<size_t>(i) + 1] - at[static_cast<size_t>(i)]));
  }
  if (key.is_string()) return GetAttr(obj, key.as_string(), line);
  return Value::Undefined(key.ToString());
}

absl::StatusOr<Value> Renderer::GetAttr(const Value& obj, const std::string& name, int line) {
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

}  // namespace lspo::model::jinja::internal
