#!/usr/bin/env python3
"""Logits/loss oracle for tests/model/llama_test.cc (LlamaModel vs Hugging Face transformers).

Loads models/SmolLM2-135M-Instruct.Q4_1.gguf with transformers' own GGUF loader (dequantised
to fp32, q/k un-permuted by transformers), runs a fixed ChatML prompt and writes
tests/oracle/data/logits_oracle.json with:
  input_ids            the prompt's token ids (hard-coded below; checked against the HF
                       tokenizer's apply_chat_template when it can be loaded)
  positions[]          for 3 earlier positions and the last one: {position, first (logits[0:256]),
                       top_ids/top_values (top-20), argmax, stride (97), strided (logits[::97])}
  loss                 HF LlamaForCausalLM loss with labels = input_ids (shift inside, mean)
  hidden_stats         mean and L2 norm of the final-normed hidden state at the last position
Run from the repository root:  /opt/oracle/bin/python tests/oracle/make_logits_oracle.py
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

MODEL_DIR = "models"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = "tests/oracle/data/logits_oracle.json"

# tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
#                         add_generation_prompt=True) with the GGUF's tokenizer:
# "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face
#  <|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
INPUT_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018,
             411, 407, 19712, 8182, 2, 198, 1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47,
             2, 198, 1, 520, 9531, 198]
EARLIER_POSITIONS = [0, 12, 29]
STRIDE = 97
FIRST = 256
TOPK = 20


def main():
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(MODEL_DIR, gguf_file=GGUF)
    ids = tok.apply_chat_template(MESSAGES, add_generation_prompt=True)
    if not isinstance(ids, list):
        ids = ids["input_ids"]
    if list(ids) != INPUT_IDS:
        sys.exit(f"tokenizer gives {ids}, script has {INPUT_IDS}: update INPUT_IDS")

    try:
        model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, gguf_file=GGUF, dtype=torch.float32)
    except TypeError:
        model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, gguf_file=GGUF,
                                                     torch_dtype=torch.float32)
    model.eval()
    emb = model.get_input_embeddings().weight
    lm = model.get_output_embeddings().weight
    tied = bool(torch.equal(emb, lm))

    x = torch.tensor([INPUT_IDS], dtype=torch.int64)
    with torch.no_grad():
        out = model(input_ids=x, labels=x, output_hidden_states=True)
    logits = out.logits[0].double()  # (T, V)
    T = logits.shape[0]
    positions = []
    for p in EARLIER_POSITIONS + [T - 1]:
        row = logits[p]
        top = torch.topk(row, TOPK)
        positions.append({
            "position": p,
            "first": row[:FIRST].tolist(),
            "top_ids": top.indices.tolist(),
            "top_values": top.values.tolist(),
            "argmax": int(torch.argmax(row)),
            "stride": STRIDE,
            "strided": row[::STRIDE].tolist(),
        })
    last_hidden = out.hidden_states[-1][0, -1].double()  # final-normed (HF applies norm last)
    data = {
        "generator": "tests/oracle/make_logits_oracle.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf": os.path.join(MODEL_DIR, GGUF),
        "messages": MESSAGES,
        "input_ids": INPUT_IDS,
        "vocab_size": int(logits.shape[1]),
        "tied_lm_head": tied,
        "num_parameters": int(sum(p.numel() for p in model.parameters())),
        "positions": positions,
        "loss": float(out.loss),
        "hidden_last_mean": float(last_hidden.mean()),
        "hidden_last_norm": float(last_hidden.norm()),
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {OUT}: T={T} loss={data['loss']:.6f} argmax_last={positions[-1]['argmax']} "
          f"tied={tied} params={data['num_parameters']}")


if __name__ == "__main__":
    main()
