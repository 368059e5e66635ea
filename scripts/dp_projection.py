#!/usr/bin/env python3
"""A projection (not a measurement) of the all-reduce time per data-parallel step, issue 17.

Bytes per step are exact for the product's collectives (measured equal to this formula on
SmolLM2-135M by scripts/dp_measure.py): fp32 values of every trained matrix's gradient for
zero/native (sum of m*n), of every S = P^T G Q for lsp (sum of d_p*d_q, d = the paper's
choice: 1280 for the 2048-wide 1.3B model, 2048 for the 4096-wide 6.7B model; docs/method.md).

Time: a bandwidth-optimal ring all-reduce moves 2 (W - 1) / W of the buffer through each
rank's link (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
workstations", JPDC 2009; the same factor NCCL's tests report as bus bandwidth). Link rates are
the Ethernet line rates of IEEE 802.3ae (10GBASE), 802.3by (25GBASE) and 802.3ba (100GBASE):
1.25, 3.125 and 12.5 GB/s; real links deliver less (protocol overhead, TCP), so these are lower
bounds on the time. Latency terms (2 (W - 1) hops) are left out: milliseconds against seconds.

Step time (the second table): the one-rank step measured on an H200 (docs/gpu.md "Results",
docs/gpu/results-2026-12-04-h200.json: the ~1.1B Llama, hidden 2048, intermediate 5632, 22
layers, 8 KV heads of 64, micro-batch 4 x 512 tokens; lsp d = 256 with LibTorch kernels,
zero with the overlap schedule) scaled to each shape by its trained matrix elements (sum of
m*n), at the same 2048 tokens per rank (weak scaling: W ranks train W x 2048 tokens per step).
That scaling is first order: compute, offload and apply grow with sum(m*n) at a fixed token
count; attention's seq^2 part and the kernels' efficiency at other widths are left out. The
serial schedule adds the whole all-reduce to that step; the overlap schedule hides the part
that fits under the backward, except the last matrix's share, which can only start when the
backward ends: exposed = max(R / layers, R - backward).

Usage: scripts/dp_projection.py   (prints two Markdown tables)
"""
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
H200_RESULTS = os.path.join(ROOT, "docs", "gpu", "results-2026-12-04-h200.json")
# The measured model's shape (scripts/device_check.py SHAPES["llama-1.1b"]): hidden,
# intermediate, layers, KV width (8 heads x 64).
MEASURED = (2048, 5632, 22, 512)
TOKENS_PER_RANK = 4 * 512

GB = 1e9
LINKS = {"10 GbE": 1.25 * GB, "25 GbE": 3.125 * GB, "100 GbE": 12.5 * GB}

# (name, hidden, ffn, layers, lsp d): OPT-style shapes of the paper's models (q, k, v, o:
# hidden x hidden; fc1 ffn x hidden; fc2 hidden x ffn).
MODELS = [("1.3B", 2048, 8192, 24, 1280), ("6.7B", 4096, 16384, 32, 2048)]


def matrices(hidden, ffn, layers):
    return [(hidden, hidden)] * 4 * layers + [(ffn, hidden), (hidden, ffn)] * layers


def bytes_per_step(mode, hidden, ffn, layers, d):
    mats = matrices(hidden, ffn, layers)
    if mode == "lsp":
        return 4 * sum(min(d, m) * min(d, n) for m, n in mats)
    return 4 * sum(m * n for m, n in mats)


def ring_seconds(nbytes, world_size, bandwidth):
    return 2 * (world_size - 1) / world_size * nbytes / bandwidth


def measured_elements():
    hidden, inter, layers, kv = MEASURED
    per_layer = 2 * hidden * hidden + 2 * kv * hidden + 3 * inter * hidden
    return per_layer * layers


def h200_step(mode):
    """(step seconds, backward seconds) of the 1.1B run of `mode` ("lsp" or "zero-overlap")."""
    with open(H200_RESULTS) as f:
        runs = json.load(f)["runs"]
    run = next(r for r in runs if r["name"] == f"llama-1.1b-{mode}")
    return run["mean_step_seconds"], run["mean_backward_seconds"]


def exposed(ring, backward, layers, overlap):
    if not overlap:
        return ring
    return max(ring / layers, ring - backward)


def step_table():
    print()
    print("| model | mode | 1 rank step (backward), projected | W | schedule | "
          + " | ".join(LINKS) + " |")
    print("|---|---|---|---|---|" + "---|" * len(LINKS))
    base = measured_elements()
    for name, hidden, ffn, layers, d in MODELS:
        scale = sum(m * n for m, n in matrices(hidden, ffn, layers)) / base
        for mode, run in (("zero", "zero-overlap"), ("lsp", "lsp")):
            step1, bwd1 = (x * scale for x in h200_step(run))
            b = bytes_per_step(mode, hidden, ffn, layers, d)
            for w in (2, 8):
                for overlap in (False, True):
                    cells = []
                    for bw in LINKS.values():
                        t = step1 + exposed(ring_seconds(b, w, bw), bwd1, layers, overlap)
                        cells.append(f"{t:.2f} s ({w * step1 / t:.1f}x)")
                    print(f"| {name} | {mode} | {step1:.2f} s ({bwd1:.2f} s) | {w} | "
                          f"{'overlap' if overlap else 'serial'} | " + " | ".join(cells) + " |")


def main():
    print("| model | mode | all-reduced per step | W | " + " | ".join(LINKS) + " |")
    print("|---|---|---|---|" + "---|" * len(LINKS))
    for name, hidden, ffn, layers, d in MODELS:
        for mode in ("zero", "lsp"):
            b = bytes_per_step(mode, hidden, ffn, layers, d)
            label = f"{mode} (d = {d})" if mode == "lsp" else f"{mode} / native"
            for w in (2, 4, 8):
                times = " | ".join(f"{ring_seconds(b, w, bw):.2f} s" for bw in LINKS.values())
                print(f"| {name} | {label} | {b / GB:.2f} GB | {w} | {times} |")
    step_table()


if __name__ == "__main__":
    main()
