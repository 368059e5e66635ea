#!/usr/bin/env python3
"""What crosses the network in a data-parallel step (issue 17), measured on SmolLM2-135M.

For each mode (native, zero, lsp) it runs the SMS-spam job for a few steps on one rank at
micro-batch 2, then on two ranks at micro-batch 1 (two `lspctl run --rank=R` processes over
loopback), and prints per step: the bytes each rank all-reduced (metrics.jsonl
`all_reduce_bytes`), the seconds in the all-reduce, the step time of one and of two ranks, and
the bytes the formula predicts (native and zero: 4 * sum of m*n; lsp: 4 * sum of d_p*d_q; plus
the bookkeeping, 24 bytes, and 4 for the missing-gradient count, which lsp's and zero's
overlapped steps do not send). lsp and zero run two ranks under each schedule of --schedules
(overlap: the sums inside the backward, matrix by matrix; serial: one all-reduce after it).

On this 2-core machine the two ranks share the cores with each other and with their own
optimizer services: the step times show the overhead, not a speed-up; the bytes are exact.

Usage: scripts/dp_measure.py [--steps 3] [--modes native,zero,lsp]
                             [--schedules overlap,serial] [--out runs/dp-measure]
       (needs build/client/lspctl with Gloo, and models/ from scripts/setup)
Output: a Markdown table on stdout and OUT/results.json.
"""
import argparse
import json
import os
import subprocess
import sys

from bench import free_port  # scripts/bench.py, beside this file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LSPCTL = os.path.join(ROOT, "build", "client", "lspctl")

# SmolLM2-135M's shapes (config.json): hidden 576, intermediate 1536, 30 layers, 9 heads of 64,
# 3 KV heads: q/o 576x576, k/v 192x576, gate/up 1536x576, down 576x1536.
HIDDEN, INTER, LAYERS, KV = 576, 1536, 30, 192
MATRICES = [(HIDDEN, HIDDEN), (KV, HIDDEN), (KV, HIDDEN), (HIDDEN, HIDDEN),
            (INTER, HIDDEN), (INTER, HIDDEN), (HIDDEN, INTER)] * LAYERS


def spec(mode, micro_batch, steps, world_size, port, d, schedule):
    s = {
        "schedule": schedule,
        "name": f"dp-measure-{mode}",
        "mode": mode,
        "model": {"path": "models/SmolLM2-135M-Instruct.Q4_1.gguf", "format": "gguf"},
        "data": {"format": "classification", "train_path": "datasets/sms-spam/train.tsv",
                 "question": "Is this message spam or ham?",
                 "system_prompt": "You classify SMS messages."},
        "lsp": {"d": d, "r": 4, "check_freq": 0, "fit_iters": 5, "calibration_examples": 4},
        "optim": {"lr": 3e-4},
        "steps": steps,
        "micro_batch_size": micro_batch,
        "seq_len": 128,
        "seed": 42,
        "device": "cpu",
        "num_threads": 2 if world_size == 1 else 1,
        "skip_initial_eval": True,
        "skip_checkpoint": True,
    }
    if world_size > 1:
        s["distributed"] = {"world_size": world_size, "rendezvous": f"127.0.0.1:{port}",
                            "timeout_seconds": 600}
    return s


def steps_of(out_dir):
    rows = []
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "step":
                rows.append(r)
    return rows


def run(mode, world_size, steps, out, d, schedule="overlap"):
    port = free_port()
    micro_batch = 2 // world_size
    tag = f"{mode}-{schedule}-w{world_size}"
    path = os.path.join(out, f"{tag}.json")
    with open(path, "w") as f:
        json.dump(spec(mode, micro_batch, steps, world_size, port, d, schedule), f)
    procs, dirs = [], []
    for rank in range(world_size):
        run_dir = os.path.join(out, f"{tag}-rank{rank}")
        dirs.append(run_dir)
        args = [LSPCTL, "run", f"--spec={path}", f"--output_dir={run_dir}"]
        if world_size > 1:
            args.append(f"--rank={rank}")
        log = open(run_dir + ".log", "w")
        procs.append(subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"{mode} on {world_size} rank(s) failed ({codes}): see {out}/*.log")
    return [steps_of(x) for x in dirs]


def predicted(mode, d, schedule):
    """Bytes all-reduced by a step after the first (the first is always serial)."""
    if mode == "lsp":
        values = sum(min(d, m) * min(d, n) for m, n in MATRICES)
    else:
        values = sum(m * n for m, n in MATRICES)
    by_matrix = mode in ("lsp", "zero") and schedule == "overlap"
    return 4 * values + (0 if by_matrix else 4) + 24


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--modes", default="native,zero,lsp")
    ap.add_argument("--d", type=int, default=128, help="lsp.d (the paper's is 128 at 1.3B)")
    ap.add_argument("--schedules", default="overlap,serial",
                    help="schedules of the two-rank lsp and zero runs (native sums after "
                         "its backward under either)")
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", "dp-measure"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    results = {}
    # Step 1 includes warm-up effects (allocations, the first all-reduce's connections).
    later = lambda rows, k: [r.get(k, 0) for r in rows if r["step"] > 1] or [0]
    mean = lambda xs: sum(xs) / len(xs)
    for mode in a.modes.split(","):
        one = run(mode, 1, a.steps, a.out, a.d)[0]
        schedules = a.schedules.split(",") if mode in ("lsp", "zero") else ["overlap"]
        for schedule in schedules:
            two = run(mode, 2, a.steps, a.out, a.d, schedule)
            results[f"{mode} ({schedule})" if mode != "native" else mode] = {
                "all_reduce_bytes": [int(r.get("all_reduce_bytes", 0)) for r in two[0]],
                "predicted_bytes": predicted(mode, a.d, schedule),
                "all_reduce_seconds": mean(later(two[0], "all_reduce_seconds")),
                "all_reduce_exposed_seconds": mean(later(two[0], "all_reduce_exposed_seconds")),
                "step_seconds_1_rank": mean(later(one, "step_seconds")),
                "step_seconds_2_ranks": mean(later(two[0], "step_seconds")),
                "loss_1_rank": [r["loss"] for r in one],
                "loss_2_ranks": [r["loss"] for r in two[0]],
            }
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("| mode | all-reduced per step (measured) | predicted | all-reduce s (exposed) | "
          "step s, 1 rank (mb 2, 2 threads) | step s, 2 ranks (mb 1 each, 1 thread) |")
    print("|---|---|---|---|---|---|")
    for mode, r in results.items():
        print(f"| {mode} | {r['all_reduce_bytes'][-1]:,} B | {r['predicted_bytes']:,} B | "
              f"{r['all_reduce_seconds']:.3f} ({r['all_reduce_exposed_seconds']:.3f}) | "
              f"{r['step_seconds_1_rank']:.2f} | "
              f"{r['step_seconds_2_ranks']:.2f} |")
    for mode, r in results.items():
        print(f"{mode} losses, 1 rank: {r['loss_1_rank']}, 2 ranks: {r['loss_2_ranks']}")


if __name__ == "__main__":
    main()
