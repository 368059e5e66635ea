#!/usr/bin/env python3
"""Checks a `mode: lora` job's output with Hugging Face PEFT and transformers.

Loads the job's base model (a Hugging Face model folder), puts the job's PEFT adapter
(OUTPUT/adapter) on it with `PeftModel.from_pretrained`, loads the job's merged model (OUTPUT,
`AutoModelForCausalLM.from_pretrained`), and compares their logits on random token ids (fp32,
eager attention). Prints the largest absolute and relative difference; exits 1 when the
relative difference exceeds --tol, or when the adapter changes nothing (a control).

  .venv-bench/bin/python scripts/check_peft_adapter.py --base BASE_FOLDER --output OUTPUT_DIR

Needs torch, transformers and peft (PyPI; e.g. scripts/bench_peers_setup, then
`.venv-bench/bin/pip install transformers peft`).
"""
import argparse
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def load(folder):
    m = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                             attn_implementation="eager")
    m.eval()
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the job's base model folder")
    ap.add_argument("--output", required=True, help="the job's output folder")
    ap.add_argument("--tol", type=float, default=1e-4, help="max relative logit difference")
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    base = load(args.base)
    ids = torch.randint(3, base.config.vocab_size, (2, args.tokens),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = base(input_ids=ids).logits
        peft_model = PeftModel.from_pretrained(base, args.output + "/adapter")
        peft_model.eval()
        with_adapter = peft_model(input_ids=ids).logits
        merged = load(args.output)(input_ids=ids).logits
    scale = float(with_adapter.abs().max())
    diff = float((merged - with_adapter).abs().max())
    change = float((with_adapter - plain).abs().max())
    print(f"PEFT adapter on the base vs the job's merged model: max |diff| {diff:.3e} "
          f"(relative {diff / scale:.3e}); the adapter changes the logits by up to {change:.3e}")
    if diff / scale > args.tol:
        print(f"FAIL: relative difference above {args.tol}")
        return 1
    if change <= 10 * diff:
        print("FAIL: the adapter barely changes the logits; the check would not see an error")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
