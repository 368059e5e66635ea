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

}  // namespace lspo::model

#endif  // LSPO_MODEL_CHAT_TEMPLATE_H_
