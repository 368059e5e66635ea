#!/usr/bin/env python3
"""The CPU against its peer (issue 46): the main job's step and GEMMs vs transformers + torch 2.x.

Measured in one run, on the same cores and thread count (--threads, default all cores):
  ours native / lsp   `lspctl run` of examples/smollm2-sms-spam.yaml (SmolLM2-135M-Instruct,
                      micro-batch 8 x 128 = 1024 input tokens, fp32, embedded mode) for --steps
                      steps, no evaluation and no checkpoint; the step time is the median
                      `step_seconds` of metrics.jsonl over steps 2.. (step 1 warms up and, in
                      lsp, fits the projectors).
  transformers        LlamaForCausalLM of SmolLM2-135M's config (random init: speed does not
                      depend on the values), the same 8 x 128 tokens, full logits, the causal-LM
                      loss, backward and torch.optim.AdamW; median of --hf-steps steps after
                      one warm-up step; attention "sdpa" (transformers' default) and "eager".
  GEMM                C = A B in fp32 for SmolLM2-135M's linears at 1024 tokens (forward and
                      weight-gradient shapes, and the tied LM head): ours = bench/kernels_bench
                      BM_TorchGemm (LibTorch 1.13 + the system BLAS with the kernel set that
                      runtime/cpu_blas.h chose); peer = torch.mm of torch 2.x (MKL / oneDNN).
Limit for the GEMMs: the cores' fp32 FMA peak, measured by kernels_bench BM_FmaPeak.
Ratios: step per token ours / transformers (the faster attention), lower is better (targets: native <= 1.0,
lsp <= 0.7); GEMM GFLOP/s ours / torch 2.x, higher is better (target >= 0.70 each).

Run through scripts/bench_cpu (builds the binaries, makes .venv-bench with torch and
transformers); this file runs under .venv-bench/bin/python. Writes --out (JSON) and prints the
tables. Each peer measurement runs in its own child process.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = os.path.join(ROOT, "examples", "smollm2-sms-spam.yaml")
BATCH, SEQ = 8, 128
TOKENS = BATCH * SEQ
# SmolLM2-135M-Instruct's config.json (HuggingFaceTB/SmolLM2-135M-Instruct on the Hub); the
# GGUF the main job loads carries the same numbers (llama.* keys).
SMOLLM2_135M = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                    max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, hidden_act="silu")
# (M, K, N): the linears of one layer at 1024 tokens, as in bench/kernels_bench.cc BM_TorchGemm.
GEMM_SHAPES = [(1024, 576, 576), (1024, 576, 192), (1024, 576, 1536), (1024, 1536, 576),
               (1536, 1024, 576), (576, 1024, 1536), (1024, 576, 49152)]
GEMM_NAMES = ["q/o_proj fwd", "k/v_proj fwd", "gate/up fwd", "down fwd", "gate/up dW",
              "down dW", "lm_head fwd"]


# ----------------------------------------------------------------------------- child side
def child_hf(threads, steps, attn):
    """Seconds per training step of transformers' LlamaForCausalLM (median after 1 warm-up)."""
    import torch
    import transformers
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(**SMOLLM2_135M)
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=attn,
                                                       torch_dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (BATCH, SEQ))
    times = []
    for i in range(steps + 1):
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dt = time.perf_counter() - t0
        if not torch.isfinite(loss):
            raise RuntimeError("transformers step gave a non-finite loss")
        if i > 0:
            times.append(dt)
    return {"step_seconds": statistics.median(times), "steps": steps,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "attn": attn, "threads": torch.get_num_threads(),
            "blas": _torch_blas(torch)}


def _torch_blas(torch):
    cfg = torch.__config__.show()
    m = re.search(r"BLAS_INFO=(\w+)", cfg)
    isa = re.search(r"CPU capability usage: (\w+)", cfg)
    return {"blas": m.group(1) if m else "?", "cpu_capability": isa.group(1) if isa else "?",
            "mkldnn": torch.backends.mkldnn.is_available()}


def child_gemm(threads, min_time):
    """GFLOP/s of torch.mm for GEMM_SHAPES (best of repeated timings of >= min_time s)."""
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    out = []
    for m, k, n in GEMM_SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        c = torch.mm(a, b)
        for _ in range(3):
            torch.mm(a, b, out=c)
        best = None
        for _ in range(3):
            it, t0 = 0, time.perf_counter()
            while True:
                torch.mm(a, b, out=c)
                it += 1
                dt = time.perf_counter() - t0
                if dt >= min_time / 3:
                    break
            r = 2.0 * m * k * n * it / dt / 1e9
            best = r if best is None else max(best, r)
        out.append(best)
    return {"gflops": out, "blas": _torch_blas(torch), "torch": torch.__version__}


def child_main(spec):
    if spec["what"] == "hf":
        res = child_hf(spec["threads"], spec["steps"], spec["attn"])
    else:
        res = child_gemm(spec["threads"], spec["min_time"])
    print("RESULT " + json.dumps(res))


def run_child(spec, timeout):
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
                       capture_output=True, text=True, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError("child %s failed (exit %d): %s" % (spec, p.returncode,
                                                         (p.stderr or p.stdout)[-2000:]))


# ----------------------------------------------------------------------------- ours
def _env(auto_off):
    env = dict(os.environ)
    if auto_off:
        env["LSPO_CPU_BLAS_AUTO"] = "0"
    return env


def ours_step(lspctl, mode, steps, threads, workdir, auto_off=False):
    """Runs the main job's spec for `steps` steps in `mode`; returns its median step (s).
    auto_off: with LSPO_CPU_BLAS_AUTO=0 (OpenBLAS's own kernel choice)."""
    with open(SPEC) as f:
        lines = [l for l in f.read().splitlines() if not re.match(r"\s+eval_path:", l)]
    lines += ["skip_checkpoint: true", "skip_initial_eval: true", "num_threads: %d" % threads]
    spec = os.path.join(workdir, "spec-%s.yaml" % mode)
    with open(spec, "w") as f:
        f.write("\n".join(lines) + "\n")
    out = os.path.join(workdir, "run-%s%s" % (mode, "-auto-off" if auto_off else ""))
    t0 = time.time()
    p = subprocess.run([lspctl, "run", "--spec=" + spec, "--mode=" + mode, "--steps=%d" % steps,
                        "--output_dir=" + out], cwd=ROOT, capture_output=True, text=True,
                       timeout=1800, env=_env(auto_off))
    wall = time.time() - t0
    text = p.stdout + p.stderr
    if p.returncode != 0:
        raise RuntimeError("lspctl run --mode=%s failed (exit %d):\n%s" %
                           (mode, p.returncode, text[-3000:]))
    step_s = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if "step_seconds" in rec and "step" in rec:
                step_s[int(rec["step"])] = float(rec["step_seconds"])
    later = [s for k, s in sorted(step_s.items()) if k >= 2]
    if not later:
        raise RuntimeError("no step_seconds for steps >= 2 in %s/metrics.jsonl" % out)
    blas = re.search(r"CPU BLAS: (.*)", text)
    return {"step_seconds": statistics.median(later), "steps": steps, "wall_seconds": wall,
            "first_step_seconds": step_s.get(1), "cpu_blas": blas.group(1) if blas else "?"}


def ours_gemm(kernels_bench, threads, min_time, auto_off=False):
    p = subprocess.run([kernels_bench, "--threads=%d" % threads,
                        "--benchmark_filter=BM_TorchGemm|BM_FmaPeak", "--benchmark_format=json",
                        "--benchmark_repetitions=3", "--benchmark_report_aggregates_only=false",
                        "--benchmark_min_time=%g" % (min_time / 3)],
                       capture_output=True, text=True, timeout=900, env=_env(auto_off))
    if p.returncode != 0:
        raise RuntimeError("kernels_bench failed: " + p.stderr[-2000:])
    doc = json.loads(p.stdout)
    best, peak = {}, 0.0
    for b in doc["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        if b["name"].startswith("BM_FmaPeak"):
            peak = max(peak, b.get("flops_per_s", 0.0) / 1e9)
            continue
        m = re.match(r"BM_TorchGemm/(\d+)/(\d+)/(\d+)", b["name"])
        if not m:
            continue
        key = tuple(int(x) for x in m.groups())
        best[key] = max(best.get(key, 0.0), b["flops_per_s"] / 1e9)
    missing = [s for s in GEMM_SHAPES if s not in best]
    if missing:
        raise RuntimeError("kernels_bench has no BM_TorchGemm for %s" % missing)
    return {"gflops": [best[s] for s in GEMM_SHAPES], "fma_peak_gflops": peak or None,
            "cpu_blas": doc.get("context", {}).get("cpu_blas", "?")}


# ----------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=8, help="our steps per mode (median of 2..)")
    ap.add_argument("--hf-steps", type=int, default=7)
    ap.add_argument("--gemm-min-time", type=float, default=1.5, help="seconds per GEMM shape")
    ap.add_argument("--modes", default="native,lsp")
    ap.add_argument("--auto-off", action="store_true",
                    help="also measure ours with LSPO_CPU_BLAS_AUTO=0 (OpenBLAS's own kernel "
                         "choice: the state before runtime/cpu_blas.h)")
    ap.add_argument("--lspctl", default=os.path.join(ROOT, "build", "client", "lspctl"))
    ap.add_argument("--kernels-bench",
                    default=os.path.join(ROOT, "build", "bench", "kernels_bench"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "cpu_results.json"))
    args = ap.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return 0

    t = args.threads
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "threads": t,
           "tokens_per_step": TOKENS, "cpu": _cpu_model()}
    print("bench_cpu: %s, %d threads, %d tokens per step" % (res["cpu"], t, TOKENS), flush=True)

    print("bench_cpu: GEMMs (ours, then torch 2.x)", flush=True)
    res["gemm_ours"] = ours_gemm(args.kernels_bench, t, args.gemm_min_time)
    if args.auto_off:
        res["gemm_ours_auto_off"] = ours_gemm(args.kernels_bench, t, args.gemm_min_time, True)
    res["gemm_peer"] = run_child({"what": "gemm", "threads": t,
                                  "min_time": args.gemm_min_time}, 900)

    res["hf"] = {}
    for attn in ("sdpa", "eager"):
        print("bench_cpu: transformers step (%s)" % attn, flush=True)
        res["hf"][attn] = run_child({"what": "hf", "threads": t, "steps": args.hf_steps,
                                     "attn": attn}, 1800)

    res["ours"] = {}
    work = tempfile.mkdtemp(prefix="bench_cpu.")
    try:
        for mode in args.modes.split(","):
            print("bench_cpu: lspctl run --mode=%s --steps=%d" % (mode, args.steps), flush=True)
            res["ours"][mode] = ours_step(args.lspctl, mode, args.steps, t, work)
            if args.auto_off:
                print("bench_cpu: the same with LSPO_CPU_BLAS_AUTO=0", flush=True)
                res["ours"][mode + "_auto_off"] = ours_step(args.lspctl, mode, args.steps, t,
                                                            work, True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    report(res)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print("bench_cpu: wrote " + args.out)
    return 0


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


def report(res):
    # The peer is the faster of transformers' two attention implementations in this run.
    best = min(("sdpa", "eager"), key=lambda a: res["hf"][a]["step_seconds"])
    res["peer_attn"] = best
    peer = res["hf"][best]
    print()
    print("CPU BLAS (ours): " + res["gemm_ours"]["cpu_blas"])
    if "gemm_ours_auto_off" in res:
        print("CPU BLAS (ours, LSPO_CPU_BLAS_AUTO=0): " + res["gemm_ours_auto_off"]["cpu_blas"])
    b = peer["blas"]
    print("peer: torch %s (BLAS %s, CPU capability %s, oneDNN %s), transformers %s" %
          (peer["torch"], b["blas"], b["cpu_capability"], b["mkldnn"], peer["transformers"]))
    print()
    print("Step, micro-batch %d x %d = %d tokens, %d threads" % (BATCH, SEQ, TOKENS,
                                                                res["threads"]))
    row = "  %-34s %8s %10s %16s %12s"
    print(row % ("", "s/step", "ms/token", "vs transformers", "target"))
    print("  (vs transformers = step / the faster transformers step, %s)" % best)
    for attn in ("sdpa", "eager"):
        h = res["hf"][attn]
        print(row % ("transformers (%s)" % attn, "%.2f" % h["step_seconds"],
                     "%.2f" % (h["step_seconds"] / TOKENS * 1e3),
                     "%.2f" % (h["step_seconds"] / peer["step_seconds"]), ""))
    res["ratios"] = {}
    for mode, target in (("native", 1.0), ("lsp", 0.7)):
        for key, label in ((mode, "ours " + mode),
                           (mode + "_auto_off", "ours %s, LSPO_CPU_BLAS_AUTO=0" % mode)):
            if key not in res["ours"]:
                continue
            o = res["ours"][key]
            r = o["step_seconds"] / peer["step_seconds"]
            res["ratios"][key] = r
            verdict = ""
            if key == mode:
                verdict = "<= %.1f %s" % (target, "met" if r <= target else "MISSED")
            print(row % (label, "%.2f" % o["step_seconds"],
                         "%.2f" % (o["step_seconds"] / TOKENS * 1e3), "%.2f" % r, verdict))
    print()
    off = res.get("gemm_ours_auto_off", {}).get("gflops")
    print("GEMM fp32 GFLOP/s (M x K x N), %d threads%s" %
          (res["threads"], "; auto off = LSPO_CPU_BLAS_AUTO=0" if off else ""))
    peak = res["gemm_ours"].get("fma_peak_gflops")
    if peak:
        print("  limit: %.1f GFLOP/s, the FMA peak of %d threads (kernels_bench BM_FmaPeak: "
              "register-only vector FMAs); %% = fraction of it" % (peak, res["threads"]))
    row = "  %-14s %-16s %8s %10s %10s %7s %12s %6s %6s"
    print(row % ("", "shape", "ours", "auto off", "torch 2.x", "ratio", "target", "ours%",
                 "torch%"))
    res["ratios"]["gemm"] = []
    for i, (name, shp) in enumerate(zip(GEMM_NAMES, GEMM_SHAPES)):
        o, p = res["gemm_ours"]["gflops"][i], res["gemm_peer"]["gflops"][i]
        r = o / p
        res["ratios"]["gemm"].append(r)
        print(row % (name, "%dx%dx%d" % shp, "%.1f" % o, "%.1f" % off[i] if off else "-",
                     "%.1f" % p, "%.2f" % r, ">= 0.70 " + ("met" if r >= 0.7 else "MISSED"),
                     "%.0f" % (100 * o / peak) if peak else "-",
                     "%.0f" % (100 * p / peak) if peak else "-"))


if __name__ == "__main__":
    sys.exit(main())
