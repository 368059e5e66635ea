#!/usr/bin/env python3
"""How far 16-bit worker weights drift from the optimizer's fp32 master, per rounding (issue 42).

Runs the tiny seeded Llama (the schedule tests' model: SmolLM2's tokenizer, Moby-Dick text) in
lsp mode with bf16 worker weights and no master refresh, for each `lsp.apply_rounding`
(compensated, stochastic, nearest) and each learning rate, for 100, 300 and 1000 steps, and
prints the drift the job reports at its end (`summary.json`):
  final_worker_master_drift_ulps     max over weights of |W_worker - round(W_master)| in ulps of
                                     the rounded master (lsp::MaxDriftUlps: weights smaller than
                                     their matrix's RMS counted at the RMS's ulp)
  final_worker_master_max_abs_diff   max |W_worker - W_master|
Each (rounding, lr, steps) is its own run from step 0 (same seed: the runs of one rounding
share their first steps), so the three lengths show the growth. --refresh-every K adds runs
with lsp.refresh_every K (each layer re-rounded from the master once every K steps, in turn):
their end-of-run drift is that of the steps since each layer's last refresh (< K).

  scripts/drift_study [--lspctl build/client/lspctl] [--out runs/drift-study] [--steps 100,300,1000]
                      [--lrs 1e-5,1e-4] [--roundings compensated,stochastic,nearest]
                      [--refresh-every 0,30,100] [--json FILE]

Prints one table row per run and writes every number to --json (default OUT/drift.json).
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROUNDINGS = ["APPLY_ROUNDING_COMPENSATED", "APPLY_ROUNDING_STOCHASTIC", "APPLY_ROUNDING_NEAREST"]


def tokenizer_path():
    for p in ["models/SmolLM2-135M-Instruct.Q4_1.gguf", ".devdata/smollm2-tokenizer.gguf"]:
        if os.path.exists(p):
            return p
    sys.exit("drift_study: no tokenizer: run scripts/setup (models/SmolLM2-135M-Instruct.Q4_1.gguf)")


def spec(out_dir, rounding, lr, steps, refresh_every=0):
    """The job spec (protobuf JSON mapping of JobSpec) of one run (refresh_every 0: none)."""
    return {
        "name": "drift-study",
        "mode": "MODE_LSP",
        "model": {"format": "MODEL_FORMAT_TINY_RANDOM", "tokenizer_path": tokenizer_path(),
                  "init_seed": 1234},
        "data": {"format": "DATA_FORMAT_TEXT", "train_path": "datasets/moby-dick/moby-dick.txt",
                 "max_blocks": 64, "max_eval_examples": 1},
        "lsp": {"d": 16, "r": 4, "fit_iters": 10, "calibration_examples": 8,
                "apply_rounding": rounding, "check_freq": 0,
                # No refresh at all, or only the rolling one (check_freq 0: no check refreshes).
                **({"refresh_every": refresh_every} if refresh_every > 0
                   else {"master_refresh": "MASTER_REFRESH_NEVER"})},
        "optim": {"lr": lr},
        "weight_dtype": "WEIGHT_DTYPE_BF16",
        "steps": steps,
        "micro_batch_size": 4,
        "seq_len": 32,
        "seed": 7,
        "num_threads": 2,
        "device": "DEVICE_CPU",
        "eval_every": 0,
        "skip_initial_eval": True,
        "skip_checkpoint": True,
        "output_dir": out_dir,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lspctl", default="build/client/lspctl")
    ap.add_argument("--out", default="runs/drift-study")
    ap.add_argument("--steps", default="100,300,1000")
    ap.add_argument("--lrs", default="1e-5,1e-4")
    ap.add_argument("--roundings", default="compensated,stochastic,nearest")
    ap.add_argument("--refresh-every", default="0")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    roundings = ["APPLY_ROUNDING_" + r.strip().upper() for r in a.roundings.split(",")]
    unknown = sorted(set(roundings) - set(ROUNDINGS))
    if unknown:
        sys.exit(f"drift_study: unknown --roundings {unknown}: use compensated, stochastic, nearest")
    refresh = [int(k) for k in a.refresh_every.split(",")]
    if not os.access(a.lspctl, os.X_OK):
        sys.exit(f"drift_study: {a.lspctl} is not built: scripts/build --target lspctl")
    steps = [int(s) for s in a.steps.split(",")]
    lrs = [float(s) for s in a.lrs.split(",")]
    os.makedirs(a.out, exist_ok=True)
    rows = []
    print(f"{'rounding':<12} {'refresh':>7} {'lr':>7} {'steps':>6} {'drift ulps':>10} "
          f"{'max |W-M|':>10} {'s':>6}")
    runs = [(lr, k, r, n) for lr in lrs for k in refresh for r in roundings for n in steps]
    for lr, k, rounding, n in runs:
        name = f"{rounding.split('_')[-1].lower()}-lr{lr:g}-{n}" + (f"-k{k}" if k else "")
        out_dir = os.path.join(a.out, name)
        spec_path = os.path.join(a.out, name + ".json")
        with open(spec_path, "w") as f:
            json.dump(spec(out_dir, rounding, lr, n, k), f, indent=1)
        t0 = time.time()
        r = subprocess.run([a.lspctl, "run", f"--spec={spec_path}"], capture_output=True,
                           text=True)
        secs = time.time() - t0
        if r.returncode != 0:
            sys.exit(f"drift_study: {name} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        with open(os.path.join(out_dir, "summary.json")) as f:
            s = json.load(f)
        row = {"rounding": rounding, "refresh_every": k, "lr": lr, "steps": n,
               "drift_ulps": s["final_worker_master_drift_ulps"],
               "max_abs_diff": s["final_worker_master_max_abs_diff"],
               "final_loss": s.get("final_train_loss"), "seconds": secs}
        rows.append(row)
        print(f"{rounding.split('_')[-1].lower():<12} {k or '-':>7} {lr:>7g} {n:>6} "
              f"{row['drift_ulps']:>10.3g} {row['max_abs_diff']:>10.3g} {secs:>6.1f}",
              flush=True)
    path = a.json or os.path.join(a.out, "drift.json")
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"drift_study: {len(rows)} runs, numbers in {path}")


if __name__ == "__main__":
    main()
