// Chat templates; see chat_template.h and docs/formats.md §5.
#include "text/chat_template.h"

#include <algorithm>
#include <ctime>

#include "absl/strings/str_cat.h"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"

namespace lspo::model {

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(absl::string_view jinja_source,
                                                      ChatTemplateTokens tokens) {
  if (jinja_source.empty()) {
    return absl::FailedPreconditionError(
        "the model has no chat template (tokenizer_config.json has no chat_template and there "
        "is no chat_template.jinja); set data.chat_template (or --chat_template) to a Jinja "
        "template or a .jinja file, or use a plain prompt");
  }
  ChatTemplate t;
  t.source_ = std::string(jinja_source);
  t.tokens_ = std::move(tokens);
  ASSIGN_OR_RETURN(t.template_, jinja::Template::Parse(jinja_source));
  return t;
}

absl::StatusOr<ChatTemplate> ChatTemplate::ForTokenizer(const BpeTokenizer& tokenizer,
                                                        absl::string_view override_template) {
  ChatTemplateTokens tokens;
  auto text_of = [&](int32_t id) { return id >= 0 ? tokenizer.IdToToken(id) : std::string(); };
  tokens.bos_token = text_of(tokenizer.bos_id());
  tokens.eos_token = text_of(tokenizer.eos_id());
  tokens.unk_token = text_of(tokenizer.unk_id());
  tokens.pad_token = text_of(tokenizer.pad_id());
  std::string source = tokenizer.chat_template();
  std::string where = "the tokenizer's chat_template";
  if (!override_template.empty()) {
    const std::string path(override_template);
    const bool looks_like_jinja =
        path.find("{%") != std::string::npos || path.find("{{") != std::string::npos;
    if (!looks_like_jinja && runtime::IsRegularFile(path)) {
      ASSIGN_OR_RETURN(source, runtime::ReadFileToString(path));
      where = path;
    } else if (!looks_like_jinja) {
      return absl::NotFoundError(absl::StrCat(
          "chat template override '", path,
          "' is neither a readable file nor Jinja text "
          "(no {{ or {% in it); pass the template itself or the path of a .jinja file"));
    } else {
      source = path;
      where = "the chat_template override";
    }
  }
  auto t = FromSource(source, std::move(tokens));
  if (!t.ok() && !override_template.empty()) {
    return absl::Status(t.status().code(), absl::StrCat(where, ": ", t.status().message()));
  }
  return t;
}

absl::StatusOr<RenderedChat> ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                                  bool add_generation_prompt,
                                                  const jinja::Value::Dict& extra) const {
  using jinja::Value;
  Value::List list;
  for (const ChatMessage& m : messages) {
    list.push_back(
        Value::MakeDict({{"role", Value::Str(m.role)}, {"content", Value::Str(m.content)}}));
  }
  Value::Dict globals = {
      {"messages", Value::MakeList(std::move(list))},
      {"add_generation_prompt", Value::Bool(add_generation_prompt)},
      {"tools", Value::None()},
      {"documents", Value::None()},
      {"raise_exception", Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
         return absl::InvalidArgumentError(absl::StrCat(
             "the template raised: ", a.positional.empty() ? "" : a.positional[0].ToString()));
       })},
      {"strftime_now", Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
         if (a.positional.empty() || !a.positional[0].is_string()) {
           return absl::InvalidArgumentError("strftime_now() takes a format string");
         }
         const std::time_t now = std::time(nullptr);
         std::tm local{};
         localtime_r(&now, &local);
         char buf[256];
         const size_t n =
             std::strftime(buf, sizeof(buf), a.positional[0].as_string().c_str(), &local);
         return Value::Str(std::string(buf, n));
       })},
  };
  for (const auto& [name, text] :
       {std::pair<const char*, const std::string*>{"bos_token", &tokens_.bos_token},
        {"eos_token", &tokens_.eos_token},
        {"unk_token", &tokens_.unk_token},
        {"pad_token", &tokens_.pad_token}}) {
    if (!text->empty()) globals.emplace_back(name, Value::Str(*text));
  }
  for (const auto& kv : extra) {
    auto it = std::find_if(globals.begin(), globals.end(),
                           [&](const auto& g) { return g.first == kv.first; });
    if (it != globals.end()) {
      it->second = kv.second;
    } else {
      globals.push_back(kv);
    }
  }
  ASSIGN_OR_RETURN(jinja::RenderOutput out, template_.Render(globals));
  return RenderedChat{std::move(out.text), std::move(out.generation_spans)};
}

}  // namespace lspo::model
