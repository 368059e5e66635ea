// SmolLM2-Instruct's ChatML chat template written out by hand: an independent rendering that
// the tests compare text/chat_template.h (the Jinja interpreter) and the classification
// examples of data/datasets.h against. Header-only, test-only.
//
// ApplyChatMlTemplate reproduces, character for character, the Jinja template stored in the
// GGUF (tokenizer.chat_template; docs/formats.md §5):
//   {% for message in messages %}
//     {% if loop.first and messages[0]['role'] != 'system' %}
//       {{ '<|im_start|>system\n' + DEFAULT_SYSTEM + '<|im_end|>\n' }}
//     {% endif %}
//     {{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}
//   {% endfor %}
//   {% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
// (without the whitespace shown here). The result is plain text; tokenize it with
// BpeTokenizer::Encode, which maps "<|im_start|>" / "<|im_end|>" to ids 1 / 2.
#ifndef LSPO_TESTS_CHATML_REFERENCE_H_
#define LSPO_TESTS_CHATML_REFERENCE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "text/chat_template.h"

namespace lspo::tests {

// SmolLM2-Instruct's built-in system prompt (no final period, docs/formats.md §5).
inline constexpr absl::string_view kSmolLmDefaultSystemPrompt =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

// Renders `messages` with the ChatML template above. If the first message's role is not
// "system", a system turn with `default_system` is inserted before it (nothing is inserted for
// an empty list). With `add_generation_prompt`, "<|im_start|>assistant\n" is appended.
inline std::string ApplyChatMlTemplate(absl::Span<const model::ChatMessage> messages,
                                       bool add_generation_prompt,
                                       absl::string_view default_system =
                                           kSmolLmDefaultSystemPrompt) {
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

}  // namespace lspo::tests

#endif  // LSPO_TESTS_CHATML_REFERENCE_H_
