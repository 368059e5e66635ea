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

The step time of a data-parallel job in the serial schedule (what exists) is the one-rank step
time (compute, offload, update) plus this all-reduce; with the per-layer overlap (designed,
docs/distributed.md) the part of it that fits under the backward is hidden.

Usage: scripts/dp_projection.py   (prints a Markdown table)
"""

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


if __name__ == "__main__":
    main()
