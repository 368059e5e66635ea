#!/usr/bin/env python3
"""HF model-folder oracle for tests/model/hf_checkpoint_test.cc (LlamaModel::FromHfCheckpoint).

Makes one small random model per supported family with transformers' own classes
(`from_config`), saves it with `save_pretrained` twice -- fp32 in one model.safetensors, and
bf16 sharded with a small max_shard_size (so model.safetensors.index.json is exercised) --
and records what transformers computes on fixed prompts:

  llama    LlamaForCausalLM: attention_bias (q, k, v, o biases), explicit head_dim (4 heads x 24
           != hidden 64), rope_scaling llama3 (factor 8, low 1, high 4, original 32 positions:
           all three frequency bands occur), untied lm_head.
  qwen2    Qwen2ForCausalLM: q/k/v biases, tied embeddings, rope_theta 1e6.
  mistral  MistralForCausalLM: sliding_window 8 < the 24-token prompt, untied lm_head.
  qwen3    Qwen3ForCausalLM: q_norm / k_norm, explicit head_dim (4 heads x 24 != hidden 64),
           untied lm_head, rope_theta 1e6.
  gemma3   Gemma3ForCausalLM (Gemma3TextConfig): 3 layers (sliding, full, sliding) with a window
           of 8 < the 24-token prompt, local RoPE base 1e4 and global 1e6 with linear scaling 2,
           query_pre_attn_scalar 20 != head_dim 24, tied embeddings (scaled by sqrt(64)).

Weights are drawn wider than HF's N(0, 0.02) init (std 0.15 for matrices, 0.1 for biases, 1 +
N(0, 0.1) for norms) so that logits are far from uniform and a wrong formula shows.
For each folder (fp32 and bf16) the oracle stores, computed by transformers in fp32 with eager
attention (the bf16 folder is loaded upcast to fp32, so both sides compute on the same
bf16-rounded weights):
  input_ids  [2][24] random ids (seeded)
  logits     [2][24][V] all logits, rounded to 6 significant digits
  loss       mean next-token loss with labels = input_ids (HF shifts inside)
  greedy     32 greedily generated ids after the first prompt (eos disabled)
Writes tests/oracle/data/hf_models/<family>-<fp32|bf16>/ and
tests/oracle/data/hf_models_oracle.json.

Also writes tests/oracle/data/hf_models/<family>-job/: complete model folders for end-to-end
jobs (tests/integration/hf_folder_test.cc): a random bf16 model of the family (hidden 32,
2 layers, widened like the oracle models so that a few steps visibly lower the loss) whose vocabulary is that of the family's tokenizer trained by
tests/oracle/make_hf_tokenizer_oracle.py (llama <- hf_tokenizers/llama3, qwen2 <- qwen2,
mistral <- spm_metaspace, qwen3 <- qwen2 and gemma3 <- spm_metaspace (no Gemma tokenizer here),
those two with tests/oracle/data/chat_templates/<family>.jinja as chat_template.jinja), with
those tokenizer files copied in.

Run from the repository root (transformers 5.x, torch 2.x from PyPI; README "Tests"):
  /tmp/o/bin/python tests/oracle/make_hf_models_oracle.py [FAMILY ...]
With family names (e.g. qwen3), only those families' folders and oracle entries are made anew;
the others (folders and entries) are kept as they are.
"""
import sys
import json
import os
import shutil

import torch
import transformers
from transformers import (AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, MistralConfig,
                          Qwen2Config, Qwen3Config)

OUT_DIR = "tests/oracle/data/hf_models"
OUT = "tests/oracle/data/hf_models_oracle.json"
VOCAB = 320
T = 24
NEW_TOKENS = 32


def configs():
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)
    return {
        "llama": LlamaConfig(**common, head_dim=24, attention_bias=True, tie_word_embeddings=False,
                             rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                           "original_max_position_embeddings": 32,
                                           "rope_theta": 10000.0}),
        "qwen2": Qwen2Config(**common, tie_word_embeddings=True, rope_theta=1e6),
        "mistral": MistralConfig(**common, sliding_window=8, tie_word_embeddings=False),
        "qwen3": Qwen3Config(**common, head_dim=24, tie_word_embeddings=False, rope_theta=1e6),
        "gemma3": Gemma3TextConfig(
            **{**common, "num_hidden_layers": 3}, head_dim=24, query_pre_attn_scalar=20,
            sliding_window=8, tie_word_embeddings=True,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
    }


def widen(model, gen):
    # Gemma's RMSNorm multiplies by (1 + w): its weights are drawn around 0 (the same scales).
    offset = 0.0 if model.config.model_type.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(offset + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=gen))


def round6(x):
    return [float(f"{v:.6g}") for v in x]


def record(folder, input_ids):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        out = model(input_ids=input_ids, labels=input_ids)
        greedy = model.generate(input_ids[:1], max_new_tokens=NEW_TOKENS, do_sample=False,
                                eos_token_id=None, pad_token_id=0)
    return {
        "logits": [[round6(row.tolist()) for row in seq] for seq in out.logits],
        "loss": float(out.loss),
        "greedy": greedy[0, T:].tolist(),
    }


JOB_TOKENIZERS = {"llama": "llama3", "qwen2": "qwen2", "mistral": "spm_metaspace",
                  "qwen3": "qwen2", "gemma3": "spm_metaspace"}


def job_folders(families):
    from transformers import AutoTokenizer
    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)
    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig,
               "qwen3": Qwen3Config, "gemma3": Gemma3TextConfig}
    extra = {"llama": dict(attention_bias=True, tie_word_embeddings=True),
             "qwen2": dict(tie_word_embeddings=True, rope_theta=1e6),
             "mistral": dict(sliding_window=16, tie_word_embeddings=False),
             "qwen3": dict(head_dim=8, tie_word_embeddings=True, rope_theta=1e6),
             "gemma3": dict(head_dim=8, tie_word_embeddings=True, sliding_window=16,
                            query_pre_attn_scalar=8,
                            layer_types=["sliding_attention", "full_attention"])}
    for family, tok_dir in JOB_TOKENIZERS.items():
        if family not in families:
            continue
        src = os.path.join("tests/oracle/data/hf_tokenizers", tok_dir)
        tok = AutoTokenizer.from_pretrained(src)
        ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id)
        config = classes[family](vocab_size=len(tok), **small, **extra[family], **ids)
        torch.manual_seed(99)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        widen(model, torch.Generator().manual_seed(99))
        model = model.to(torch.bfloat16)
        folder = os.path.join(OUT_DIR, f"{family}-job")
        if os.path.isdir(folder):
            shutil.rmtree(folder)
        model.save_pretrained(folder)
        for f in os.listdir(src):
            shutil.copy(os.path.join(src, f), folder)
        if family in ("qwen3", "gemma3"):  # the family's own chat template
            shutil.copy(f"tests/oracle/data/chat_templates/{family}.jinja",
                        os.path.join(folder, "chat_template.jinja"))
        print(f"{folder}: vocab {len(tok)}, {sorted(os.listdir(folder))}")


def main():
    families = sys.argv[1:] or list(configs())
    torch.manual_seed(0)
    oracle = {"transformers": transformers.__version__, "torch": torch.__version__, "models": {}}
    if sys.argv[1:] and os.path.exists(OUT):
        with open(OUT) as f:
            oracle = json.load(f)  # keep the other families' entries
    gen = torch.Generator().manual_seed(1234)
    input_ids = torch.randint(3, VOCAB, (2, T), generator=gen)
    for family, config in configs().items():
        # llama, qwen2 and mistral draw their weights from one generator in turn (as when they
        # were first made: make all three together to reproduce them); later families each
        # from their own seed, so that making one alone gives the same weights.
        if family not in ("llama", "qwen2", "mistral"):
            gen = torch.Generator().manual_seed(1234 + sum(map(ord, family)))
        if family not in families:
            continue
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        widen(model, gen)
        for dtype_name, dtype, shard in (("fp32", torch.float32, None), ("bf16", torch.bfloat16, "60KB")):
            folder = os.path.join(OUT_DIR, f"{family}-{dtype_name}")
            if os.path.isdir(folder):
                shutil.rmtree(folder)
            m = model.to(dtype)
            kwargs = {"max_shard_size": shard} if shard else {"max_shard_size": "1GB"}
            m.save_pretrained(folder, **kwargs)
            model = model.to(torch.float32)
            entry = record(folder, input_ids)
            entry["folder"] = folder
            entry["input_ids"] = input_ids.tolist()
            entry["transformers"] = transformers.__version__
            oracle["models"][f"{family}-{dtype_name}"] = entry
            print(f"{family}-{dtype_name}: loss {entry['loss']:.6f}, files {sorted(os.listdir(folder))}")
    with open(OUT, "w") as f:
        json.dump(oracle, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")
    job_folders(families)


if __name__ == "__main__":
    main()
