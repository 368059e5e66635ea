#!/usr/bin/env python3
"""Oracle for data/sft.h (tests/data/sft_test.cc): input ids and loss masks of instruction,
chat and prompt-completion records, as transformers and TRL's masking rule give them.

  * Conversations (chat records; alpaca records as [user: instruction + "\\n\\n" + input,
    assistant: output]; conversational prompt-completion as prompt + completion turns) go
    through tokenizer.apply_chat_template(..., return_assistant_tokens_mask=True) with the
    family's real template rewritten to wrap each assistant turn's content and end-of-turn
    token in {% generation %} ... {% endgeneration %}: the assistant mask that TRL's
    assistant_only_loss (and completion_only_loss for conversational prompt-completion) trains
    on. The script checks that the marked template renders the same text as the real one.
  * Standard prompt-completion text follows TRL's rule, restated: prompt_ids =
    tokenizer(prompt); ids = tokenizer(prompt + completion + eos_token); the loss on every id
    after the prompt's.
Records: the first records of datasets/cooking-stackexchange/ files, and multi-turn chats made
from them (two questions per conversation), written to tests/oracle/data/sft/.
Writes tests/oracle/data/sft_oracle.json. Run from the repository root:
  /tmp/o/bin/python tests/oracle/make_sft_oracle.py
"""
import json
import os

import transformers
from transformers import AutoTokenizer

OUT = "tests/oracle/data/sft_oracle.json"
OUT_DIR = "tests/oracle/data/sft"
TOKENIZERS = "tests/oracle/data/hf_tokenizers"
TEMPLATES = "tests/oracle/data/chat_templates"
COOKING = "datasets/cooking-stackexchange"
N = 16

# (real template file, the literal assistant-turn expression in it, its marked replacement)
SMOL_TURN = "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
SMOL_MARKED = ("{{'<|im_start|>' + message['role'] + '\n'}}{% if message['role'] == 'assistant' %}"
               "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
               "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\n' }}")
LLAMA_TURN = ("{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ "
              "message['content'] | trim + '<|eot_id|>' }}")
LLAMA_MARKED = ("{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
                "{%- if message['role'] == 'assistant' %}{%- generation %}"
                "{{- message['content'] | trim + '<|eot_id|>' }}{%- endgeneration %}"
                "{%- else %}{{- message['content'] | trim + '<|eot_id|>' }}{%- endif %}")
QWEN_TURN = "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
QWEN_MARKED = ("{{- '<|im_start|>' + message.role + '\\n' }}{%- if message.role == 'assistant' %}"
               "{%- generation %}{{- message.content + '<|im_end|>' }}{%- endgeneration %}"
               "{%- else %}{{- message.content + '<|im_end|>' }}{%- endif %}{{- '\\n' }}")
FAMILIES = [
    ("smollm2", "smollm2.jinja", SMOL_TURN, SMOL_MARKED),
    ("llama3", "llama3.1.jinja", LLAMA_TURN, LLAMA_MARKED),
    ("qwen2", "qwen2.5.jinja", QWEN_TURN, QWEN_MARKED),
]


def read_jsonl(path, n):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line, _ in zip(f, range(n))]


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def conversation(fmt, rec):
    """The messages and the index of the first turn that carries loss."""
    if fmt == "alpaca":
        user = rec["instruction"] + ("\n\n" + rec["input"] if rec.get("input") else "")
        return [{"role": "user", "content": user}, {"role": "assistant", "content": rec["output"]}], 0
    if fmt == "chat":
        return rec["messages"], 0
    return rec["prompt"] + rec["completion"], len(rec["prompt"])


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    chats = read_jsonl(f"{COOKING}/sample.chat.jsonl", 2 * N)
    multi = []
    for a, b in zip(chats[0::2], chats[1::2]):
        msgs = [m for m in b["messages"] if m["role"] == "system"]
        msgs += [m for m in a["messages"] if m["role"] != "system"]
        msgs += [m for m in b["messages"] if m["role"] != "system"]
        multi.append({"messages": msgs})
    write_jsonl(f"{OUT_DIR}/multi_turn.chat.jsonl", multi)
    conv_pc = [{"prompt": c["messages"][:-1], "completion": c["messages"][-1:]} for c in chats[:N]]
    write_jsonl(f"{OUT_DIR}/conversational.prompt_completion.jsonl", conv_pc)

    files = [
        ("alpaca", f"{COOKING}/train.alpaca.jsonl"),
        ("chat", f"{COOKING}/sample.chat.jsonl"),
        ("chat", f"{OUT_DIR}/multi_turn.chat.jsonl"),
        ("prompt_completion", f"{OUT_DIR}/conversational.prompt_completion.jsonl"),
        ("prompt_completion", f"{COOKING}/sample.prompt_completion.jsonl"),
    ]
    out = {"transformers": transformers.__version__, "cases": []}
    for tok_name, tmpl_file, turn, marked in FAMILIES:
        tok = AutoTokenizer.from_pretrained(f"{TOKENIZERS}/{tok_name}")
        with open(f"{TEMPLATES}/{tmpl_file}", encoding="utf-8") as f:
            real = f.read()
        assert turn in real, (tmpl_file, "assistant-turn expression not found")
        marked_tmpl = real.replace(turn, marked)
        for fmt, path in files:
            case = {"tokenizer": tok_name, "template": tmpl_file, "format": fmt, "file": path,
                    "records": []}
            for rec in read_jsonl(path, N):
                if fmt == "prompt_completion" and isinstance(rec["prompt"], str):
                    # TRL's standard prompt-completion rule.
                    prompt_ids = tok(rec["prompt"])["input_ids"]
                    ids = tok(rec["prompt"] + rec["completion"] + tok.eos_token)["input_ids"]
                    assert ids[:len(prompt_ids)] == prompt_ids
                    mask = [0] * len(prompt_ids) + [1] * (len(ids) - len(prompt_ids))
                else:
                    if fmt == "prompt_completion":
                        msgs = rec["prompt"] + rec["completion"]
                    else:
                        msgs, _ = conversation(fmt, rec)
                    text = tok.apply_chat_template(msgs, chat_template=real, tokenize=False)
                    text_marked = tok.apply_chat_template(msgs, chat_template=marked_tmpl,
                                                          tokenize=False)
                    assert text == text_marked, (tmpl_file, "the marked template renders differently")
                    enc = tok.apply_chat_template(msgs, chat_template=marked_tmpl, tokenize=True,
                                                  return_dict=True,
                                                  return_assistant_tokens_mask=True)
                    ids = list(enc["input_ids"])
                    mask = list(enc["assistant_masks"])
                    assert ids == tok(text, add_special_tokens=False)["input_ids"]
                case["records"].append({"input_ids": ids, "mask": mask})
            out["cases"].append(case)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f)
        f.write("\n")
    n = sum(len(c["records"]) for c in out["cases"])
    print(f"wrote {OUT}: {len(out['cases'])} cases, {n} records")


if __name__ == "__main__":
    main()
