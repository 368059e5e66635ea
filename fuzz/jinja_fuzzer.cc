// Fuzzes the chat-template interpreter (text/jinja.h): Template::Parse of the input as Jinja
// source, then Render with a fixed conversation (a system, a user and an assistant turn,
// add_generation_prompt, bos / eos strings, raise_exception, a namespace-capable context).
// Seeds: fuzz/corpus/jinja/, the real chat templates of tests/oracle/data/chat_templates/.
// Checked:
//   - a parse error is kInvalidArgument or kUnimplemented; a render error is
//     kInvalidArgument or kResourceExhausted (never another code, never a crash or a hang:
//     loops, macro calls and the output are bounded);
//   - generation spans lie inside the text and do not run backwards.
#include <string>

#include "absl/strings/string_view.h"
#include "fuzz/fuzz_harness.h"
#include "text/jinja.h"

namespace lspo::fuzz {

int FuzzJinja(const uint8_t* data, size_t size) {
  if (size > 16384) return 0;  // real templates are < 8 KB
  using model::jinja::Value;
  auto t = model::jinja::Template::Parse(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  if (!t.ok()) {
    LSPO_FUZZ_CHECK(t.status().code() == absl::StatusCode::kInvalidArgument ||
                    t.status().code() == absl::StatusCode::kUnimplemented);
    return 0;
  }
  auto msg = [](const char* role, const char* content) {
    return Value::MakeDict({{"role", Value::Str(role)}, {"content", Value::Str(content)}});
  };
  const Value::Dict globals = {
      {"messages", Value::MakeList({msg("system", "Be brief."), msg("user", " Hi \xc3\xa9 "),
                                    msg("assistant", "Hello.\n")})},
      {"add_generation_prompt", Value::Bool(true)},
      {"bos_token", Value::Str("<s>")},
      {"eos_token", Value::Str("</s>")},
      {"tools", Value::None()},
      {"raise_exception", Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
         return absl::InvalidArgumentError(a.positional.empty() ? "" : a.positional[0].ToString());
       })},
  };
  auto r = t->Render(globals);
  if (!r.ok()) {
    LSPO_FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument ||
                    r.status().code() == absl::StatusCode::kResourceExhausted);
    return 0;
  }
  for (const auto& [b, e] : r->generation_spans) LSPO_FUZZ_CHECK(b <= e && e <= r->text.size());
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzJinja)
