// The statements of the Jinja renderer (Renderer, jinja_renderer.h): the builtins (range,
// namespace, dict), output, if, for loops with jinja2's loop object, set (names, namespace
// attributes, blocks), macros, generation blocks and break / continue.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/status_macros.h"
#include "text/jinja_internal.h"
#include "text/jinja_renderer.h"

namespace lspo::model::jinja::internal {

Renderer::Renderer(const Value::Dict& globals) {
  scopes_.emplace_back();
  auto& builtins = scopes_.back();
  builtins["range"] = Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : a.positional) {
      if (v.kind() != Value::Kind::kInt && v.kind() != Value::Kind::kBool) {
        return absl::InvalidArgumentError("chat template: range() takes integers");
      }
    }
    if (a.positional.size() == 1) {
      stop = a.positional[0].as_int();
    } else if (a.positional.size() >= 2) {
      start = a.positional[0].as_int();
      stop = a.positional[1].as_int();
      if (a.positional.size() > 2) step = a.positional[2].as_int();
    }
    if (step == 0)
      return absl::InvalidArgumentError("chat template: range() step must not be zero");
    Value::List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (out.size() >= static_cast<size_t>(kMaxIterations)) {
        return absl::ResourceExhaustedError("chat template: range() longer than 10^6");
      }
      out.push_back(Value::Int(i));
    }
    return Value::MakeList(std::move(out));
  });
  builtins["namespace"] = Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
    Value::Dict d;
    for (const Value& p : a.positional) {
      if (p.kind() == Value::Kind::kDict) d.insert(d.end(), p.as_dict().begin(), p.as_dict().end());
    }
    d.insert(d.end(), a.keyword.begin(), a.keyword.end());
    return Value::Namespace(std::move(d));
  });
  builtins["dict"] = Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
    Value::Dict d;
    for (const Value& p : a.positional) {
      if (p.kind() == Value::Kind::kDict) d.insert(d.end(), p.as_dict().begin(), p.as_dict().end());
    }
    for (const auto& kv : a.keyword) d.push_back(kv);
    return Value::MakeDict(std::move(d));
  });
  scopes_.emplace_back();
  for (const auto& [k, v] : globals) scopes_.back()[k] = v;
  scopes_.emplace_back();  // the template's own top-level assignments
}

absl::Status Renderer::Run(const std::vector<Node>& nodes, RenderOutput* result) {
  RETURN_IF_ERROR(RenderNodes(nodes));
  result->text = std::move(out_);
  result->generation_spans = std::move(spans_);
  return absl::OkStatus();
}

absl::Status Renderer::Emit(absl::string_view s) {
  out_.append(s.data(), s.size());
  if (out_.size() > kMaxOutputBytes) {
    return absl::ResourceExhaustedError("chat template: output larger than 64 MiB");
  }
  return absl::OkStatus();
}

absl::Status Renderer::RenderNodes(const std::vector<Node>& nodes) {
  for (const Node& n : nodes) {
    RETURN_IF_ERROR(RenderNode(n));
    if (flow_ != Flow::kNormal) return absl::OkStatus();
  }
  return absl::OkStatus();
}

absl::Status Renderer::Assign(const std::vector<std::string>& targets, const Value& v, int line) {
  if (targets.size() == 1) {
    scopes_.back()[targets[0]] = v;
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(Value::List items, Iterate(v, line));
  if (items.size() != targets.size()) {
    return RenderError(line, absl::StrCat("cannot unpack ", items.size(), " values into ",
                                          targets.size(), " names"));
  }
  for (size_t i = 0; i < targets.size(); ++i) scopes_.back()[targets[i]] = items[i];
  return absl::OkStatus();
}

absl::Status Renderer::RenderNode(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kText:
      return Emit(n.text);
    case Node::Kind::kOutput: {
      ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
      return Emit(v.ToString());
    }
    case Node::Kind::kIf:
      for (const auto& [cond, body] : n.branches) {
        bool take = cond == nullptr;
        if (!take) {
          ASSIGN_OR_RETURN(Value c, Eval(*cond));
          take = c.Truthy();
        }
        if (take) return RenderNodes(body);
      }
      return absl::OkStatus();
    case Node::Kind::kFor:
      return RenderFor(n);
    case Node::Kind::kSet: {
      ASSIGN_OR_RETURN(Value v, Eval(*n.expr));
      if (!n.attr.empty()) {
        Value ns = Lookup(n.targets[0]);
        if (!ns.is_namespace()) {
          return RenderError(n.line, absl::StrCat("cannot assign attribute on non-namespace '",
                                                  n.targets[0], "'"));
        }
        for (auto& [k, x] : ns.mutable_dict()) {
          if (k == n.attr) {
            x = v;
            return absl::OkStatus();
          }
        }
        ns.mutable_dict().emplace_back(n.attr, v);
        return absl::OkStatus();
      }
      return Assign(n.targets, v, n.line);
    }
    case Node::Kind::kSetBlock: {
      std::string saved = std::move(out_);
      out_.clear();
      absl::Status s = RenderNodes(n.body);
      std::string captured = std::move(out_);
      out_ = std::move(saved);
      RETURN_IF_ERROR(s);
      scopes_.back()[n.targets[0]] = Value::Str(std::move(captured));
      return absl::OkStatus();
    }
    case Node::Kind::kGeneration: {
      const size_t begin = out_.size();
      RETURN_IF_ERROR(RenderNodes(n.body));
      spans_.emplace_back(begin, out_.size());
      return absl::OkStatus();
    }
    case Node::Kind::kBreak:
    case Node::Kind::kContinue:
      if (loop_depth_ == 0) {
        return RenderError(n.line, "break / continue outside a for loop");
      }
      flow_ = n.kind == Node::Kind::kBreak ? Flow::kBreak : Flow::kContinue;
      return absl::OkStatus();
    case Node::Kind::kMacro:
      scopes_.back()[n.targets[0]] = MakeMacro(n);
      return absl::OkStatus();
  }
  return absl::OkStatus();
}

Value Renderer::MakeMacro(const Node& n) {
  const Node* node = &n;
  return Value::Function([this, node](const Value::Args& a) -> absl::StatusOr<Value> {
    if (++call_depth_ > kMaxCallDepth || ++calls_ > kMaxIterations) {
      --call_depth_;
      return absl::ResourceExhaustedError(
          "chat template: macro calls nested deeper than 100 or more than 10^6 in all");
    }
    Scope params;
    for (size_t i = 1; i < node->targets.size(); ++i) {
      const std::string& p = node->targets[i];
      Value v = i - 1 < a.positional.size() ? a.positional[i - 1] : Value::Undefined(p);
      for (const auto& [k, x] : a.keyword) {
        if (k == p) v = x;
      }
      if (v.is_undefined() && node->defaults[i - 1] != nullptr) {
        ASSIGN_OR_RETURN(v, Eval(*node->defaults[i - 1]));
      }
      params[p] = v;
    }
    std::vector<Scope> saved_scopes(scopes_.begin() + 3, scopes_.end());
    scopes_.resize(3);
    scopes_.push_back(std::move(params));
    std::string saved = std::move(out_);
    out_.clear();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    absl::Status s = RenderNodes(node->body);
    loop_depth_ = saved_loops;
    flow_ = Flow::kNormal;
    std::string captured = std::move(out_);
    out_ = std::move(saved);
    scopes_.resize(3);
    scopes_.insert(scopes_.end(), saved_scopes.begin(), saved_scopes.end());
    --call_depth_;
    RETURN_IF_ERROR(s);
    return Value::Str(std::move(captured));
  });
}

absl::Status Renderer::RenderFor(const Node& n) {
  ASSIGN_OR_RETURN(Value seq, Eval(*n.expr));
  ASSIGN_OR_RETURN(Value::List all, Iterate(seq, n.line));
  scopes_.emplace_back();
  struct PopScope {
    std::vector<Scope>* s;
    ~PopScope() { s->pop_back(); }
  } pop{&scopes_};
  Value::List items;
  if (n.filter != nullptr) {
    for (const Value& v : all) {
      RETURN_IF_ERROR(Assign(n.targets, v, n.line));
      ASSIGN_OR_RETURN(Value keep, Eval(*n.filter));
      if (keep.Truthy()) items.push_back(v);
    }
  } else {
    items = std::move(all);
  }
  if (items.empty()) return RenderNodes(n.else_body);
  ++loop_depth_;
  const int64_t len = static_cast<int64_t>(items.size());
  absl::Status status;
  for (int64_t i = 0; i < len; ++i) {
    if (++iterations_ > kMaxIterations) {
      status = absl::ResourceExhaustedError("chat template: loops ran more than 10^6 iterations");
      break;
    }
    scopes_.back().clear();  // jinja2: assignments in the body do not outlive an iteration
    status = Assign(n.targets, items[static_cast<size_t>(i)], n.line);
    if (!status.ok()) break;
    auto cycle = Value::Function([i](const Value::Args& a) -> absl::StatusOr<Value> {
      if (a.positional.empty())
        return absl::InvalidArgumentError("chat template: loop.cycle() needs arguments");
      return a.positional[static_cast<size_t>(i) % a.positional.size()];
    });
    Value::Dict loop = {
        {"index0", Value::Int(i)},
        {"index", Value::Int(i + 1)},
        {"revindex0", Value::Int(len - i - 1)},
        {"revindex", Value::Int(len - i)},
        {"first", Value::Bool(i == 0)},
        {"last", Value::Bool(i == len - 1)},
        {"length", Value::Int(len)},
        {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::Undefined("loop.previtem")},
        {"nextitem",
         i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value::Undefined("loop.nextitem")},
        {"cycle", cycle},
    };
    scopes_.back()["loop"] = Value::MakeDict(std::move(loop));
    status = RenderNodes(n.body);
    if (!status.ok()) break;
    const Flow f = flow_;
    flow_ = Flow::kNormal;
    if (f == Flow::kBreak) break;
  }
  --loop_depth_;
  return status;
}

}  // namespace lspo::model::jinja::internal
