#!/usr/bin/env python3
"""Chat-template oracle for text/jinja.h and text/chat_template.h
(tests/text/chat_template_test.cc).

Two parts, both rendered by transformers (5.x) itself:
  * "engine": small templates that exercise the Jinja subset (statements, expressions,
    filters, tests, whitespace control, errors), rendered by transformers' own compiled
    environment (chat_template_utils._compile_jinja_template: ImmutableSandboxedEnvironment,
    trim_blocks, lstrip_blocks, loopcontrols, the generation tag, tojson as json.dumps) with
    the given variables. "error": true marks a template whose render raises.
  * "chats": the real templates in tests/oracle/data/chat_templates/ (README.md there names
    their sources) applied by tokenizer.apply_chat_template to multi-turn conversations with
    and without a system turn, with add_generation_prompt false and true: the text and the
    token ids, with a tokenizer of the family (tests/oracle/data/hf_tokenizers/): "ids" from
    `tokenizers` on the text, "apply_ids" from apply_chat_template(tokenize=True). A template
    that raises for a conversation (Mistral's alternation check) records the error instead.
  * "generation": a template with {% generation %} blocks, and the byte spans
    render_jinja_template(return_assistant_tokens_mask=True) reports (converted from
    character to UTF-8 byte offsets).
Writes tests/oracle/data/chat_template_oracle.json. Run from the repository root:
  /tmp/o/bin/python tests/oracle/make_chat_template_oracle.py
"""
import json

import tokenizers
import transformers
from transformers import AutoTokenizer
from transformers.utils import chat_template_utils as ctu

OUT = "tests/oracle/data/chat_template_oracle.json"
TEMPLATES = "tests/oracle/data/chat_templates"
TOKENIZERS = "tests/oracle/data/hf_tokenizers"

# template file -> tokenizer folder of its family
CHAT_TEMPLATES = {
    "smollm2": "smollm2",
    "qwen2.5": "qwen2",
    "llama3": "llama3",
    "llama3.1": "llama3",
    "llama3.2": "llama3",
    "mistral-v0.1": "spm_legacy",
    "mistral-v0.3": "spm_metaspace",
    "zephyr": "spm_legacy",
    "qwen3": "qwen2",  # Qwen3 ships the Qwen2.5 tokenizer
    "gemma3": "spm_metaspace",  # no Gemma tokenizer here: ids of a SentencePiece-style one
}

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "List three primary colours."},
     {"role": "assistant", "content": "Red, yellow, blue."},
     {"role": "user", "content": "And secondary ones?"}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello. How can I help?"},
     {"role": "user", "content": "Translate 'good morning' to German."},
     {"role": "assistant", "content": "Guten Morgen."}],
    [{"role": "system", "content": "  Answer in one word.\n"},
     {"role": "user", "content": "  Grüße aus 東京 😀 — what city?  \n"},
     {"role": "assistant", "content": " Tokyo \n\n"}],
    # Not alternating: Mistral's templates raise, the others render it.
    [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
]

ENGINE = [
    ("text only", "plain text\n", {}),
    ("trailing newline kept once", "a\n\n", {}),
    ("crlf normalised", "a\r\nb\rc", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nend", {}),
    ("lstrip_blocks", "  {% if true %}\n  x\n  {% endif %}\n", {}),
    ("lstrip_blocks off with +", "  {%+ if true %}x{% endif %}", {}),
    ("minus strips", "a  \n {%- if true -%} \n b \n {%- endif -%}\n  c", {}),
    ("var minus", "a {{- 'b' -}} c", {}),
    ("comment", "a {# note #}b\n  {#- c -#}  d", {}),
    ("comment trim", "x\n{# c #}\ny", {}),
    ("string escapes", r"""{{ 'a\nb\t\'q\' \"d\" \\ \x41\u00e9\U0001F600 \d' }}""", {}),
    ("string with newline", "{{ 'line1\nline2' }}", {}),
    ("closing braces in strings", "{{- \"}}\" -}}{{ '%}' }}{{ '{{' }}", {}),
    ("adjacent strings", "{{ 'a' 'b' \"c\" }}", {}),
    ("numbers", "{{ 1 + 2 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} "
                "{{ 1.5 * 2 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-7 }} {{ 3.0 }} {{ 10 - 3 - 2 }}", {}),
    ("concat tilde", "{{ 'a' ~ 1 ~ none ~ true ~ undefined_name }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ not true or true }} {{ 2 - -1 }}", {}),
    ("comparisons", "{{ 1 < 2 < 3 }} {{ 1 < 2 > 3 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ true == 1 }} "
                    "{{ none == none }} {{ [1, 2] == [1, 2] }} {{ {'a': 1} == {'a': 1} }} {{ 'x' != 'y' }}", {}),
    ("in", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} "
           "{{ 'role' in m }} {{ 'tool_calls' in m }}", {"m": {"role": "user", "content": "x"}}),
    ("and or values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|{{ none or [] }}", {}),
    ("conditional expr", "{{ 'y' if x else 'n' }} {{ 'y' if not x else 'n' }} [{{ 'y' if false }}]",
     {"x": 1}),
    ("if elif else", "{% for v in [0, 1, 2] %}{% if v == 0 %}zero{% elif v == 1 %}one{% else %}many{% endif %} {% endfor %}", {}),
    ("for loop object", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
                        "{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
                        "{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('o', 'e') }};{% endfor %}", {}),
    ("for else", "{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("for filter", "{% for x in range(10) if x is odd %}{{ x }}{{ loop.length }} {% endfor %}", {}),
    ("for unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d | items %}{{ k }}{% endfor %}",
     {"d": {"b": 1, "a": [1, "x"]}}),
    ("for over dict and string", "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'héllo' %}{{ c }}.{% endfor %}",
     {"d": {"x": 1, "y": 2}}),
    ("break continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("set scoping", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}{% endfor %}{{ x }}"
                    "{% if true %}{% set y = 5 %}{% endif %}{{ y }}", {}),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for m in msgs %}{% if m.role == 'user' %}"
                  "{% set ns.count = ns.count + 1 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}",
     {"msgs": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}]}),
    ("set block", "{% set x %}a{{ 1 + 1 }}b{% endset %}[{{ x }}]", {}),
    ("set tuple", "{% set a, b = [1, 2] %}{{ a }}{{ b }}{% set c = 1, 2 %}{{ c }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', '?') }} {{ greet(name='Cy', punct='.') }}", {}),
    ("subscripts and slices", "{{ l[0] }}{{ l[-1] }}{{ l[1:] }}{{ l[:-1] }}{{ l[::2] }}{{ l[::-1] }}{{ s[1:3] }}{{ s[-2:] }}{{ s[0] }}"
                              "{{ d['k'] }}{{ d.k }}{{ l.0 }}[{{ d.missing }}][{{ l[10] }}]",
     {"l": [1, 2, 3, 4], "s": "añbc", "d": {"k": "v"}}),
    ("messages slice", "{% set rest = messages[1:] %}{{ rest | length }} {{ messages[0]['role'] }} {{ rest[0].content }}",
     {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}),
    ("literals", "{{ [1, 'a', none, true, 1.5] }} {{ {'a': 1, 'b': [2]} }} {{ (1, 2) }} {{ () }} {{ \"it's\" }} {{ ['it\\'s'] }}", {}),
    ("print values", "{{ none }} {{ true }} {{ False }} {{ x }} {{ y }} {{ l }} {{ d }}",
     {"x": 3, "y": 2.5, "l": ["a", 1], "d": {"k": None}}),
    ("undefined is falsy and empty", "[{{ nope }}]{% if nope %}T{% else %}F{% endif %}{% for x in nope %}x{% endfor %}{{ nope is defined }}{{ nope | length }}", {}),
    ("none attribute is undefined", "{{ x.y is defined }}", {"x": None}),
    ("filters strings", "{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'abc' | upper }}|{{ 'ABC' | lower }}|{{ 'hello world' | title }}|"
                        "{{ 'hELLO' | capitalize }}|{{ 'aXbXc' | replace('X', '-') }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 'a b  c' | wordcount }}|{{ 'abc' | reverse }}", {}),
    ("filters lists", "{{ [3, 1, 2] | sort }}{{ [3, 1, 2] | sort(reverse=true) }}{{ ['b', 'A', 'c'] | sort }}{{ [1, 2, 1] | unique | list }}"
                      "{{ [1, 2] | first }}{{ [1, 2] | last }}{{ [1, 2, 3] | sum }}{{ [1, 2] | reverse | list }}{{ ['a', 'b'] | join(', ') }}"
                      "{{ [1, 2] | join }}{{ 'ab' | list }}{{ [1, 2] | length }}{{ 'añ' | length }}{{ {'a': 1} | count }}", {}),
    ("filters numbers", "{{ -3 | abs }} {{ 2.567 | round(2) }} {{ 2.5 | round }} {{ 2.1 | round(0, 'ceil') }} {{ '42' | int }} {{ 'x' | int }} {{ '1.5' | float }} {{ 3 | float }} {{ 3.9 | int }} {{ 5 | string }}", {}),
    ("default", "{{ x | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ y | d('e') }}", {"y": "set"}),
    ("select reject", "{{ msgs | selectattr('role', 'equalto', 'user') | list | length }} {{ msgs | rejectattr('role', 'eq', 'user') | map(attribute='role') | list }}"
                      " {{ [0, 1, 2, 3] | select('odd') | list }} {{ [0, 1, '', 'a'] | select | list }} {{ [1, 2, 3] | reject('gt', 1) | list }}"
                      " {{ msgs | selectattr('tool_calls') | list }} {{ msgs | selectattr('tool_calls', 'defined') | list | length }}",
     {"msgs": [{"role": "user"}, {"role": "assistant", "tool_calls": [1]}, {"role": "user"}]}),
    ("map", "{{ [1, 2] | map('string') | join('-') }} {{ people | map(attribute='name') | join(',') }} {{ ['a', 'b'] | map('upper') | list }}",
     {"people": [{"name": "A"}, {"name": "B"}]}),
    ("dictsort items", "{{ d | dictsort }} {{ d | items | list }}", {"d": {"b": 1, "a": 2}}),
    ("tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ 'é\"\n' | tojson }}|{{ [1, 2.5, none, true] | tojson }}|{{ {} | tojson }}|"
               "{{ d | tojson(sort_keys=true) }}|{{ 'é' | tojson(ensure_ascii=true) }}|{{ d | tojson(separators=(',', ':')) }}",
     {"d": {"name": "f", "args": {"x": [1, {}], "y": "z"}, "a": []}}),
    ("tests", "{{ 1 is number }}{{ 'a' is string }}{{ none is none }}{{ x is not none }}{{ {} is mapping }}{{ [] is iterable }}"
              "{{ 'a' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}"
              "{{ 1 is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ true is true }}{{ false is false }}{{ 'a' is lower }}"
              "{{ 'A' is upper }}{{ 2 is in [1, 2] }}{{ 2 is eq 2 }}{{ 2 is ne 3 }}{{ 1 is lt 2 }}{{ 2 is ge 2 }}{{ x is sameas none }}"
              "{{ range is callable }}{{ u is undefined }}{{ 1 is equalto(1) }}", {"x": None}),
    ("str methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xax'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|"
                    "{{ 'a b c'.split(' ', 1) }}|{{ 'abc'.startswith('ab') }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}|"
                    "{{ 'a-b'.replace('-', '+') }}|{{ 'hello'.find('l') }}{{ 'hello'.count('l') }}|{{ ', '.join(['a', 'b']) }}|{{ 'l1\nl2'.splitlines() }}|"
                    "{{ 'ab cd'.title() }}{{ 'aB'.capitalize() }}", {"s": "  pad \n"}),
    ("dict methods", "{{ d.get('a') }} {{ d.get('z', 'dflt') }} {{ d.get('z') }} {{ d.keys() | list }} {{ d.values() | list }}",
     {"d": {"a": 1, "b": 2}}),
    ("range", "{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ range(5, 0, -2) | list }}", {}),
    ("dict global", "{{ dict(a=1, b='x') }}", {}),
    ("loop over range with loop.last", "{% for i in range(3) %}{{ i }}{% if not loop.last %}, {% endif %}{% endfor %}", {}),
    ("nested loops", "{% for a in [1, 2] %}{% for b in ['x', 'y'] %}{{ a }}{{ b }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("generation block text", "{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}{% generation %}{{ m.content }}<end>{% endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}",
     {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}),
    ("error: raise_exception", "{{ raise_exception('bad conversation') }}", {}),
    ("error: undefined arithmetic", "{{ nope + 1 }}", {}),
    ("error: undefined attribute", "{{ nope.attr }}", {}),
    ("error: type", "{{ 'a' + 1 }}", {}),
    ("error: unknown filter", "{{ 'a' | no_such_filter }}", {}),
    ("error: unclosed block", "{% if true %}x", {}),
    ("error: unclosed tag", "{{ 'a' ", {}),
    ("error: unknown statement", "{% frobnicate %}", {}),
]

GENERATION_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def byte_spans(text, spans):
    return [[len(text[:b].encode("utf-8")), len(text[:e].encode("utf-8"))] for b, e in spans]


def main():
    out = {"transformers": transformers.__version__, "engine": [], "chats": [],
           "conversations": CONVERSATIONS, "generation": {}}
    for name, src, ctx in ENGINE:
        case = {"name": name, "template": src, "context": ctx}
        try:
            case["output"] = ctu._compile_jinja_template(src).render(**ctx)
            case["error"] = False
        except Exception as e:  # noqa: BLE001 - the oracle records any failure
            case["error"] = True
            case["message"] = f"{type(e).__name__}: {e}"
        out["engine"].append(case)

    for tmpl_name, tok_name in CHAT_TEMPLATES.items():
        with open(f"{TEMPLATES}/{tmpl_name}.jinja", encoding="utf-8") as f:
            src = f.read()
        tok = AutoTokenizer.from_pretrained(f"{TOKENIZERS}/{tok_name}")
        for ci, conv in enumerate(CONVERSATIONS):
            for gen in (False, True):
                case = {"template": tmpl_name, "tokenizer": tok_name, "conversation": ci,
                        "add_generation_prompt": gen}
                try:
                    text = tok.apply_chat_template(conv, chat_template=src, tokenize=False,
                                                   add_generation_prompt=gen,
                                                   date_string="26 Jul 2024")
                    ids = tok.apply_chat_template(conv, chat_template=src, tokenize=True,
                                                  add_generation_prompt=gen,
                                                  date_string="26 Jul 2024")
                    if hasattr(ids, "keys"):
                        ids = ids["input_ids"]
                    assert ids == tok(text, add_special_tokens=False)["input_ids"]
                    # The ids of `tokenizers` on the same text (what tokenizer.json defines).
                    # transformers 5 rebuilds the normalizer / pre-tokenizer of
                    # tokenizer_class LlamaTokenizer folders (Metaspace, prepend_scheme
                    # always, split false) instead of reading tokenizer.json's, so for
                    # spm_legacy its ids differ after a special token followed by a space.
                    lib_ids = tokenizers.Tokenizer.from_file(
                        f"{TOKENIZERS}/{tok_name}/tokenizer.json").encode(
                            text, add_special_tokens=False).ids
                    case.update(error=False, text=text, ids=lib_ids, apply_ids=ids)
                except Exception as e:  # noqa: BLE001
                    case.update(error=True, message=f"{type(e).__name__}: {e}")
                out["chats"].append(case)

    conv = CONVERSATIONS[3]
    text, spans = ctu._render_with_assistant_indices(
        compiled_template=ctu._compile_jinja_template(GENERATION_TEMPLATE), messages=conv,
        tools=None, documents=None, add_generation_prompt=False, bos_token="<s>")
    out["generation"] = {"template": GENERATION_TEMPLATE, "conversation": 3, "text": text,
                         "spans": byte_spans(text, spans)}

    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(c["error"] for c in out["chats"])
    print(f"wrote {OUT}: {len(out['engine'])} engine cases, {len(out['chats'])} chat cases "
          f"({n_err} raise), generation spans {out['generation']['spans']}")


if __name__ == "__main__":
    main()
