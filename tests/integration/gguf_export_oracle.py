#!/usr/bin/env python3
"""`lspctl export --format=gguf` checked by an independent reader: llama.cpp's own `gguf` Python
package (gguf-py, PyPI `gguf`; its GGUFReader and quants.dequantize), against the Hugging Face
folder's safetensors read here with numpy (CTest gguf_export_oracle_test; docs/models.md).

For each case the folder is exported by the lspctl of BUILD_DIR, and the GGUF is read back by
gguf-py:
  smollm  the main job's model (models/SmolLM2-135M-Instruct.Q4_1.gguf) made an fp32 HF folder
          by `lspctl convert`; exported f32, f16, bf16 and q8_0 (tied, pre "smollm").
  llama   tests/oracle/data/hf_models/llama-job: a bf16 random Llama made by transformers with
          q/k/v/o biases, the Llama 3 tokenizer; exported with --outtype=auto (must pick bf16),
          and q8_0 (its 32-wide rows are whole blocks).
Checked per file: the metadata (architecture, sizes, head counts, rope base, eps, vocab,
file_type, tokenizer model / pre / tokens / merges / special ids / chat template) against
config.json and tokenizer.json; every tensor's name, ggml type and shape; its values equal to
the folder's after the conversion (f32 exact, f16 / bf16 equal to numpy's rounding of the f32
values, q8_0 within half a quantisation step per block: |x - y| <= d/2 (+ the f16 rounding of d));
q and k rows (weights and biases) permuted as llama.cpp's converter permutes them (numpy's
reshape/swapaxes form, written here from the rule in docs/formats.md §3).
Usage: gguf_export_oracle.py BUILD_DIR (exit 0 = all passed).
"""
import importlib.metadata
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
import gguf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def read_safetensors(folder):
    """{name: float32 array} of every *.safetensors in `folder` (F32 / BF16 / F16)."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
            data = fh.read()
        for name, info in header.items():
            if name == "__metadata__":
                continue
            a, b = info["data_offsets"]
            raw = data[a:b]
            if info["dtype"] == "F32":
                arr = np.frombuffer(raw, dtype="<f4")
            elif info["dtype"] == "F16":
                arr = np.frombuffer(raw, dtype="<f2").astype(np.float32)
            elif info["dtype"] == "BF16":
                arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                raise ValueError(f"{f}: {name} has dtype {info['dtype']}")
            out[name] = arr.reshape(info["shape"]).astype(np.float32)
    return out


def permute(w, n_head):
    """llama.cpp's q/k row order: per head, HF rows (i, i + hd/2) become rows (2i, 2i + 1)."""
    shape = w.shape
    return (w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:])
            .swapaxes(1, 2).reshape(shape))


def to_bf16(x):
    """numpy f32 -> bf16-rounded f32 (round to nearest even)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return (u.astype(np.uint32) << 16).view(np.float32)


HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    parts = hf.split(".")  # model.layers.N.<rest>
    layer, rest = parts[2], ".".join(parts[3:])
    for k, v in HF_TO_GGUF.items():
        if rest == k:
            return f"blk.{layer}.{v}"
        if rest.startswith(k + "."):
            return f"blk.{layer}.{v}.{rest[len(k) + 1:]}"
    raise KeyError(hf)


class Checker:
    def __init__(self):
        self.failures = 0
        self.passed = 0

    def check(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failures += 1
            print(f"FAIL {what}")


def export(lspctl, folder, outtype, path):
    r = subprocess.run([lspctl, "export", f"--model={folder}", "--format=gguf",
                        f"--outtype={outtype}", f"--outfile={path}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"lspctl export {folder} {outtype}: {r.stderr}")
    return r.stdout


def check_file(c, case, folder, path, want_type):
    config = json.load(open(os.path.join(folder, "config.json")))
    tok = json.load(open(os.path.join(folder, "tokenizer.json")))
    r = gguf.GGUFReader(path)
    field = lambda k: r.fields[k].contents() if k in r.fields else None
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads",
                                                          config["num_attention_heads"])
    hd = config.get("head_dim") or config["hidden_size"] // heads
    want_meta = {
        "general.architecture": "llama",
        "llama.embedding_length": config["hidden_size"],
        "llama.block_count": config["num_hidden_layers"],
        "llama.feed_forward_length": config["intermediate_size"],
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv,
        "llama.rope.dimension_count": hd,
        "llama.context_length": config["max_position_embeddings"],
        "llama.vocab_size": config["vocab_size"],
        "general.file_type": {"F32": 0, "F16": 1, "Q8_0": 7, "BF16": 32}[want_type],
        "tokenizer.ggml.model": "gpt2",
    }
    for k, v in want_meta.items():
        c.check(field(k) == v, f"{case}: {k} = {field(k)!r}, want {v!r}")
    c.check(abs(field("llama.rope.freq_base") - config.get("rope_theta", 10000.0)) <=
            1e-6 * config.get("rope_theta", 10000.0), f"{case}: rope.freq_base")
    c.check(np.float32(field("llama.attention.layer_norm_rms_epsilon")) ==
            np.float32(config["rms_norm_eps"]), f"{case}: rms eps")
    # Tokenizer: the vocabulary by id, added tokens' contents at their ids, merges in order.
    tokens = field("tokenizer.ggml.tokens")
    by_id = {i: t for t, i in tok["model"]["vocab"].items()}
    for a in tok.get("added_tokens", []):
        by_id[a["id"]] = a["content"]
    c.check(len(tokens) == config["vocab_size"], f"{case}: {len(tokens)} tokens")
    c.check(all(tokens[i] == by_id[i] for i in by_id), f"{case}: tokens differ from tokenizer.json")
    types = field("tokenizer.ggml.token_type")
    special = {a["id"] for a in tok.get("added_tokens", []) if a.get("special")}
    c.check(all(types[i] == (3 if i in special else 1) for i in by_id
                if i not in {a["id"] for a in tok.get("added_tokens", []) if not a.get("special")}),
            f"{case}: token types (3 for special added tokens, 1 otherwise)")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    c.check(field("tokenizer.ggml.merges") == merges, f"{case}: merges differ")
    c.check(field("tokenizer.ggml.eos_token_id") is not None, f"{case}: no eos id")
    # Tensors.
    weights = read_safetensors(folder)
    if config.get("tie_word_embeddings"):
        weights.pop("lm_head.weight", None)
    names = {t.name: t for t in r.tensors}
    c.check(len(names) == len(weights), f"{case}: {len(names)} tensors, folder has {len(weights)}")
    for hf, x in weights.items():
        name = gguf_name(hf)
        t = names.get(name)
        if t is None:
            c.check(False, f"{case}: {name} missing")
            continue
        want = want_type if x.ndim == 2 else "F32"
        c.check(t.tensor_type.name == want, f"{case}: {name} is {t.tensor_type.name}, want {want}")
        c.check([int(d) for d in t.shape] == list(reversed(x.shape)), f"{case}: {name} shape")
        y = gguf.quants.dequantize(t.data, t.tensor_type).reshape(x.shape).astype(np.float32)
        if ".q_proj." in hf:
            x = permute(x, heads)
        elif ".k_proj." in hf:
            x = permute(x, kv)
        if want == "F32":
            ok = np.array_equal(x, y)
        elif want == "F16":
            ok = np.array_equal(x.astype(np.float16).astype(np.float32), y)
        elif want == "BF16":
            ok = np.array_equal(to_bf16(x), y)
        else:  # Q8_0: within half a step of each block's scale (+ the scale's f16 rounding)
            xb = x.reshape(-1, 32)
            d = np.abs(xb).max(axis=1, keepdims=True) / 127.0
            ok = bool(np.all(np.abs(xb - y.reshape(-1, 32)) <= d * 0.5 + d * 127 * 2**-11 + 1e-12))
        c.check(ok, f"{case}: {name} values ({want}) differ beyond the format's rounding")


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(REPO, "build")
    lspctl = os.path.join(build, "client", "lspctl")
    c = Checker()
    with tempfile.TemporaryDirectory(prefix="lspo-gguf-") as tmp:
        smol = os.path.join(tmp, "smol")
        r = subprocess.run([lspctl, "convert",
                            f"--model={REPO}/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                            f"--output_dir={smol}"], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL lspctl convert: {r.stderr}")
            return 1
        for outtype, want in (("f32", "F32"), ("f16", "F16"), ("bf16", "BF16"), ("q8_0", "Q8_0")):
            path = os.path.join(tmp, f"smol-{outtype}.gguf")
            out = export(lspctl, smol, outtype, path)
            c.check("tokenizer pre smollm" in out, f"smollm {outtype}: output {out!r}")
            check_file(c, f"smollm {outtype}", smol, path, want)
            os.remove(path)
        llama = os.path.join(REPO, "tests/oracle/data/hf_models/llama-job")
        for outtype, want in (("auto", "BF16"), ("q8_0", "Q8_0")):
            path = os.path.join(tmp, f"llama-{outtype}.gguf")
            out = export(lspctl, llama, outtype, path)
            c.check("tokenizer pre llama-bpe" in out, f"llama {outtype}: output {out!r}")
            check_file(c, f"llama {outtype}", llama, path, want)
    print(f"gguf_export_oracle: {c.passed} checks passed, {c.failures} failed "
          f"(gguf-py {importlib.metadata.version('gguf')})")
    return 1 if c.failures else 0


if __name__ == "__main__":
    sys.exit(main())
