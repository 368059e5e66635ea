#!/usr/bin/env python3
"""Greedy-generation oracle for the real SmolLM2 (tests/model/hf_checkpoint_test.cc,
GenerateTest.SmolLm2GreedyMatchesTransformers).

Loads models/SmolLM2-135M-Instruct.Q4_1.gguf with transformers' GGUF loader (dequantised to
fp32), and greedily generates 48 tokens after two chat prompts (apply_chat_template with
add_generation_prompt, the GGUF's tokenizer), eos disabled so that all 48 are compared, and
records where the model's eos (<|im_end|>, id 2) first appears.
Writes tests/oracle/data/generate_oracle.json. Run from the repository root:
  /tmp/o/bin/python tests/oracle/make_generate_oracle.py
"""
import json

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

MODEL_DIR = "models"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = "tests/oracle/data/generate_oracle.json"
NEW = 48
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "List three primary colours."}],
]


def main():
    tok = AutoTokenizer.from_pretrained(MODEL_DIR, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, gguf_file=GGUF, dtype=torch.float32)
    model.eval()
    cases = []
    for chat in CHATS:
        ids = tok.apply_chat_template(chat, add_generation_prompt=True)
        if not isinstance(ids, list):
            ids = ids["input_ids"]
        x = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(x, max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                                 pad_token_id=2)
        new = out[0, len(ids):].tolist()
        cases.append({"messages": chat, "prompt_ids": list(ids), "greedy": new,
                      "text": tok.decode(new)})
        print(repr(tok.decode(new)))
    with open(OUT, "w") as f:
        json.dump({"generator": "tests/oracle/make_generate_oracle.py",
                   "transformers": transformers.__version__, "torch": torch.__version__,
                   "gguf": f"{MODEL_DIR}/{GGUF}", "cases": cases}, f, indent=1)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
