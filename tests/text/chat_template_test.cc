// Tests of text/jinja.h and text/chat_template.h against transformers
// (tests/oracle/make_chat_template_oracle.py -> tests/oracle/data/chat_template_oracle.json):
//   * the Jinja subset: 63 small templates rendered by transformers' own Jinja environment;
//   * the real chat templates of SmolLM2, Qwen2.5, Llama 3 / 3.1 / 3.2, Mistral v0.1 / v0.3 and
//     Zephyr (TinyLlama) on five conversations, with and without a system turn and the
//     generation prompt: the text and the token ids of apply_chat_template, and the templates'
//     own errors (Mistral refuses a conversation whose roles do not alternate). The ids are
//     those of `tokenizers` on the text; apply_chat_template's differ for the Llama-2-style
//     tokenizer only, where transformers 5 replaces tokenizer.json's pre-tokenizer;
//   * the byte spans of {% generation %} blocks (return_assistant_tokens_mask);
//   * the real SmolLM2 GGUF's template and tokenizer against apply_chat_template ids
//     (tests/oracle/data/generate_oracle.json).
#include "text/chat_template.h"

#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/gguf.h"
#include "nlohmann/json.hpp"
#include "tests/chatml_reference.h"
#include "tests/test_files.h"
#include "text/jinja.h"
#include "text/tokenizer.h"

namespace lspo::model {
namespace {

using ::lspo::tests::ApplyChatMlTemplate;
using ::lspo::tests::ReadAll;

using jinja::Value;
using Json = nlohmann::ordered_json;

constexpr char kOracle[] = "tests/oracle/data/chat_template_oracle.json";
constexpr char kTemplates[] = "tests/oracle/data/chat_templates/";
constexpr char kTokenizers[] = "tests/oracle/data/hf_tokenizers/";

const Json& Oracle() {
  static const Json* oracle = [] {
    std::ifstream in(kOracle);
    EXPECT_TRUE(in.good()) << kOracle;
    return new Json(Json::parse(in));
  }();
  return *oracle;
}

// JSON (insertion order kept) -> template value.
Value FromJson(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return Value::Int(j.get<int64_t>());
    case Json::value_t::number_float:
      return Value::Float(j.get<double>());
    case Json::value_t::string:
      return Value::Str(j.get<std::string>());
    case Json::value_t::array: {
      Value::List items;
      for (const auto& x : j) items.push_back(FromJson(x));
      return Value::MakeList(std::move(items));
    }
    case Json::value_t::object: {
      Value::Dict items;
      for (const auto& [k, x] : j.items()) items.emplace_back(k, FromJson(x));
      return Value::MakeDict(std::move(items));
    }
    default:
      return Value();
  }
}

std::vector<ChatMessage> Conversation(int index) {
  std::vector<ChatMessage> chat;
  for (const auto& m : Oracle()["conversations"][static_cast<size_t>(index)]) {
    chat.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return chat;
}

// The engine renders every oracle template as transformers' Jinja environment does, and
// fails where it fails.
TEST(JinjaTest, RendersAsTransformersJinjaEnvironment) {
  int checked = 0, errors = 0;
  for (const auto& c : Oracle()["engine"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(name);
    absl::StatusOr<jinja::RenderOutput> out = [&]() -> absl::StatusOr<jinja::RenderOutput> {
      auto t = jinja::Template::Parse(c["template"].get<std::string>());
      if (!t.ok()) return t.status();
      Value::Dict globals;
      for (const auto& [k, v] : c["context"].items()) globals.emplace_back(k, FromJson(v));
      globals.emplace_back("raise_exception",
                           Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
                             return absl::InvalidArgumentError(a.positional.at(0).ToString());
                           }));
      return t->Render(globals);
    }();
    if (c["error"].get<bool>()) {
      ++errors;
      EXPECT_FALSE(out.ok()) << "expected an error like: " << c["message"].get<std::string>()
                             << "; rendered: " << (out.ok() ? out->text : "");
      if (!out.ok()) {
        EXPECT_NE(out.status().message().find("line "), absl::string_view::npos) << out.status();
      }
    } else {
      ASSERT_TRUE(out.ok()) << out.status();
      EXPECT_EQ(out->text, c["output"].get<std::string>());
    }
    ++checked;
  }
  EXPECT_EQ(checked, 63);
  EXPECT_EQ(errors, 8);
}

TEST(JinjaTest, ErrorsNameTheLineAndTheConstruct) {
  auto bad = jinja::Template::Parse("line one\n{% if x %}\n{{ 1 + }}\n{% endif %}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 3"), absl::string_view::npos) << bad.status();
  auto include = jinja::Template::Parse("{% include 'x.jinja' %}");
  EXPECT_EQ(include.status().code(), absl::StatusCode::kUnimplemented) << include.status();
  EXPECT_NE(include.status().message().find("include"), absl::string_view::npos);
  auto raise = jinja::Template::Parse("a\nb\n{{ raise_exception('roles must alternate') }}");
  ASSERT_TRUE(raise.ok()) << raise.status();
  Value::Dict g = {
      {"raise_exception", Value::Function([](const Value::Args& a) -> absl::StatusOr<Value> {
         return absl::InvalidArgumentError(a.positional.at(0).ToString());
       })}};
  auto r = raise->Render(g);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("line 3"), absl::string_view::npos) << r.status();
  EXPECT_NE(r.status().message().find("roles must alternate"), absl::string_view::npos);
  // Runaway templates stop with kResourceExhausted instead of exhausting memory.
  auto runaway = jinja::Template::Parse(
      "{% for i in range(100000) %}{% for j in range(1000) %}x{% endfor %}{% endfor %}");
  ASSERT_TRUE(runaway.ok());
  EXPECT_EQ(runaway->Render({}).status().code(), absl::StatusCode::kResourceExhausted);
  // Hostile input found by a break-it pass: each is an error, never a crash or a wrong value.
  auto render = [](const std::string& src) -> absl::Status {
    auto t = jinja::Template::Parse(src);
    if (!t.ok()) return t.status();
    return t->Render({}).status();
  };
  std::string chain = "{{ 1";
  for (int i = 0; i < 30000; ++i) chain += " + 1";
  EXPECT_EQ(render(chain + " }}").code(), absl::StatusCode::kInvalidArgument);  // stack depth
  std::string attrs = "{{ x", filters = "{{ 'a'";
  for (int i = 0; i < 100000; ++i) {
    attrs += ".a";
    filters += "|trim";
  }
  EXPECT_EQ(render(attrs + " }}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(render(filters + " }}").code(), absl::StatusCode::kInvalidArgument);
  std::string ok_chain = "{{ 0";
  for (int i = 0; i < 150; ++i) ok_chain += " + 1";
  auto ok = jinja::Template::Parse(ok_chain + " }}");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->Render({})->text, "150");
  EXPECT_EQ(render("{% set ns = namespace(v='x') %}{% for i in range(40) %}"
                   "{% set ns.v = ns.v ~ ns.v %}{% endfor %}")
                .code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(render("{% set ns = namespace(v=[1]) %}{% for i in range(40) %}"
                   "{% set ns.v = ns.v + ns.v %}{% endfor %}")
                .code(),
            absl::StatusCode::kResourceExhausted);
  // Lists count the bytes their items hold (held by value): 7 copies of a 10 MB string are 70
  // MB, refused, where counting 64 bytes per item let a list of 10^6 copies of a 60 MB string
  // through (60 TB). A list that small in items but large in bytes is refused by + too.
  const auto exhausted_naming = [&](const std::string& src, const std::string& what) {
    const absl::Status st = render(src);
    EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << src << ": " << st;
    EXPECT_NE(st.message().find(what), absl::string_view::npos) << st;
  };
  exhausted_naming("{% set x = [('A' * 1000000) * 10] * 7 %}", "64 MiB");
  exhausted_naming("{% set x = [('A' * 1000000) * 60] %}{% set y = x * 1000000 %}", "64 MiB");
  exhausted_naming("{% set x = [('A' * 1000000) * 40] %}{% set y = x + x %}",
                   "a list larger than 64 MiB");
  EXPECT_TRUE(render("{% set x = [('A' * 1000000) * 10] * 6 %}{{ x|length }}").ok());
  // The render's work is bounded too: 100 strings of 30 MB built in a loop (3 GB) stop at the
  // 1 GiB budget, each one under the 64 MiB value limit.
  exhausted_naming("{% for i in range(100) %}{% set s = ('A' * 1000000) * 30 %}{% endfor %}",
                   "1 GiB");
  // A filter's result counts alike (the string is built once; lower makes 100 copies).
  exhausted_naming(
      "{% set big = ('A' * 1000000) * 30 %}"
      "{% for i in range(100) %}{% set s = big|lower %}{% endfor %}",
      "1 GiB");
  for (const char* overflow :
       {"{{ (-9223372036854775807 - 1) // -1 }}", "{{ (-9223372036854775807 - 1) % -1 }}",
        "{{ 9223372036854775807 + 1 }}", "{{ 2 ** 63 }}", "{{ 10 ** 10 ** 10 }}",
        "{{ -9223372036854775807 - 2 }}"}) {
    EXPECT_EQ(render(overflow).code(), absl::StatusCode::kInvalidArgument) << overflow;
  }
  auto pow = jinja::Template::Parse("{{ 2 ** 62 }} {{ (-1) ** 1000001 }} {{ 0 ** 0 }}");
  ASSERT_TRUE(pow.ok());
  EXPECT_EQ(pow->Render({})->text, "4611686018427387904 -1 1");
  auto bad_utf8 = jinja::Template::Parse("ok\n{{ 'a' }}\xff\xfe");
  EXPECT_EQ(bad_utf8.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_utf8.status().message().find("invalid UTF-8"), absl::string_view::npos);
  // An unknown filter or test is refused when the template is parsed, even in a dead branch.
  for (const char* unknown :
       {"{% if false %}{{ x|nosuch }}{% endif %}hi", "{% if x is frobnicated %}{% endif %}"}) {
    EXPECT_EQ(jinja::Template::Parse(unknown).status().code(), absl::StatusCode::kUnimplemented)
        << unknown;
  }
  // Unbalanced and unterminated input.
  for (const char* src : {"{% endif %}", "{% for x in y %}", "{{ (1 }}", "{# never closed",
                          "{{ 'open }}", "{% if %}", "{{ a.b. }}", "{{ } }}"}) {
    auto t = jinja::Template::Parse(src);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << src << ": " << t.status();
  }
}

// The real templates through ChatTemplate, with a tokenizer of each family: the text and the
// ids of apply_chat_template, and its errors.
TEST(ChatTemplateTest, RealTemplatesGiveApplyChatTemplateTextAndIds) {
  int checked = 0, raised = 0, apply_differs = 0;
  std::set<std::string> templates;
  for (const auto& c : Oracle()["chats"]) {
    const std::string name = c["template"].get<std::string>();
    const int conv = c["conversation"].get<int>();
    const bool gen = c["add_generation_prompt"].get<bool>();
    SCOPED_TRACE(absl::StrCat(name, " conversation ", conv, gen ? " +generation prompt" : ""));
    auto tok = BpeTokenizer::FromHfFolder(kTokenizers + c["tokenizer"].get<std::string>());
    ASSERT_TRUE(tok.ok()) << tok.status();
    auto tmpl = ChatTemplate::ForTokenizer(*tok, ReadAll(kTemplates + name + ".jinja"));
    ASSERT_TRUE(tmpl.ok()) << tmpl.status();
    auto r = tmpl->Render(Conversation(conv), gen, {{"date_string", Value::Str("26 Jul 2024")}});
    templates.insert(name);
    ++checked;
    if (c["error"].get<bool>()) {
      ++raised;
      ASSERT_FALSE(r.ok()) << "transformers raised " << c["message"].get<std::string>();
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(r.status().message().find("roles must alternate"), absl::string_view::npos)
          << r.status();
      continue;
    }
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->text, c["text"].get<std::string>());
    EXPECT_EQ(tok->Encode(r->text), c["ids"].get<std::vector<int32_t>>());
    // transformers 5 rebuilds LlamaTokenizer-class pre-tokenizers (see the oracle script):
    // its ids differ from tokenizer.json's only for that folder.
    if (c["apply_ids"] != c["ids"]) {
      ++apply_differs;
      EXPECT_EQ(c["tokenizer"].get<std::string>(), "spm_legacy");
    }
  }
  EXPECT_EQ(apply_differs, 8);
  EXPECT_EQ(templates.size(), 10u);
  EXPECT_EQ(checked, 100);
  EXPECT_EQ(raised, 6);  // Mistral v0.1, v0.3 and Gemma 3 refuse the non-alternating conversation
}

TEST(ChatTemplateTest, GenerationBlocksGiveTransformersAssistantSpans) {
  const Json& g = Oracle()["generation"];
  auto tmpl = ChatTemplate::FromSource(g["template"].get<std::string>(), {"<s>", "</s>", "", ""});
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  EXPECT_TRUE(tmpl->has_generation_blocks());
  auto r = tmpl->Render(Conversation(g["conversation"].get<int>()), false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->text, g["text"].get<std::string>());
  std::vector<std::vector<size_t>> spans;
  for (const auto& [b, e] : r->generation_spans) spans.push_back({b, e});
  EXPECT_EQ(spans, g["spans"].get<std::vector<std::vector<size_t>>>());
  EXPECT_EQ(r->text.substr(spans[0][0], spans[0][1] - spans[0][0]), " Tokyo \n\n<|im_end|>");
}

TEST(ChatTemplateTest, Llama32DateComesFromStrftimeNowUnlessGiven) {
  auto tok = BpeTokenizer::FromHfFolder(std::string(kTokenizers) + "llama3");
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto tmpl = ChatTemplate::ForTokenizer(*tok, std::string(kTemplates) + "llama3.2.jinja");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  auto r = tmpl->Render({{"user", "hi"}}, true);
  ASSERT_TRUE(r.ok()) << r.status();
  char today[32];
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  std::strftime(today, sizeof(today), "Today Date: %d %b %Y\n", &local);
  EXPECT_NE(r->text.find(today), std::string::npos) << r->text;
}

TEST(ChatTemplateTest, OverridesAndMissingTemplates) {
  auto tok = BpeTokenizer::FromHfFolder(std::string(kTokenizers) + "misc");
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_TRUE(tok->chat_template().empty());
  // No template of its own and no override: a clear error naming the fix.
  auto none = ChatTemplate::ForTokenizer(*tok);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("data.chat_template"), absl::string_view::npos);
  // A path that is not a file and not Jinja text.
  auto missing = ChatTemplate::ForTokenizer(*tok, "/no/such/template.jinja");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound) << missing.status();
  // Inline Jinja text.
  auto inline_t = ChatTemplate::ForTokenizer(
      *tok, "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}");
  ASSERT_TRUE(inline_t.ok()) << inline_t.status();
  auto r = inline_t->Render({{"user", "a"}, {"assistant", "b"}}, false);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->text, "[user]a[assistant]b");
  // A broken override names where it came from.
  auto broken = ChatTemplate::ForTokenizer(*tok, "{% if messages %}unclosed");
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(broken.status().message().find("override"), absl::string_view::npos) << broken.status();
}

constexpr char kGguf[] = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

TEST(ChatTemplateTest, SmolLm2GgufTemplateGivesApplyChatTemplateIds) {
  if (!std::ifstream(kGguf).good()) GTEST_SKIP() << kGguf << " is absent (scripts/setup)";
  auto gguf = GgufFile::Open(kGguf);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto tok = BpeTokenizer::FromGguf(*gguf);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->chat_template(), ReadAll(std::string(kTemplates) + "smollm2.jinja"));
  auto tmpl = ChatTemplate::ForTokenizer(*tok);
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  std::ifstream in("tests/oracle/data/generate_oracle.json");
  ASSERT_TRUE(in.good());
  const Json oracle = Json::parse(in);
  int with_system = 0;
  for (const auto& c : oracle["cases"]) {
    std::vector<ChatMessage> chat;
    for (const auto& m : c["messages"]) chat.push_back({m["role"], m["content"]});
    with_system += chat[0].role == "system";
    auto r = tmpl->Render(chat, /*add_generation_prompt=*/true);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(tok->Encode(r->text), c["prompt_ids"].get<std::vector<int32_t>>());
    // The ChatML renderer of the classification data path gives the same text.
    EXPECT_EQ(r->text, ApplyChatMlTemplate(chat, true));
  }
  EXPECT_EQ(with_system, 1);
}

}  // namespace
}  // namespace lspo::model
