// Chat templates: a model's Jinja chat template rendered as transformers renders it
// (ChatTemplate, through text/jinja.h). Torch-free. (SmolLM2's ChatML written out by hand,
// the independent rendering the tests compare against, is tests/chatml_reference.h.)
#ifndef LSPO_TEXT_CHAT_TEMPLATE_H_
#define LSPO_TEXT_CHAT_TEMPLATE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "text/jinja.h"
#include "text/tokenizer.h"

namespace lspo::model {

// One chat turn. `role` is "system", "user" or "assistant" (not checked: the template copies
// any string); `content` is UTF-8 text.
struct ChatMessage {
  std::string role;
  std::string content;
};

// The special-token strings a chat template sees, as transformers passes
// tokenizer.special_tokens_map to it; an empty string leaves the variable undefined (Qwen2's
// bos_token is null, for example, so `{{ bos_token }}` renders nothing).
struct ChatTemplateTokens {
  std::string bos_token;
  std::string eos_token;
  std::string unk_token;
  std::string pad_token;
};

// A conversation rendered by a chat template: the text, and the byte spans [begin, end) of it
// that the template's {% generation %} blocks produced (empty when the template has none).
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

// A model's chat template: its Jinja source run by text/jinja.h with the variables
// transformers' apply_chat_template gives it (transformers/utils/chat_template_utils.py):
// messages (a list of {"role", "content"} dicts), add_generation_prompt, tools = None,
// documents = None, the special-token strings, raise_exception(message) (an error naming the
// message) and strftime_now(format) (the local time, as datetime.now().strftime). Whatever the
// family (ChatML, Llama 3.x headers, Mistral [INST], Zephyr, ...), the template itself decides
// the text; tests/text/chat_template_test.cc checks the real templates of SmolLM2, Qwen2.5,
// Llama 3, 3.1 and 3.2 and Mistral v0.1 and v0.3 against apply_chat_template.
class ChatTemplate {
 public:
  // Parses `jinja_source`. Errors: kFailedPrecondition for an empty source (the model has no
  // chat template: set data.chat_template / --chat_template, or use a plain prompt);
  // kInvalidArgument naming the line for a syntax error; kUnimplemented naming a construct
  // outside the supported subset (text/jinja.h).
  static absl::StatusOr<ChatTemplate> FromSource(absl::string_view jinja_source,
                                                 ChatTemplateTokens tokens);

  // The template a job or command uses: `override_template` when it is not empty (the Jinja
  // text itself, or the path of a file holding it, e.g. a chat_template.jinja; a value that
  // names an existing file is read), else the tokenizer's own chat_template. The special-token
  // strings are the tokenizer's bos / eos / unk / pad tokens. Errors: as FromSource, with the
  // source named (the override's path, or "the tokenizer's chat_template"); kNotFound /
  // kDataLoss when the override file cannot be read.
  static absl::StatusOr<ChatTemplate> ForTokenizer(const BpeTokenizer& tokenizer,
                                                   absl::string_view override_template = "");

  // The conversation as text, as apply_chat_template(messages, tokenize=False,
  // add_generation_prompt=...) renders it with this template; `extra` adds variables (like
  // apply_chat_template's keyword arguments, e.g. {"date_string", "26 Jul 2024"} for the
  // Llama 3.1 template). Tokenize the text with BpeTokenizer::Encode (which adds no BOS, as
  // apply_chat_template(tokenize=True) does not: the template writes the BOS itself).
  // Errors: kInvalidArgument naming the template line for a failed render, e.g. the
  // template's own raise_exception ("Conversation roles must alternate ..."), which this
  // returns with its message.
  absl::StatusOr<RenderedChat> Render(absl::Span<const ChatMessage> messages,
                                      bool add_generation_prompt,
                                      const jinja::Value::Dict& extra = {}) const;

  const std::string& source() const { return source_; }
  // True when the template marks assistant turns with {% generation %} (TRL's
  // assistant_only_loss relies on those spans).
  bool has_generation_blocks() const { return template_.has_generation_blocks(); }

 private:
  std::string source_;
  ChatTemplateTokens tokens_;
  jinja::Template template_;
};

}  // namespace lspo::model

#endif  // LSPO_TEXT_CHAT_TEMPLATE_H_
