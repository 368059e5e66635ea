#!/usr/bin/env python3
"""Plots for LSP-Offload runs (run through scripts/plot, which provides matplotlib).

--timeline RUN_DIR OUT.png [STEP]
    Per-layer timeline of one step from RUN_DIR/timeline.jsonl (written by the scheduler for
    lsp/zero jobs): one row per (actor, layer); bars for forward, backward, offload, update,
    wait and apply, seconds from the step's first event. Default STEP: the last step.
--fidelity RUNS_ROOT OUT_DIR
    For every RUNS_ROOT/<name>/ with metrics.jsonl + summary.json: eval loss and accuracy per
    step (eval_loss.png, accuracy.png) and a markdown table (table.md) of final eval loss,
    accuracy, Moby-Dick perplexity before/after and mean step time.
--study RESULTS_JSONL OUT_DIR
    From the accuracy study's records (scripts/fidelity_study.py's results.jsonl, e.g.
    docs/fidelity/study-results.jsonl): per task, the lr sweep (final eval loss against lr at
    60 steps, one line per mode: study-<task>-sweep.png) and, per step budget, the evaluation
    curves of each mode's best run (lowest final eval loss): eval loss, the task metric and
    Moby-Dick perplexity against the step, the zero-shot model at step 0
    (study-<task>-s<steps>.png).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fidelity_study  # noqa: E402  (its best_record: one rule for "a mode's best run")

COLORS = {"forward": "#4c72b0", "backward": "#dd8452", "offload": "#55a868",
          "update": "#c44e52", "wait": "#bbbbbb", "apply": "#8172b3"}


def load_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def timeline(run_dir, out_png, step=None):
    rows = load_jsonl(os.path.join(run_dir, "timeline.jsonl"))
    if not rows:
        sys.exit(f"{run_dir}/timeline.jsonl has no steps")
    rec = rows[-1] if step is None else next(r for r in rows if r["step"] == int(step))
    ev = rec["events"]
    t0 = min(e["start"] for e in ev)
    lanes = sorted({(e["actor"], e["layer"]) for e in ev}, key=lambda k: (k[0] != "worker", -k[1]))
    y = {k: i for i, k in enumerate(lanes)}
    fig, ax = plt.subplots(figsize=(12, max(3, 0.22 * len(lanes) + 1.5)))
    for e in ev:
        w = max(e["end"] - e["start"], 1e-5)
        ax.barh(y[(e["actor"], e["layer"])], w, left=e["start"] - t0,
                color=COLORS.get(e["what"], "k"), height=0.8)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"{a} L{l}" for a, l in lanes], fontsize=6)
    ax.set_xlabel("seconds from the step's first event")
    plan = rec["plan"]
    ax.set_title(f"step {rec['step']}: {'overlap, split ' + str(plan['split_layer']) if plan['overlap'] else 'serial'}"
                 f", step {rec['step_seconds']:.2f} s, worker wait {rec['wait_seconds']:.3f} s")
    ax.legend(handles=[matplotlib.patches.Patch(color=c, label=k) for k, c in COLORS.items()],
              loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    print(f"wrote {out_png}")


def fidelity(root, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    runs = []
    for name in sorted(os.listdir(root)):
        d = os.path.join(root, name)
        if os.path.exists(os.path.join(d, "summary.json")):
            runs.append((name, d))
    if not runs:
        sys.exit(f"no finished runs under {root}")
    table = ["| run | final eval loss | vs native | accuracy | Moby-Dick ppl before -> after | mean step s | wall s |",
             "|---|---|---|---|---|---|---|"]
    native_loss = None
    for name, d in runs:
        if name == "native":
            native_loss = json.load(open(os.path.join(d, "summary.json"))).get("final_eval_loss")
    for metric, fname, label in [("loss", "eval_loss.png", "eval answer loss (nats)"),
                                 ("accuracy", "accuracy.png", "test accuracy (200 messages)")]:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, d in runs:
            ev = [r for r in load_jsonl(os.path.join(d, "metrics.jsonl")) if r.get("kind") == "eval"]
            ax.plot([r["step"] for r in ev], [r[metric] for r in ev], marker="o", label=name)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(label)
        if metric == "loss":
            ax.set_yscale("log")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, fname), dpi=120)
        print(f"wrote {out_dir}/{fname}")
    for name, d in runs:
        s = json.load(open(os.path.join(d, "summary.json")))
        rel = ""
        if native_loss and s.get("final_eval_loss") is not None:
            rel = f"{100 * (s['final_eval_loss'] - native_loss) / native_loss:+.1f}%"
        table.append(f"| {name} | {s.get('final_eval_loss', float('nan')):.4f} | {rel} | "
                     f"{s.get('final_accuracy', float('nan')):.3f} | "
                     f"{s.get('zero_shot_perplexity', float('nan')):.2f} -> {s.get('final_perplexity', float('nan')):.2f} | "
                     f"{s.get('mean_step_seconds', float('nan')):.2f} | {s.get('wall_seconds', float('nan')):.0f} |")
    with open(os.path.join(out_dir, "table.md"), "w") as f:
        f.write("\n".join(table) + "\n")
    print("\n".join(table))


METRICS = {"accuracy": "test accuracy", "f1": "tag F1 of greedy answers"}


def study(results_jsonl, out_dir):
    recs = [r for r in load_jsonl(results_jsonl) if r.get("status") == "done"]
    if not recs:
        sys.exit(f"{results_jsonl} has no finished runs")
    os.makedirs(out_dir, exist_ok=True)
    modes = list(dict.fromkeys(r["mode_name"] for r in recs))  # first-seen order
    for task in dict.fromkeys(r["task"] for r in recs):
        rs = [r for r in recs if r["task"] == task]
        metric = rs[0]["metric"]
        # The lr sweep at the short budget.
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for m in modes:
            pts = sorted((r["lr"], r["final_eval_loss"]) for r in rs
                         if r["mode_name"] == m and r["steps_budget"] == 60
                         and r.get("final_eval_loss") is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=m,
                        color=f"C{modes.index(m) % 10}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("final eval loss (nats per answer token)")
        ax.set_title(f"{task}: lr sweep, 60 steps")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = os.path.join(out_dir, f"study-{task}-sweep.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        print(f"wrote {path}")
        # The curves of each mode's best run per budget.
        zero = next((r for r in rs if r.get("zero_shot_eval_loss") is not None), None)
        for steps in sorted({r["steps_budget"] for r in rs}):
            best = {m: fidelity_study.best_record(rs, task, m, steps) for m in modes}
            best = {m: r for m, r in best.items() if r is not None}
            fig, axes = plt.subplots(1, 3, figsize=(14, 4))
            for m in modes:
                if m not in best:
                    continue
                r = best[m]
                curve = [(0, zero["zero_shot_eval_loss"], zero["zero_shot_metric"],
                          zero["zero_shot_perplexity"])] if zero else []
                curve += [(c["step"], c.get("loss"), c.get(metric), c.get("perplexity"))
                          for c in r.get("curve", [])]
                label = f"{m} (lr {r['lr']:g})"
                for k, ax in enumerate(axes):
                    pts = [(c[0], c[k + 1]) for c in curve if c[k + 1] is not None]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label,
                            color=f"C{modes.index(m) % 10}")
            for ax, ylabel, log in zip(axes, ["eval loss (nats per answer token)",
                                              METRICS.get(metric, metric),
                                              "Moby-Dick perplexity"], [True, False, True]):
                ax.set_xlabel("optimizer step")
                ax.set_ylabel(ylabel)
                if log:
                    ax.set_yscale("log")
            axes[0].legend(fontsize=7)
            fig.suptitle(f"{task}, {steps} steps: each mode at its best lr (lowest final eval loss)")
            fig.tight_layout()
            path = os.path.join(out_dir, f"study-{task}-s{steps}.png")
            fig.savefig(path, dpi=110)
            plt.close(fig)
            print(f"wrote {path}")


def main(argv):
    if len(argv) >= 3 and argv[0] == "--timeline":
        timeline(argv[1], argv[2], argv[3] if len(argv) > 3 else None)
    elif len(argv) == 3 and argv[0] == "--fidelity":
        fidelity(argv[1], argv[2])
    elif len(argv) == 3 and argv[0] == "--study":
        study(argv[1], argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
