// Tests of model/chat_template.h against transformers' apply_chat_template ids for SmolLM2
// (tests/oracle/data/generate_oracle.json, made by tests/oracle/make_generate_oracle.py from
// the GGUF's own template: one conversation without and one with a system turn).
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "model/gguf.h"
#include "model/tokenizer.h"
#include "nlohmann/json.hpp"

namespace lspo::model {
namespace {

constexpr char kGguf[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(ChatTemplateTest, SmolLm2TemplateGivesApplyChatTemplateIds) {
  if (!std::ifstream(kGguf).good()) GTEST_SKIP() << kGguf << " is absent (scripts/setup)";
  auto gguf = GgufFile::Open(kGguf);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto tok = BpeTokenizer::FromGguf(*gguf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto tmpl = ChatTemplate::Recognise(tok->chat_template());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_EQ(tmpl->kind, ChatTemplate::Kind::kChatMl);
  EXPECT_EQ(tmpl->default_system, std::string(kSmolLmDefaultSystemPrompt));
  std::ifstream in("tests/oracle/data/generate_oracle.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json oracle = nlohmann::json::parse(in);
  int with_system = 0;
  for (const auto& c : oracle["cases"]) {
    std::vector<ChatMessage> chat;
    for (const auto& m : c["messages"]) chat.push_back({m["role"], m["content"]});
    with_system += chat[0].role == "system";
    EXPECT_EQ(tok->Encode(tmpl->Render(chat, /*add_generation_prompt=*/true)),
              c["prompt_ids"].get<std::vector<int32_t>>());
  }
  EXPECT_EQ(with_system, 1);
}

TEST(ChatTemplateTest, DefaultSystemPromptIsTheTemplatesLiteralOrNone) {
  // A ChatML template that only copies the caller's system turn has no default.
  const std::string plain =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  auto t = ChatTemplate::Recognise(plain);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->default_system.empty());
  EXPECT_EQ(t->Render({{"user", "hi"}}, true),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  // A literal default after a branch that builds the system turn from the messages.
  const std::string with_default =
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
      "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nBe "
      "brief.\\nAlways.<|im_end|>\\n' }}{%- endif %}";
  t = ChatTemplate::Recognise(with_default + plain);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->default_system, "Be brief.\nAlways.");
  EXPECT_EQ(t->Render({{"user", "hi"}}, false),
            "<|im_start|>system\nBe brief.\nAlways.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n");
  // Not ChatML: refused by name.
  auto other = ChatTemplate::Recognise("{{ bos_token }}[INST] {{ messages[0]['content'] }}");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kUnimplemented) << other.status();
  EXPECT_NE(std::string(other.status().message()).find("ChatML"), std::string::npos);
  EXPECT_EQ(ChatTemplate::Recognise("").status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace lspo::model
