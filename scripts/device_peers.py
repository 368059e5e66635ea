#!/usr/bin/env python3
"""The peers of scripts/device-check (issue 41): what a user gets without LSP-Offload.

On the same card, shape, tokens and precision as device-check's timed runs, one training step
(forward, backward, optimizer step, zero_grad) of:
  torch    a plain PyTorch Llama (this file's PlainLlama: the HF Llama's modules and math, tied
           embeddings, random init), fp32 parameters under torch.autocast(bfloat16) (PyTorch's
           and HF Trainer's bf16 mixed precision), SDPA attention, torch.optim.AdamW(fused=True):
           the speed a user gets with nothing but PyTorch. Needs only torch, so it runs on any
           device machine; --self-check proves it computes what transformers' model does;
  hf       transformers' LlamaForCausalLM of the same config and precision (attn "sdpa"), when
           transformers is importable;
  torchao  the torch peer with torchao's CPUOffloadOptimizer wrapping that AdamW (optimizer
           state and step on the CPU; the fastest published optimizer offload), when torchao is
           importable (device-check carries its wheel: pure Python for this use) and on CUDA.
Step time: the mean over steps 2.. (step 1 is warm-up), with the device synchronised around
each step; peak device memory from torch.cuda.max_memory_allocated. Tokens are random ids
(the step's cost does not depend on them).

Usage: device_peers.py --out FILE --device cuda|cpu --hidden H --intermediate I --layers L
           --heads A --kv-heads KV [--vocab 49152] [--micro-batch 4] [--seq-len 512]
           [--steps 6] [--peers torch,hf,torchao]
       device_peers.py --self-check      PlainLlama vs transformers' LlamaForCausalLM (CPU,
                                         fp32, a small config, the same weights): logits and
                                         loss; exit 0 when they agree to 1e-4, 1 when not, 0
                                         with a note when transformers is missing
Writes FILE (JSON): {"peers": {name: {...}}, "versions": {...}}; a peer that cannot run (no
transformers, no torchao, torchao without CUDA) gets {"status": "skipped", "why": ...}.
Exit code 0 unless the arguments are wrong (2).
"""
import argparse
import json
import math
import sys
import time


def _versions():
    out = {}
    for name in ("torch", "transformers", "torchao"):
        try:
            mod = __import__(name)
            out[name] = getattr(mod, "__version__", "?")
        except Exception as e:  # noqa: BLE001 - reported, not fatal
            out[name] = f"not importable ({type(e).__name__})"
    return out


def _offload_optimizer_class():
    """torchao's CPUOffloadOptimizer (torchao.optim since 0.11, prototype before)."""
    try:
        from torchao.optim import CPUOffloadOptimizer
        return CPUOffloadOptimizer
    except ImportError:
        from torchao.prototype.low_bit_optim import CPUOffloadOptimizer
        return CPUOffloadOptimizer


def plain_llama(torch, vocab, hidden, intermediate, layers, heads, kv_heads, eps=1e-5,
                theta=10000.0):
    """A Llama causal LM in plain PyTorch with the module names of transformers' Llama (so a
    state dict loads into LlamaForCausalLM): RMSNorm in fp32 (weight * x.rsqrt-normed, cast
    back), RoPE with rotate-half, grouped-query SDPA attention (causal), SwiGLU MLP, tied
    embeddings. Forward(input_ids (B, T) int64) -> logits (B, T, vocab) in the compute dtype;
    loss(input_ids) -> mean next-token cross entropy in fp32 (labels = input_ids shifted)."""
    nn = torch.nn
    F = torch.nn.functional
    head_dim = hidden // heads

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(hidden))

        def forward(self, x):
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            return self.weight * xf.to(x.dtype)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
            self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
            self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
            self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, heads, head_dim).transpose(1, 2)
            k = self.k_proj(x).view(b, t, kv_heads, head_dim).transpose(1, 2)
            v = self.v_proj(x).view(b, t, kv_heads, head_dim).transpose(1, 2)

            def rope(u):
                half = u.shape[-1] // 2
                rotated = torch.cat((-u[..., half:], u[..., :half]), dim=-1)
                return u * cos + rotated * sin

            q, k = rope(q), rope(k)
            if kv_heads != heads:
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.o_proj(o.transpose(1, 2).reshape(b, t, heads * head_dim))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
            self.up_proj = nn.Linear(hidden, intermediate, bias=False)
            self.down_proj = nn.Linear(intermediate, hidden, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm()
            self.self_attn = Attention()
            self.post_attention_layernorm = RMSNorm()
            self.mlp = Mlp()

        def forward(self, x, cos, sin):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(vocab, hidden)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.norm = RMSNorm()

    class PlainLlama(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Body()
            for module in self.modules():  # transformers' init: N(0, 0.02), norms at 1
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)

        def forward(self, input_ids):
            t = input_ids.shape[1]
            inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=input_ids.device,
                                                dtype=torch.float32) / head_dim))
            ang = torch.outer(torch.arange(t, device=input_ids.device, dtype=torch.float32), inv)
            emb = torch.cat((ang, ang), dim=-1)
            x = self.model.embed_tokens(input_ids)
            cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
            for layer in self.model.layers:
                x = layer(x, cos, sin)
            x = self.model.norm(x)
            return F.linear(x, self.model.embed_tokens.weight)  # tied lm_head

        def loss(self, input_ids):
            logits = self.forward(input_ids)
            return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                   input_ids[:, 1:].reshape(-1))

    return PlainLlama()


def self_check():
    """PlainLlama against transformers' LlamaForCausalLM on the same weights (CPU, fp32)."""
    import torch
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print(f"device_peers --self-check: transformers not importable ({e}); nothing compared")
        return 0
    torch.manual_seed(0)
    shape = dict(vocab=320, hidden=64, intermediate=160, layers=2, heads=8, kv_heads=2)
    mine = plain_llama(torch, **shape).eval()
    for p in mine.parameters():  # norm weights away from 1 too
        if p.dim() == 1:
            torch.nn.init.normal_(p, mean=1.0, std=0.2)
    config = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                         intermediate_size=shape["intermediate"],
                         num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                         num_key_value_heads=shape["kv_heads"], max_position_embeddings=64,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
                         attn_implementation="sdpa")
    ref = LlamaForCausalLM(config).eval()
    missing, unexpected = ref.load_state_dict(mine.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        print(f"device_peers --self-check: state dict mismatch: missing {missing}, "
              f"unexpected {unexpected}")
        return 1
    ids = torch.randint(0, shape["vocab"], (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = mine(ids)
        out = ref(input_ids=ids, labels=ids)
        loss = mine.loss(ids)
    diff = (got - out.logits).abs().max().item()
    ldiff = abs(loss.item() - out.loss.item())
    ok = diff < 1e-4 and ldiff < 1e-5 and math.isfinite(diff)
    print(f"device_peers --self-check: max |logits - transformers| = {diff:.3g}, "
          f"|loss - transformers| = {ldiff:.3g}: {'ok' if ok else 'MISMATCH'}")
    return 0 if ok else 1


def time_peer(name, args):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if name == "torchao" and not cuda:
        return {"status": "skipped", "why": "CPUOffloadOptimizer offloads from a CUDA device"}
    torch.manual_seed(1234)
    if name == "hf":
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(
            vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
            num_hidden_layers=args.layers, num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads, max_position_embeddings=max(args.seq_len, 256),
            rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=True,
            attn_implementation="sdpa")
        with device:
            model = LlamaForCausalLM(config)
        step_loss = lambda batch: model(input_ids=batch, labels=batch).loss  # noqa: E731
    else:
        with device:
            model = plain_llama(torch, args.vocab, args.hidden, args.intermediate, args.layers,
                                args.heads, args.kv_heads)
        step_loss = model.loss
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    fused = dict(fused=True) if cuda else {}  # fused CPU AdamW needs torch >= 2.4
    if name == "torchao":
        optim = _offload_optimizer_class()(params, torch.optim.AdamW, lr=1e-4, fused=True)
    else:
        optim = torch.optim.AdamW(params, lr=1e-4, **fused)
    gen = torch.Generator(device="cpu").manual_seed(7)
    ids = torch.randint(0, args.vocab, (args.steps, args.micro_batch, args.seq_len),
                        generator=gen)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    loss_value = None
    for step in range(args.steps):
        batch = ids[step].to(device)
        t0 = time.perf_counter()
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = step_loss(batch)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        loss_value = float(loss.detach().float().cpu())
    timed = times[1:] if len(times) > 1 else times
    result = {
        "status": "ok",
        "step_s": sum(timed) / len(timed),
        "step_s_all": times,
        "tokens_per_step": args.micro_batch * args.seq_len,
        "last_loss": loss_value,
        "parameters": sum(p.numel() for p in params),
        "model": "transformers LlamaForCausalLM" if name == "hf" else "PlainLlama (PyTorch)",
        "precision": "fp32 parameters, bf16 autocast, SDPA attention, AdamW"
                     + (" fused" if cuda or name == "torchao" else "")
                     + (" in torchao's CPUOffloadOptimizer" if name == "torchao" else ""),
    }
    if cuda:
        result["peak_device_gib"] = torch.cuda.max_memory_allocated() / 2**30
    del optim, model
    if cuda:
        torch.cuda.empty_cache()
    return result


def main(argv):
    if argv == ["--self-check"]:
        return self_check()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=["cuda", "cpu"], required=True)
    for flag in ("hidden", "intermediate", "layers", "heads", "kv-heads"):
        ap.add_argument("--" + flag, type=int, required=True)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--peers", default="torch,hf,torchao")
    args = ap.parse_args(argv)
    peers = [p for p in args.peers.split(",") if p]
    unknown = [p for p in peers if p not in ("torch", "hf", "torchao")]
    if unknown or args.steps < 1:
        print(f"device_peers: unknown peers {unknown} or steps < 1", file=sys.stderr)
        return 2
    report = {"versions": _versions(), "shape": {
        "hidden_size": args.hidden, "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers, "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads, "vocab_size": args.vocab,
        "micro_batch_size": args.micro_batch, "seq_len": args.seq_len, "steps": args.steps},
        "device": args.device, "peers": {}}
    for name in peers:
        try:
            report["peers"][name] = time_peer(name, args)
        except ImportError as e:
            report["peers"][name] = {"status": "skipped", "why": f"not importable: {e}"}
        except Exception as e:  # noqa: BLE001 - a failed peer is a row, not a crash
            report["peers"][name] = {"status": "failed", "why": f"{type(e).__name__}: {e}"}
        print(f"device_peers: {name}: {json.dumps(report['peers'][name])[:300]}", flush=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
