// Which supervised fine-tuning format a data record's keys name: the one rule shared by the
// scheduler (which fills an unset data.format from the first record) and data/sft.h (which
// checks every record against its file's format). Header-only, no JSON library: the caller
// says how to test for a key (a parsed object's contains(), or a search of the raw line).
#ifndef LSPO_RUNTIME_RECORD_KEYS_H_
#define LSPO_RUNTIME_RECORD_KEYS_H_

#include "absl/strings/string_view.h"

namespace lspo::runtime {

// "chat" for a record with "messages" or ShareGPT's "conversations", else "alpaca" with
// "instruction", else "prompt_completion" with both "prompt" and "completion", else "" (no SFT
// format; a {"label", "text"} record is classification data). has_key(name) -> bool tests one
// key.
template <typename HasKey>
absl::string_view SftFormatOfKeys(HasKey has_key) {
  if (has_key("messages") || has_key("conversations")) return "chat";
  if (has_key("instruction")) return "alpaca";
  if (has_key("prompt") && has_key("completion")) return "prompt_completion";
  return "";
}

}  // namespace lspo::runtime

#endif  // LSPO_RUNTIME_RECORD_KEYS_H_
