#!/usr/bin/env python3
"""Oracle for tests/model/safetensors_test.cc: a small checkpoint written by the reference
`safetensors` package (safetensors.torch.save_file) plus the values it holds.

Writes tests/oracle/data/tiny.safetensors (F32, BF16, F16 and I32 tensors, metadata) and
tests/oracle/data/tiny_safetensors.json with, per tensor, dtype, shape and the values as
float64 (the exact value of each stored element).

Run from the repository root:  /opt/oracle/bin/python tests/oracle/make_safetensors_oracle.py
"""
import json

import torch
from safetensors.torch import save_file

OUT = "tests/oracle/data/tiny.safetensors"
OUT_JSON = "tests/oracle/data/tiny_safetensors.json"


def main():
    g = torch.Generator().manual_seed(0)
    tensors = {
        "model.embed_tokens.weight": torch.randn(5, 3, generator=g),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(4, 3, generator=g).to(torch.bfloat16),
        "model.norm.weight": torch.randn(7, generator=g).to(torch.float16),
        "step": torch.tensor([3, -1, 70000], dtype=torch.int32),
        "scalar": torch.tensor(2.5),
    }
    save_file(tensors, OUT, metadata={"format": "pt", "note": "oracle"})
    out = {"file": OUT, "metadata": {"format": "pt", "note": "oracle"}, "tensors": {}}
    names = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
             torch.int32: "I32"}
    for k, t in tensors.items():
        out["tensors"][k] = {"dtype": names[t.dtype], "shape": list(t.shape),
                             "values": [float(v) for v in t.double().reshape(-1)]}
    with open(OUT_JSON, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT} and {OUT_JSON}")


if __name__ == "__main__":
    main()
