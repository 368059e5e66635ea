// ChatML template; see chat_template.h and docs/formats.md §5.
#include "model/chat_template.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace lspo::model {

std::string ApplyChatMlTemplate(absl::Span<const ChatMessage> messages,
                                bool add_generation_prompt, absl::string_view default_system) {
  std::string out;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0 && messages[0].role != "system") {
      absl::StrAppend(&out, "<|im_start|>system\n", default_system, "<|im_end|>\n");
    }
    absl::StrAppend(&out, "<|im_start|>", messages[i].role, "\n", messages[i].content,
                    "<|im_end|>\n");
  }
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Recognise(absl::string_view src) {
  if (src.find("<|im_start|>") != absl::string_view::npos &&
      src.find("<|im_end|>") != absl::string_view::npos) {
    ChatTemplate t;
    t.kind = Kind::kChatMl;
    // The default system prompt: a string literal '<|im_start|>system\n TEXT <|im_end|>'
    // whose TEXT has no quote or brace (i.e. is not built from message content). The newline
    // is a Jinja escape in tokenizer_config.json and a real newline in GGUF files.
    for (absl::string_view open : {"<|im_start|>system\\n", "<|im_start|>system\n"}) {
      for (size_t at = src.find(open); at != absl::string_view::npos && t.default_system.empty();
           at = src.find(open, at + 1)) {
        const size_t begin = at + open.size();
        const size_t end = src.find("<|im_end|>", begin);
        if (end == absl::string_view::npos) break;
        absl::string_view text = src.substr(begin, end - begin);
        if (text.empty() || text.find_first_of("'\"{}") != absl::string_view::npos) continue;
        t.default_system = absl::StrReplaceAll(text, {{"\\n", "\n"}});
      }
    }
    return t;
  }
  return absl::UnimplementedError(absl::StrCat(
      "chat template not recognised (", src.empty() ? "the tokenizer has none" : "not ChatML",
      "); supported: ChatML (<|im_start|> / <|im_end|>, as SmolLM2 and Qwen2.5 use). Use a "
      "plain prompt instead of a conversation"));
}

std::string ChatTemplate::Render(absl::Span<const ChatMessage> messages,
                                 bool add_generation_prompt) const {
  if (default_system.empty() && (messages.empty() || messages[0].role != "system")) {
    std::string out;
    for (const ChatMessage& m : messages) {
      absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
    }
    if (add_generation_prompt) out += "<|im_start|>assistant\n";
    return out;
  }
  return ApplyChatMlTemplate(messages, add_generation_prompt, default_system);
}

}  // namespace lspo::model
