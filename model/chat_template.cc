// ChatML template; see chat_template.h and docs/formats.md §5.
#include "model/chat_template.h"

#include "absl/strings/str_cat.h"

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

}  // namespace lspo::model
