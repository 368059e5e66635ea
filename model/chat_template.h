// ChatML prompt rendering for SmolLM2-Instruct. Torch-free.
//
// Reproduces, character for character, the Jinja template stored in the GGUF
// (tokenizer.chat_template; docs/formats.md §5):
//   {% for message in messages %}
//     {% if loop.first and messages[0]['role'] != 'system' %}
//       {{ '<|im_start|>system\n' + DEFAULT_SYSTEM + '<|im_end|>\n' }}
//     {% endif %}
//     {{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
//   {% endfor %}
//   {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
// (without the whitespace shown here). The result is plain text; tokenize it with
// BpeTokenizer::Encode, which maps "<|im_start|>" / "<|im_end|>" to ids 1 / 2.
#ifndef LSPO_MODEL_CHAT_TEMPLATE_H_
#define LSPO_MODEL_CHAT_TEMPLATE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace lspo::model {

// One chat turn. `role` is "system", "user" or "assistant" (not checked: the template copies
// any string); `content` is UTF-8 text.
struct ChatMessage {
  std::string role;
  std::string content;
};

// SmolLM2-Instruct's built-in system prompt (no final period, docs/formats.md §5).
inline constexpr absl::string_view kSmolLmDefaultSystemPrompt =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// Renders `messages` with the ChatML template above. If the first message's role is not
// "system", a system turn with `default_system` is inserted before it (nothing is inserted for
// an empty list). With `add_generation_prompt`, "<|im_start|>assistant\n" is appended.
// Never fails.
std::string ApplyChatMlTemplate(absl::Span<const ChatMessage> messages,
                                bool add_generation_prompt,
                                absl::string_view default_system = kSmolLmDefaultSystemPrompt);

// A model's chat template, recognised from its Jinja source (no Jinja engine is packaged for
// C++ on the registries this project uses, so the families' real templates are recognised
// and rendered natively).
//   kChatMl: "<|im_start|>ROLE\nCONTENT<|im_end|>\n" turns and "<|im_start|>assistant\n" as
//            the generation prompt (SmolLM2, Qwen2.5). The default system prompt is the
//            literal text of the first '<|im_start|>system\n...<|im_end|>' string literal in
//            the template (SmolLM2's "You are a helpful AI assistant named SmolLM, ...",
//            Qwen2.5's "You are Qwen, created by Alibaba Cloud. ..."); none if it has none.
struct ChatTemplate {
  enum class Kind { kChatMl };
  Kind kind = Kind::kChatMl;
  std::string default_system;  // inserted before a conversation without a system turn

  // Recognises `jinja_source` (tokenizer_config.json's chat_template or chat_template.jinja).
  // Errors: kUnimplemented when the template is empty or of a family not recognised, naming
  // what it looked for (pass --chat_template / data.chat_template, or use a plain prompt).
  static absl::StatusOr<ChatTemplate> Recognise(absl::string_view jinja_source);

  // The conversation as text, as transformers' apply_chat_template(tokenize=False) renders it
  // with this template. Never fails.
  std::string Render(absl::Span<const ChatMessage> messages, bool add_generation_prompt) const;
};

}  // namespace lspo::model

#endif  // LSPO_MODEL_CHAT_TEMPLATE_H_
