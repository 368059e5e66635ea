#!/usr/bin/env python3
"""Oracle values for tests/model/gguf_test.cc (GGUF dequantisation + HF Q/K un-permutation).

Reads the real SmolLM2-135M-Instruct Q4_1 GGUF with the reference `gguf` Python package
(llama.cpp gguf-py: GGUFReader + gguf.quants.dequantize) and transformers'
LlamaTensorProcessor._reverse_permute_weights, and stores selected values of a few tensors in
tests/oracle/data/gguf_oracle.json:
  first16         the first 16 values of the (row range of the) tensor, row-major torch order
  sample_index    64 strided flat indices (step = numel // 64, offset step // 3) + the last one
  sample_value    the values at those indices
  sum_abs         float64 sum of |x| over the range
Entries with "hf_name" are in the Hugging Face layout (q/k rows un-permuted by transformers).
Also stored: metadata keys in file order, the tensor count and names in file order, the count
of each tensor type, and a few tokenizer entries (tokens / token types at fixed ids).

Run from the repository root:  /opt/oracle/bin/python tests/oracle/make_gguf_oracle.py
"""
import importlib.metadata
import json
import os
import sys

import numpy as np
import gguf
from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

MODEL = "models/SmolLM2-135M-Instruct.Q4_1.gguf"
OUT = "tests/oracle/data/gguf_oracle.json"
N_HEAD, N_HEAD_KV = 9, 3

# (gguf name, row_begin, row_count or None for all rows)
PLAIN = [
    ("blk.0.attn_norm.weight", 0, None),   # F32
    ("output_norm.weight", 0, None),       # F32
    ("blk.0.attn_q.weight", 0, None),      # Q4_1, GGUF (permuted) row order
    ("blk.0.ffn_down.weight", 0, None),    # Q4_1, ne0 = 1536
    ("blk.29.ffn_up.weight", 0, None),     # Q4_1, last block
    ("token_embd.weight", 0, 4),           # Q8_0, rows 0..3
    ("token_embd.weight", 49148, 4),       # Q8_0, last 4 rows
]
# (gguf name, hf name) dequantised then un-permuted by transformers.
HF = [
    ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
    ("blk.0.attn_k.weight", "model.layers.0.self_attn.k_proj.weight"),
    ("blk.7.attn_k.weight", "model.layers.7.self_attn.k_proj.weight"),
]


def summarize(x):
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    n = flat.size
    step = max(n // 64, 1)
    idx = list(range(step // 3, n, step))[:64] + [n - 1]
    return {
        "numel": int(n),
        "first16": [float(v) for v in flat[:16]],
        "sample_index": [int(i) for i in idx],
        "sample_value": [float(flat[i]) for i in idx],
        "sum_abs": float(np.abs(flat.astype(np.float64)).sum()),
    }


def dequant(reader, name):
    t = next(t for t in reader.tensors if t.name == name)
    w = gguf.quants.dequantize(t.data, t.tensor_type)  # torch order: (ne1, ne0) row-major
    torch_shape = [int(d) for d in reversed(t.shape)]
    return np.asarray(w, dtype=np.float32).reshape(torch_shape), t


def main():
    if not os.path.exists(MODEL):
        sys.exit(f"{MODEL} not found; run from the repository root")
    reader = gguf.GGUFReader(MODEL)
    out = {"model": MODEL, "gguf_package_version": importlib.metadata.version("gguf"),
           "plain": [], "hf": []}
    out["keys"] = [k for k in reader.fields.keys() if not k.startswith("GGUF.")]
    out["tensor_names"] = [t.name for t in reader.tensors]
    counts = {}
    for t in reader.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    out["type_counts"] = counts
    tokens = reader.fields["tokenizer.ggml.tokens"]
    types = reader.fields["tokenizer.ggml.token_type"]
    ids = [0, 1, 2, 16, 17, 198, 49151]
    out["tokens_sample"] = [
        {"id": i, "token": bytes(tokens.parts[tokens.data[i]]).decode("utf-8"),
         "type": int(types.parts[types.data[i]][0])} for i in ids]
    for name, begin, count in PLAIN:
        w, t = dequant(reader, name)
        rows = w if w.ndim == 1 else w.reshape(w.shape[0], -1)
        if count is not None:
            rows = rows[begin:begin + count]
        else:
            count = rows.shape[0] if w.ndim > 1 else 1
        entry = {"name": name, "type": t.tensor_type.name,
                 "torch_shape": [int(d) for d in w.shape],
                 "row_begin": begin, "row_count": int(count)}
        entry.update(summarize(rows))
        out["plain"].append(entry)
    proc = LlamaTensorProcessor(config={"num_attention_heads": N_HEAD,
                                        "num_key_value_heads": N_HEAD_KV})
    for name, hf_name in HF:
        w, t = dequant(reader, name)
        hf = proc.process(w, name).weights
        entry = {"name": name, "hf_name": hf_name, "torch_shape": [int(d) for d in hf.shape]}
        entry.update(summarize(hf))
        out["hf"].append(entry)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {OUT}: {len(out['plain'])} plain + {len(out['hf'])} hf entries")


if __name__ == "__main__":
    main()
