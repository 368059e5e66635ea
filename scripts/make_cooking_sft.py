#!/usr/bin/env python3
"""Writes the cooking.stackexchange tagging task as instruction data (issue 15), from the
fastText-format files datasets/cooking-stackexchange/{train,test}.tsv ("__label__tag ... text"
per line; tags in the order of the file):
  {train,test}.alpaca.jsonl            every question: {"instruction", "input", "output"}
  sample.chat.jsonl                    the first 64 training questions as {"messages": [...]}
                                       (a system turn on every other record)
  sample.prompt_completion.jsonl       the first 64 as {"prompt", "completion"} text
The answer is the tags, comma-separated ("sauce, cheese"). Standard library only; run from the
repository root: python3 scripts/make_cooking_sft.py
"""
import json

DIR = "datasets/cooking-stackexchange"
INSTRUCTION = "Which tags fit this cooking question? Answer with the tags, comma-separated."
SYSTEM = "You tag cooking.stackexchange questions."


def read(path):
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            words = line.rstrip("\n").split(" ")
            tags = []
            while words and words[0].startswith("__label__"):
                tags.append(words.pop(0)[len("__label__"):])
            text = " ".join(words).strip()
            if tags and text:
                rows.append((tags, text))
    return rows


def write(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    for split in ("train", "test"):
        rows = read(f"{DIR}/{split}.tsv")
        write(f"{DIR}/{split}.alpaca.jsonl",
              [{"instruction": INSTRUCTION, "input": text, "output": ", ".join(tags)}
               for tags, text in rows])
        print(f"{split}: {len(rows)} questions")
    rows = read(f"{DIR}/train.tsv")[:64]
    chats = []
    for i, (tags, text) in enumerate(rows):
        messages = [{"role": "system", "content": SYSTEM}] if i % 2 else []
        messages += [{"role": "user", "content": f"{INSTRUCTION}\n\n{text}"},
                     {"role": "assistant", "content": ", ".join(tags)}]
        chats.append({"messages": messages})
    write(f"{DIR}/sample.chat.jsonl", chats)
    write(f"{DIR}/sample.prompt_completion.jsonl",
          [{"prompt": f"Question: {text}\nTags:", "completion": " " + ", ".join(tags)}
           for tags, text in rows])


if __name__ == "__main__":
    main()
