#!/usr/bin/env python3
"""CPU Adam throughput of peer implementations (parameters updated per second).

Peers measured, fp32 params/grads/moments, one step = one optimizer.step():
  torch_adamw_foreach   torch.optim.AdamW(lr=1e-3, fused=False, foreach=True)
  torch_adamw_forloop   torch.optim.AdamW(lr=1e-3, fused=False, foreach=False)
  torch_adamw_fused     torch.optim.AdamW(lr=1e-3, fused=True)   (CPU fused kernel, torch >= 2.4)
  deepspeed_cpu_adam    deepspeed.ops.adam.DeepSpeedCPUAdam(lr=1e-3, adamw_mode=True)
All use weight_decay=0.01, betas=(0.9, 0.999), eps=1e-8, so every peer does the same AdamW math.

Each (impl, tensors, n) runs in its own child process (clean memory, a crash or failed
build of one peer cannot take down the others): the N parameters are one tensor, or
split into `tensors` tensors (remainder on the last). 2 warm-up steps, then steps are
timed until they add up to >= --min-time seconds (and >= --min-steps steps);
sec_per_step is the median, params_per_s = n / sec_per_step.

DeepSpeed JIT-builds its cpu_adam op (ninja + g++, -march=native) on first use; that
build runs first, once, in its own child (cached in TORCH_EXTENSIONS_DIR, by default
<venv>/torch_extensions). If it fails, every deepspeed row carries "error" with the
exception and the first relevant lines of the build log instead of numbers.

Usage (after scripts/bench_peers_setup):
  .venv-bench/bin/python scripts/bench_peers.py --out runs/bench_peers.json
  ... --sizes 1000000,16000000 --threads 2 --impls torch_adamw_foreach,deepspeed_cpu_adam
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

ALL_IMPLS = ["torch_adamw_foreach", "torch_adamw_forloop", "torch_adamw_fused", "deepspeed_cpu_adam"]
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01


# ----------------------------------------------------------------------------- child side
def _make_optimizer(impl, params):
    import torch
    if impl == "torch_adamw_foreach":
        return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                 fused=False, foreach=True)
    if impl == "torch_adamw_forloop":
        return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                 fused=False, foreach=False)
    if impl == "torch_adamw_fused":
        return torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, fused=True)
    if impl == "deepspeed_cpu_adam":
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        return DeepSpeedCPUAdam(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                adamw_mode=True)
    raise ValueError("unknown impl " + impl)


def _child_build_deepspeed():
    """Builds (or loads from cache) DeepSpeed's cpu_adam op and runs one tiny step."""
    import torch
    t0 = time.perf_counter()
    p = torch.nn.Parameter(torch.ones(1024))
    p.grad = torch.full_like(p, 0.5)
    opt = _make_optimizer("deepspeed_cpu_adam", [p])
    opt.step()
    # Check against torch's AdamW on the same input, so a broken op does not go unnoticed.
    q = torch.nn.Parameter(torch.ones(1024))
    q.grad = torch.full_like(q, 0.5)
    _make_optimizer("torch_adamw_forloop", [q]).step()
    diff = (p.detach() - q.detach()).abs().max().item()
    if diff > 1e-6:
        raise RuntimeError("DeepSpeedCPUAdam result differs from torch AdamW by %g" % diff)
    return {"build_or_load_s": time.perf_counter() - t0, "max_abs_diff_vs_torch": diff}


def _child_measure(impl, n, tensors, threads, warmup, min_time, min_steps, max_steps):
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    base, rem = divmod(n, tensors)
    sizes = [base] * tensors
    sizes[-1] += rem
    params = []
    for k in sizes:
        p = torch.nn.Parameter(torch.randn(k))
        p.grad = torch.randn(k).mul_(1e-3)
        params.append(p)
    opt = _make_optimizer(impl, params)
    for _ in range(warmup):
        opt.step()
    times = []
    total = 0.0
    cpu0 = time.process_time()
    while (total < min_time or len(times) < min_steps) and len(times) < max_steps:
        t0 = time.perf_counter()
        opt.step()
        dt = time.perf_counter() - t0
        times.append(dt)
        total += dt
    cpu_s = time.process_time() - cpu0
    med = statistics.median(times)
    if not all(torch.isfinite(p).all().item() for p in params):
        raise RuntimeError("non-finite parameters after the timed steps")
    return {"sec_per_step": med, "params_per_s": n / med, "steps": len(times),
            "min_sec_per_step": min(times), "mean_sec_per_step": total / len(times),
            "torch_threads": torch.get_num_threads(),
            # CPU seconds of this process per wall second while timing: ~threads when the
            # cores were ours, much less when another process took them (noisy numbers).
            "cpu_util": cpu_s / total, "loadavg_1m": os.getloadavg()[0]}


def child_main(spec):
    try:
        if spec["kind"] == "build_deepspeed":
            res = _child_build_deepspeed()
        else:
            res = _child_measure(spec["impl"], spec["n"], spec["tensors"], spec["threads"],
                                 spec["warmup"], spec["min_time"], spec["min_steps"],
                                 spec["max_steps"])
    except BaseException as e:  # noqa: BLE001 - report whatever stopped the peer
        # DeepSpeed wraps the build failure ("requires the cpu_adam op, which failed to
        # build/load") around the real cause: report the whole chain, outermost first.
        chain, x = [], e
        while x is not None and len(chain) < 6:
            chain.append(x)
            x = x.__cause__ or (None if x.__suppress_context__ else x.__context__)
        first = lambda c: (str(c).strip() or repr(c)).splitlines()[0][:500]
        res = {"error": " <- caused by ".join("%s: %s" % (type(c).__name__, first(c)) for c in chain),
               "exception_chain": ["%s: %s" % (type(c).__name__, str(c).strip()[:4000])
                                   for c in chain]}
    sys.stdout.flush()
    print("\n@@RESULT@@" + json.dumps(res), flush=True)


# ----------------------------------------------------------------------------- parent side
_RELEVANT = re.compile(r"error|fatal|undefined|not found|no such|cannot|failed|exception|"
                       r"killed|traceback", re.IGNORECASE)


def _relevant_lines(text, limit=15):
    lines = [l.rstrip() for l in text.splitlines() if l.strip()]
    hits = [l for l in lines if _RELEVANT.search(l)]
    return (hits or lines[-limit:])[:limit]


def run_child(spec, timeout, env):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    try:
        cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"")
        out = out.decode(errors="replace") if isinstance(out, bytes) else out
        err = (e.stderr or b"")
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
        return {"error": "timeout after %ds" % timeout, "log_excerpt": _relevant_lines(out + err)}
    res = None
    for line in cp.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            res = json.loads(line[len("@@RESULT@@"):])
    log = "\n".join(l for l in cp.stdout.splitlines() if not l.startswith("@@RESULT@@"))
    log += "\n" + cp.stderr
    if res is None:
        res = {"error": "child exited with status %d without a result" % cp.returncode}
    if "error" in res:
        res["log_excerpt"] = _relevant_lines(log + "\n" + "\n".join(res.get("exception_chain", [])))
    return res


def _version(dist):
    try:
        from importlib.metadata import version
        return version(dist)
    except Exception:  # noqa: BLE001
        return None


def _cmd_out(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except Exception:  # noqa: BLE001
        return None


def collect_env(args):
    cpu_model, flags = None, ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu_model is None:
                    cpu_model = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = line.split(":", 1)[1]
    except OSError:
        pass
    fl = set(flags.split())
    gxx = _cmd_out(["g++", "--version"])
    return {
        "torch_version": _version("torch"),
        "deepspeed_version": _version("deepspeed"),
        "cpu_model": cpu_model,
        "cpu_simd": [f for f in ("avx2", "fma", "avx512f", "avx512bw", "amx_tile") if f in fl],
        "cpu_count": os.cpu_count(),
        "threads": args.threads,
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "gxx": gxx.splitlines()[0] if gxx else None,
        "ds_accelerator": os.environ.get("DS_ACCELERATOR"),
        "torch_extensions_dir": os.environ.get("TORCH_EXTENSIONS_DIR"),
        "cuda_home": os.environ.get("CUDA_HOME"),
        "loadavg_start": os.getloadavg(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "warmup_steps": args.warmup, "min_time_s": args.min_time, "min_steps": args.min_steps,
        "hyperparams": {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WD},
    }


def print_table(rows, header=True):
    if header:
        print("%-22s %7s %12s %14s %12s %8s" % ("impl", "tensors", "n", "ms/step", "Mparams/s",
                                           "cpu_util"))
    for r in rows:
        if "error" in r:
            print("%-22s %7s %12d   error: %s" % (r["impl"], r.get("tensors", "-"), r["n"],
                                                r["error"][:90]))
        else:
            print("%-22s %7d %12d %14.3f %12.1f %8.2f" % (r["impl"], r["tensors"], r["n"],
                                                          r["sec_per_step"] * 1e3,
                                                          r["params_per_s"] / 1e6, r["cpu_util"]))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000000,16000000,128000000",
                    help="comma list of parameter counts N (underscores allowed)")
    ap.add_argument("--tensors", default="1,64", help="comma list: N split into this many tensors")
    ap.add_argument("--impls", default=",".join(ALL_IMPLS), help="comma list of " + ",".join(ALL_IMPLS))
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads / OMP_NUM_THREADS")
    ap.add_argument("--out", help="write JSON here")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds of timed steps, at least")
    ap.add_argument("--min-steps", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=20000)
    ap.add_argument("--timeout", type=int, default=900, help="seconds per measuring child")
    ap.add_argument("--ds-build-timeout", type=int, default=1800,
                    help="seconds for DeepSpeed's JIT build of cpu_adam")
    ap.add_argument("--ds-build-only", action="store_true",
                    help="only build/load DeepSpeed's cpu_adam op, print the outcome, exit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return 0

    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("DS_BUILD_OPS", "0")
    if sys.prefix != sys.base_prefix:  # in a venv: keep the JIT-built op beside it
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
    env = dict(os.environ)

    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    for i in impls:
        if i not in ALL_IMPLS:
            ap.error("unknown impl %r" % i)
    sizes = [int(s.replace("_", "")) for s in args.sizes.split(",") if s.strip()]
    tensor_counts = [int(s) for s in args.tensors.split(",") if s.strip()]

    ds_build = None
    if "deepspeed_cpu_adam" in impls or args.ds_build_only:
        if _version("deepspeed") is None:
            ds_build = {"error": "deepspeed is not installed in %s" % sys.executable}
        else:
            print("bench_peers: building/loading DeepSpeed cpu_adam (first time: minutes)...",
                  flush=True)
            ds_build = run_child({"kind": "build_deepspeed"}, args.ds_build_timeout, env)
        print("bench_peers: deepspeed cpu_adam: %s" % json.dumps(ds_build), flush=True)
        if args.ds_build_only:
            return 0 if "error" not in ds_build else 1

    result = {"env": collect_env(args), "rows": []}
    result["env"]["deepspeed_cpu_adam_build"] = ds_build
    rows = result["rows"]
    for n in sizes:
        for impl in impls:
            for t in tensor_counts:
                row = {"impl": impl, "tensors": t, "n": n}
                if impl == "deepspeed_cpu_adam" and "error" in ds_build:
                    row["error"] = "cpu_adam op did not build/load: " + ds_build["error"]
                    row["log_excerpt"] = ds_build.get("log_excerpt", [])
                    row["exception_chain"] = ds_build.get("exception_chain", [])
                else:
                    spec = {"kind": "measure", "impl": impl, "n": n, "tensors": t,
                            "threads": args.threads, "warmup": args.warmup,
                            "min_time": args.min_time, "min_steps": args.min_steps,
                            "max_steps": args.max_steps}
                    row.update(run_child(spec, args.timeout, env))
                rows.append(row)
                print_table([row], header=len(rows) == 1)
    result["env"]["loadavg_end"] = os.getloadavg()
    print()
    print("threads=%d  torch=%s  deepspeed=%s  cpu=%s" % (
        args.threads, result["env"]["torch_version"], result["env"]["deepspeed_version"],
        result["env"]["cpu_model"]))
    print_table(rows)
    if args.out:
        d = os.path.dirname(os.path.abspath(args.out))
        os.makedirs(d, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print("bench_peers: wrote %s" % args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
