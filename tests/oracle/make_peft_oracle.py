#!/usr/bin/env python3
"""PEFT LoRA oracle for tests/baselines/lora_test.cc (baselines/lora.h).

Puts two LoRA adapters made by Hugging Face PEFT on the fp32 Llama oracle model
(tests/oracle/data/hf_models/llama-fp32: attention biases, head_dim 24 != 64 / 4 heads, llama3
rope scaling, untied lm_head) and records what PEFT computes with them:

  lora-r4      r 4, lora_alpha 8, every linear of a decoder layer (q, k, v, o, gate, up,
               down_proj): scaling 2.
  lora-r2-rs   r 2, lora_alpha 3, q_proj and down_proj only, use_rslora: scaling 3 / sqrt(2).

Both use init_lora_weights=False, so B is random (not PEFT's zeros) and the adapters change
the logits. A is then scaled by 4 so that the low-rank term is not small next to the base
weights' (std 0.15) and a wrong scaling or transpose shows clearly.

Writes tests/oracle/data/peft/<name>/ (adapter_config.json + adapter_model.safetensors, as
PEFT's save_pretrained writes them) and tests/oracle/data/peft_oracle.json with, per adapter:
  input_ids   [2][12] random ids (seeded)
  logits      [2][12][V] PeftModel's logits (eval, eager attention), 6 significant digits
  loss        mean next-token loss with labels = input_ids
  merged_max_abs_diff  max |logits of merge_and_unload() - logits of the PeftModel| (PEFT's
              own merge, for the tolerance)

Run from the repository root (torch, transformers 5.x and peft from PyPI, e.g. the venv of
scripts/bench_peers_setup plus `pip install transformers peft`):
  .venv-bench/bin/python tests/oracle/make_peft_oracle.py
"""
import json
import os

import peft
import torch
import transformers
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

BASE = "tests/oracle/data/hf_models/llama-fp32"
OUT_DIR = "tests/oracle/data/peft"
OUT = "tests/oracle/data/peft_oracle.json"
T = 12

ADAPTERS = {
    "lora-r4": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"]),
    "lora-r2-rs": dict(r=2, lora_alpha=3, target_modules=["q_proj", "down_proj"],
                       use_rslora=True),
}


def round6(x):
    return [float(f"{v:.6g}") for v in x]


def base_model():
    m = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32,
                                             attn_implementation="eager")
    m.eval()
    return m


def main():
    torch.manual_seed(7)
    oracle = {"peft_version": peft.__version__, "transformers_version": transformers.__version__,
              "torch_version": torch.__version__, "base": BASE, "adapters": {}}
    for i, (name, kw) in enumerate(ADAPTERS.items()):
        config = LoraConfig(task_type="CAUSAL_LM", lora_dropout=0.0, init_lora_weights=False, **kw)
        model = get_peft_model(base_model(), config)
        with torch.no_grad():
            for pname, p in model.named_parameters():
                if "lora_A" in pname:
                    p.mul_(4.0)
        folder = os.path.join(OUT_DIR, name)
        model.save_pretrained(folder)
        # Load it back as a user would, from the saved folder onto a fresh base.
        loaded = PeftModel.from_pretrained(base_model(), folder)
        loaded.eval()
        gen = torch.Generator().manual_seed(100 + i)
        vocab = loaded.config.vocab_size
        input_ids = torch.randint(3, vocab, (2, T), generator=gen)
        with torch.no_grad():
            out = loaded(input_ids=input_ids, labels=input_ids)
            merged = loaded.merge_and_unload()
            merged_logits = merged(input_ids=input_ids).logits
        oracle["adapters"][name] = {
            "config": kw,
            "input_ids": input_ids.tolist(),
            "logits": [[round6(row.tolist()) for row in seq] for seq in out.logits],
            "loss": float(out.loss),
            "merged_max_abs_diff": float((merged_logits - out.logits).abs().max()),
        }
        print(name, "loss", float(out.loss))
    with open(OUT, "w") as f:
        json.dump(oracle, f)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
