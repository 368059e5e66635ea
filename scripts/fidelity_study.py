#!/usr/bin/env python3
"""Accuracy study driver (issue 16, "The study"; run through scripts/fidelity).

Reads a study plan (default examples/fidelity/study/plan.yaml), writes one job spec per run
into OUT/specs/, and runs them one at a time with `build/client/lspctl run`, most informative
first, until the time budget is spent. After every run it appends the run's record to
OUT/results.jsonl and rewrites OUT/results.md (tables per task and step budget, the best lr
per mode, the verdict against the issue's targets, the evaluation curves, runs not done).

A run whose OUT/runs/NAME/summary.json exists is not run again, so a study resumes where an
interrupted one stopped (a failed run has no summary and is retried).

Peak memory: the peak RSS of each lspctl process is the ru_maxrss that os.wait4 returns for
it (the process holds the worker, the optimizer service and the scheduler in embedded mode);
the worker's own reported peak (max worker_peak_rss_bytes of metrics.jsonl) is kept in
results.jsonl too.

Python 3 standard library plus PyYAML (Debian python3-yaml).
"""

import argparse
import copy
import datetime
import fnmatch
import json
import math
import os
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LSPCTL = os.path.join("build", "client", "lspctl")
IMPORTED_RECORD = "imported-record.json"  # a finished run's record from --resume-from
SHORT_BUDGET = 60  # the step budget of the lr sweep

# Summary keys of a task's metric (scheduler/job_runner.cc): final_<key>, zero_shot_<key>.
METRIC_LABELS = {"accuracy": "accuracy", "f1": "tag F1"}

# The job currently running, so that a SIGTERM to the driver also stops it.
CURRENT_CHILD = None


# ----------------------------------------------------------------------------------------
# The plan


def load_yaml(path):
    """Reads a YAML file and returns its content (a dict for plans and specs)."""
    import yaml  # here, so that scripts/plots.py imports this module without PyYAML
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def format_lr(lr):
    """Returns a short, file-name safe form of a learning rate: 0.0006 -> '6e-4'."""
    mantissa, exponent = f"{lr:.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def middle_lr(lrs):
    """Returns the middle value of an lr grid (the upper middle for an even count)."""
    return lrs[len(lrs) // 2]


def sweep_order(lrs):
    """Returns the sweep's lrs of a grid (all but the middle one) outward from the middle: by
    distance from it in grid positions, the lower lr first at equal distance. [3e-4, 8e-4,
    2e-3, 5e-3] (middle 2e-3) -> [8e-4, 5e-3, 3e-4]. Each lr's neighbour toward the middle
    comes before it, which the bracket rule (bracket_skip) needs."""
    grid = sorted(lrs)
    mid = grid.index(middle_lr(lrs))
    return sorted((lr for lr in grid if lr != grid[mid]),
                  key=lambda lr: (abs(grid.index(lr) - mid), lr))


def bracket_skip(records, run):
    """Returns why a 60-step sweep run is not needed, or None when it is.

    The sweep widens a mode's grid outward from its middle lr only on the side where the best
    lr so far (lowest final eval loss of the mode's finished 60-step runs on the task) sits at
    the end of what has run, until the best lr is bracketed by worse ones. An lr is needed when
    its neighbour toward the middle is the best so far; otherwise it is needed only to reach
    the issue's minimum of three lrs per mode, when no lr on the other side (next to the best)
    can. An lr whose neighbour has not finished follows that neighbour: not needed when it is
    not. Runs that are not sweep runs are always needed."""
    if not run.get("sweep"):
        return None
    task, name = run["task"], run["mode"]["name"]
    done = {r["lr"]: r["final_eval_loss"] for r in records
            if r["task"] == task and r["mode_name"] == name and r["steps_budget"] == SHORT_BUDGET
            and r.get("final_eval_loss") is not None}
    if not done or run["lr"] in done:
        return None
    grid = sorted(run["mode"]["lrs"])
    mid = grid.index(middle_lr(run["mode"]["lrs"]))

    def inward(lr):
        i = grid.index(lr)
        return None if i == mid else grid[i + 1] if i < mid else grid[i - 1]

    best = min(done, key=done.get)
    n = inward(run["lr"])
    if n is None or n == best:
        return None
    if n not in done:
        # Decided after its neighbour (which runs first); not needed when that one is not.
        return bracket_skip(records, dict(run, lr=n))
    open_side = [lr for lr in grid if lr not in done and inward(lr) == best]
    if len(done) < 3 and not open_side:
        return None
    return (f"bracketed: {format_lr(best)} has the lowest eval loss of {len(done)} finished lrs "
            f"({done[best]:.4f}), and {format_lr(n)}, the neighbour toward the middle, is not it"
            + (f" (the sweep goes on at {format_lr(open_side[0])})" if open_side else ""))


def run_name(task, mode_name, steps, lr):
    """Returns the name of a run: its folder under OUT/runs and its spec's name."""
    return f"{task}-{mode_name}-s{steps}-lr{format_lr(lr)}"


def matches_only(task, mode_name, patterns):
    """Tells whether a run passes the --only filters (no filter: every run passes).

    A pattern is TASK/MODE with shell wildcards (sms/lsp-*, */native), or a single name that
    matches either the task or the mode."""
    if not patterns:
        return True
    for p in patterns:
        if "/" in p:
            if fnmatch.fnmatch(f"{task}/{mode_name}", p):
                return True
        elif fnmatch.fnmatch(task, p) or fnmatch.fnmatch(mode_name, p):
            return True
    return False


def check_plan(plan):
    """Exits with a message naming the field when the plan lacks something the driver needs."""
    for key in ("tasks", "modes", "order"):
        if not plan.get(key):
            sys.exit(f"fidelity_study: the plan has no '{key}'")
    for task, t in plan["tasks"].items():
        if "spec" not in t or t.get("metric") not in METRIC_LABELS:
            sys.exit(f"fidelity_study: task {task} needs 'spec' and 'metric' (accuracy or f1)")
    names = set()
    for m in plan["modes"]:
        if m.get("mode") not in ("native", "zero", "lsp", "lora", "galore"):
            sys.exit(f"fidelity_study: mode entry {m.get('name')} has mode {m.get('mode')!r}")
        if m.get("lr_of"):  # long runs only, at another mode's best lr
            if m["lr_of"] not in {x.get("name") for x in plan["modes"]} or m["lr_of"] == m["name"]:
                sys.exit(f"fidelity_study: mode {m['name']}: lr_of {m['lr_of']!r} is not another "
                         f"mode of the plan")
            if len(m.get("lrs", [])) < 1 or not any(st > SHORT_BUDGET for st in m.get("steps", [])):
                sys.exit(f"fidelity_study: mode {m['name']} (lr_of) needs lrs (the fallback lr) and "
                         f"a step budget above {SHORT_BUDGET}")
        elif len(m.get("lrs", [])) < 1 or SHORT_BUDGET not in m.get("steps", []):
            sys.exit(f"fidelity_study: mode {m['name']} needs lrs and steps including {SHORT_BUDGET}")
        long_lrs = m.get("long_lrs", [])
        if isinstance(long_lrs, dict):
            unknown = sorted(set(long_lrs) - set(plan["tasks"]))
            if unknown:
                sys.exit(f"fidelity_study: mode {m['name']}: long_lrs names unknown task(s) "
                         f"{', '.join(unknown)} (tasks: {', '.join(plan['tasks'])})")
            if not all(isinstance(lrs, list) for lrs in long_lrs.values()):
                sys.exit(f"fidelity_study: mode {m['name']}: long_lrs maps each task to a list "
                         "of lrs (e.g. {sms: [3.0e-4]})")
            long_lrs = [lr for lrs in long_lrs.values() for lr in lrs]
        if long_lrs and not any(st > SHORT_BUDGET for st in m.get("steps", [])):
            sys.exit(f"fidelity_study: mode {m['name']} has long_lrs but no step budget above "
                     f"{SHORT_BUDGET}")
        if not all(isinstance(lr, (int, float)) for lr in m["lrs"] + long_lrs):
            sys.exit(f"fidelity_study: mode {m['name']}: every lr must be a number "
                     "(YAML reads 3e-3 as text: write 3.0e-3)")
        if m["name"] in names:
            sys.exit(f"fidelity_study: mode name {m['name']} is used twice")
        names.add(m["name"])
    for o in plan["order"]:
        if o.get("task") not in plan["tasks"] or o.get("phase") not in ("middle", "sweep", "long"):
            sys.exit(f"fidelity_study: bad order entry {o}")


def planned_runs(plan, only):
    """Lists the runs of the plan in start order, as dicts (task, mode entry, steps, lr).

    The lr of a run at a budget above 60 steps is None here: it is the mode's best lr of the
    60-step sweep, chosen just before the run starts (choose_long_lr). A mode's `long_lrs` (a
    list, or a mapping task -> list: long_lrs_of) add runs at those fixed lrs to every budget
    above 60 steps (a longer run can overfit at the best 60-step lr, so the long budget gets an
    lr choice of its own); one that equals the chosen lr is the same run."""
    runs = []
    for o in plan["order"]:
        task = o["task"]
        for m in plan["modes"]:
            if not matches_only(task, m["name"], only):
                continue
            if m.get("lr_of") and o["phase"] != "long":
                continue  # no 60-step runs of its own
            if o["phase"] == "middle":
                runs.append({"task": task, "mode": m, "steps": SHORT_BUDGET, "lr": middle_lr(m["lrs"])})
            elif o["phase"] == "sweep":
                for lr in sweep_order(m["lrs"]):
                    runs.append({"task": task, "mode": m, "steps": SHORT_BUDGET, "lr": lr,
                                 "sweep": True})
            else:
                for steps in m["steps"]:
                    if steps != SHORT_BUDGET:
                        runs.append({"task": task, "mode": m, "steps": steps, "lr": None})
                        for lr in long_lrs_of(m, task):
                            runs.append({"task": task, "mode": m, "steps": steps, "lr": lr})
    return runs


# ----------------------------------------------------------------------------------------
# Job specs


def merge(base, extra):
    """Returns base with extra merged into it (nested dicts merged key by key, copies)."""
    out = copy.deepcopy(base)
    for key, value in (extra or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def mode_settings(plan, mode_entry, quick):
    """Returns the spec sections of a mode entry (--quick: the plan's quick replacements)."""
    if quick and mode_entry["name"] in plan.get("quick", {}).get("settings", {}):
        return plan["quick"]["settings"][mode_entry["name"]]
    return mode_entry.get("settings", {})


def build_spec(plan, run, out_dir, quick, zero_shot):
    """Returns the job spec (a dict) of one run: the task's base spec plus the run's overrides.

    With quick, the model, data and sizes are those of the plan's quick spec (a tiny random
    model on text), evaluated by loss, for quick.steps steps. zero_shot False sets
    skip_initial_eval (the task's zero-shot numbers come from another run)."""
    task = plan["tasks"][run["task"]]
    spec = load_yaml(os.path.join(REPO, task["spec"]))
    spec = merge(spec, task.get("overrides"))
    steps = run["steps"]
    ppl_blocks = plan["perplexity"]["blocks"]
    if quick:
        tiny = load_yaml(os.path.join(REPO, plan["quick"]["spec"]))
        spec["model"] = tiny["model"]
        spec["data"] = tiny["data"]
        for key in ("seq_len", "micro_batch_size"):
            spec[key] = tiny[key]
        spec.pop("eval", None)  # text data: no generation to score
        spec["optim"].pop("warmup_steps", None)  # a warm-up longer than the run
        steps = plan["quick"]["steps"]
        ppl_blocks = plan["quick"].get("perplexity_blocks", ppl_blocks)
    # Only the run's own mode section: other modes' settings are refused by the validation.
    lsp_base = spec.pop("lsp", {}) or {}
    spec.pop("lora", None)
    spec.pop("galore", None)
    mode = run["mode"]["mode"]
    spec["mode"] = mode
    settings = mode_settings(plan, run["mode"], quick)
    if mode == "lsp":
        lsp = merge(lsp_base, settings.get("lsp"))
        if "d_ratio" in (settings.get("lsp") or {}):
            lsp.pop("d", None)       # exactly one of d and d_ratio
            lsp.pop("narrow", None)  # not used with d_ratio
        spec["lsp"] = lsp
    elif mode in ("lora", "galore"):
        spec[mode] = copy.deepcopy(settings.get(mode, {}))
    spec["name"] = run["name"]
    spec["seed"] = plan["seed"]
    spec["steps"] = steps
    spec["optim"] = merge(spec.get("optim", {}), {"lr": run["lr"]})
    spec["eval_every"] = task.get("eval_every", {}).get(run["steps"], spec.get("eval_every", 0))
    spec["data"]["perplexity_path"] = plan["perplexity"]["path"]
    spec["data"]["perplexity_blocks"] = ppl_blocks
    spec["skip_checkpoint"] = True
    spec["skip_initial_eval"] = not zero_shot
    spec["output_dir"] = os.path.join(out_dir, "runs", run["name"])
    return spec


def write_spec(spec, path):
    """Writes a job spec as YAML (keys in the order they were set)."""
    import yaml
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# Written by scripts/fidelity_study.py for run {spec['name']}.\n")
        yaml.safe_dump(spec, f, sort_keys=False, default_flow_style=False)


# ----------------------------------------------------------------------------------------
# Reading finished runs


def read_jsonl(path):
    """Returns the JSON objects of a .jsonl file (none when it does not exist)."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass  # a line cut by a crash
    return rows


def run_dir(out_dir, name):
    """Returns the output folder of a run."""
    return os.path.join(out_dir, "runs", name)


def source_version():
    """The commit the runs are built from, '+changes' appended when the working tree differs
    from it (git diff HEAD), or None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, check=True,
                              capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=REPO).returncode != 0
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return None


def is_done(out_dir, name):
    """Tells whether a run finished (its summary.json exists, or its record was imported with
    --resume-from)."""
    d = run_dir(out_dir, name)
    return (os.path.exists(os.path.join(d, "summary.json"))
            or os.path.exists(os.path.join(d, IMPORTED_RECORD)))


def import_records(out_dir, path):
    """Marks the finished runs recorded in `path` (a results.jsonl of an earlier study, e.g.
    docs/fidelity/study-results.jsonl from another machine) as done in out_dir: each gets
    OUT/runs/NAME/imported-record.json holding its record, unless the run exists here already.
    Returns the number imported. Exits naming the file when it is missing or a line is not a
    JSON object with a name."""
    if not os.path.exists(path):
        sys.exit(f"fidelity_study: --resume-from {path}: no such file")
    n = 0
    for rec in read_jsonl(path):
        if not isinstance(rec, dict) or not rec.get("name"):
            sys.exit(f"fidelity_study: --resume-from {path}: a line without a run name")
        if rec.get("status") != "done" or is_done(out_dir, rec["name"]):
            continue
        d = run_dir(out_dir, rec["name"])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, IMPORTED_RECORD), "w", encoding="utf-8") as f:
            json.dump(rec, f)
        n += 1
    return n


def collect_record(out_dir, run, task_metric):
    """Returns the record of a finished run from its summary.json, metrics.jsonl and the
    driver's own measurements (study.json: process wall time, peak RSS)."""
    d = run_dir(out_dir, run["name"])
    if not os.path.exists(os.path.join(d, "summary.json")):  # imported (--resume-from)
        with open(os.path.join(d, IMPORTED_RECORD), encoding="utf-8") as f:
            return json.load(f)
    with open(os.path.join(d, "summary.json"), encoding="utf-8") as f:
        s = json.load(f)
    study = {}
    if os.path.exists(os.path.join(d, "study.json")):
        with open(os.path.join(d, "study.json"), encoding="utf-8") as f:
            study = json.load(f)
    metrics = read_jsonl(os.path.join(d, "metrics.jsonl"))
    steps = [m for m in metrics if m.get("kind") == "step"]
    evals = [m for m in metrics if m.get("kind") == "eval"]

    def peak(key):
        """Largest value of a step-line field (None when no step line has it)."""
        values = [m[key] for m in steps if isinstance(m.get(key), (int, float))]
        return max(values) if values else None

    return {
        "name": run["name"],
        "task": run["task"],
        "mode_name": run["mode"]["name"],
        "mode": s.get("mode"),
        "steps": s.get("steps"),
        "lr": s.get("lr"),
        "metric": task_metric,
        "final_eval_loss": s.get("final_eval_loss"),
        "final_metric": s.get(f"final_{task_metric}"),
        "zero_shot_eval_loss": s.get("zero_shot_eval_loss"),
        "zero_shot_metric": s.get(f"zero_shot_{task_metric}"),
        "zero_shot_perplexity": s.get("zero_shot_perplexity"),
        "final_perplexity": s.get("final_perplexity"),
        "offload_bytes_per_step": s.get("offload_bytes_per_step"),
        "optimizer_state_bytes": s.get("optimizer_state_bytes"),
        "trainable_parameters": s.get("trainable_parameters"),
        "mean_step_seconds": s.get("mean_step_seconds"),
        "wall_seconds": s.get("wall_seconds"),
        "process_seconds": study.get("process_seconds"),
        "peak_rss_bytes": study.get("peak_rss_bytes"),
        "commit": study.get("commit"),
        "worker_peak_rss_bytes": peak("worker_peak_rss_bytes"),
        "optimizer_peak_rss_bytes": peak("optimizer_peak_rss_bytes"),
        "gpu_peak_allocated_bytes": peak("gpu_peak_allocated_bytes"),
        "eval_seconds": [e.get("seconds") for e in evals],
        "curve": [{"step": e.get("step"), "loss": e.get("loss"), task_metric: e.get(task_metric),
                   "perplexity": e.get("perplexity")} for e in evals],
        "train_loss": [m.get("loss") for m in steps],
        "status": "done",
    }


# ----------------------------------------------------------------------------------------
# Running


def run_job(lspctl, spec_path, out, log_path):
    """Runs lspctl on one spec, its output into log_path; returns (exit code, seconds, peak RSS
    bytes). The peak RSS is ru_maxrss (KiB on Linux) of this child alone, from os.wait4."""
    global CURRENT_CHILD
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write(f"$ {lspctl} run --spec={spec_path} --output_dir={out}\n")
        log.flush()
        proc = subprocess.Popen([lspctl, "run", f"--spec={spec_path}", f"--output_dir={out}"],
                                cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        CURRENT_CHILD = proc
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except KeyboardInterrupt:
            # Ctrl-C reached lspctl too (same process group): it cancels the job; wait for it.
            os.wait4(proc.pid, 0)
            raise
        CURRENT_CHILD = None
        proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.monotonic() - t0, usage.ru_maxrss * 1024


def forward_sigterm(signum, frame):
    """SIGTERM handler: stops the running job (lspctl cancels it cleanly), then exits."""
    if CURRENT_CHILD is not None and CURRENT_CHILD.returncode is None:
        CURRENT_CHILD.send_signal(signal.SIGTERM)
        try:
            os.waitpid(CURRENT_CHILD.pid, 0)
        except ChildProcessError:
            pass
    sys.exit(f"fidelity_study: stopped by signal {signum}")


def last_error(log_path):
    """Returns the last non-empty line of a run's log that reads like an error (or the last
    line), for results.md."""
    if not os.path.exists(log_path):
        return "(no log)"
    with open(log_path, encoding="utf-8", errors="replace") as f:
        lines = [ln.strip() for ln in f.read().replace("\r", "\n").split("\n") if ln.strip()]
    for ln in reversed(lines):
        if any(w in ln.lower() for w in ("error", "fail", "invalid", "refused", "must")):
            return ln
    return lines[-1] if lines else "(empty log)"


def long_lrs_of(mode_entry, task):
    """Returns a mode's fixed long-budget lrs on a task: `long_lrs` is a list (every task) or a
    mapping task -> list (a task it does not name has none), since whether a long run overfits
    at the best 60-step lr depends on the task's epochs (SMS: 200 steps are 1.7 epochs, cooking
    0.15)."""
    long_lrs = mode_entry.get("long_lrs", [])
    return list(long_lrs.get(task, [])) if isinstance(long_lrs, dict) else list(long_lrs)


def choose_long_lr(records, task, mode_entry):
    """Returns the lr of a long run: the mode's best 60-step lr on the task by final eval loss
    (for a mode with lr_of, that other mode's), or the grid's middle lr when no such 60-step
    run has finished."""
    best = best_record(records, task, mode_entry.get("lr_of") or mode_entry["name"], SHORT_BUDGET)
    return best["lr"] if best else middle_lr(mode_entry["lrs"])


def find_long_run(out_dir, task, mode_name, steps, fixed_lrs=()):
    """Returns the name of a finished long run of this task, mode and budget at any lr but the
    mode's fixed long lrs (`long_lrs`, runs of their own), or None (a resumed study does not
    rerun it when the best lr has changed since)."""
    prefix = f"{task}-{mode_name}-s{steps}-lr"
    runs_root = os.path.join(out_dir, "runs")
    if not os.path.isdir(runs_root):
        return None
    for name in sorted(os.listdir(runs_root)):
        if (name.startswith(prefix) and is_done(out_dir, name)
                and lr_from_name(name) not in fixed_lrs):
            return name
    return None


def lr_from_name(name):
    """Returns the lr encoded in a run name ('...-lr6e-4' -> 0.0006)."""
    return float(name.rsplit("-lr", 1)[1])


# ----------------------------------------------------------------------------------------
# Time estimates


class TimeModel:
    """Predicts a run's wall time as fixed + steps * step_seconds + evaluations * eval_seconds,
    per task (step time per task and mode), from the finished runs or else the plan's priors."""

    def __init__(self, plan, quick):
        """Takes the priors of every task (the quick ones with --quick)."""
        self.plan = plan
        self.priors = {t: (plan["quick"]["estimate"] if quick else plan["tasks"][t]["estimate"])
                       for t in plan["tasks"]}
        self.quick = quick

    def measured(self, records, task, mode_name=None):
        """Returns the mean (step s, eval s, fixed s) of the task's finished runs (of one mode
        when mode_name is given); None for each part nothing measured."""
        rs = [r for r in records if r["task"] == task and r.get("mean_step_seconds")
              and (mode_name is None or r["mode_name"] == mode_name)]
        if not rs:
            return None, None, None
        step = sum(r["mean_step_seconds"] for r in rs) / len(rs)
        evals = [e for r in rs for e in r["eval_seconds"] if e is not None]
        ev = sum(evals) / len(evals) if evals else None
        fixed = []
        for r in rs:
            wall = r.get("process_seconds") or r.get("wall_seconds")
            if wall:
                fixed.append(max(0.0, wall - r["steps"] * r["mean_step_seconds"]
                                 - sum(e for e in r["eval_seconds"] if e is not None)))
        return step, ev, (sum(fixed) / len(fixed) if fixed else None)

    def evaluations(self, task, steps, zero_shot):
        """Returns how many evaluations a run makes: every eval_every steps, the final one,
        and the zero-shot one when it measures it."""
        every = self.plan["tasks"][task].get("eval_every", {}).get(steps, 0)
        real_steps = self.plan["quick"]["steps"] if self.quick else steps
        n = 1 + (1 if zero_shot else 0)
        if every > 0:
            n += (real_steps - 1) // every
        return n

    def seconds(self, records, task, mode_name, steps, zero_shot):
        """Returns the predicted wall seconds of one run."""
        prior = self.priors[task]
        step_m, _, _ = self.measured(records, task, mode_name)
        step_t, eval_t, fixed_t = self.measured(records, task)
        step = step_m or step_t or prior["step_seconds"]
        ev = eval_t or prior["eval_seconds"]
        fixed = fixed_t if fixed_t is not None else prior["fixed_seconds"]
        real_steps = self.plan["quick"]["steps"] if self.quick else steps
        return fixed + real_steps * step + self.evaluations(task, steps, zero_shot) * ev


def minutes(seconds):
    """Formats a duration: seconds below 90 s, else minutes with one decimal."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min"


# ----------------------------------------------------------------------------------------
# results.md


def best_record(records, task, mode_name, steps):
    """Returns the run of a task, mode and budget with the lowest final eval loss, or None."""
    rs = [r for r in records if r["task"] == task and r["mode_name"] == mode_name
          and r["steps_budget"] == steps and r.get("final_eval_loss") is not None]
    return min(rs, key=lambda r: r["final_eval_loss"]) if rs else None


def fmt(value, spec=".4f", missing="—"):
    """Formats a number, or returns missing for None / NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, spec)


def fmt_bytes(n):
    """Formats a byte count in MB (10^6), GB above 10^4 MB."""
    if n is None:
        return "—"
    if n >= 1e10:
        return f"{n / 1e9:.2f} GB"
    return f"{n / 1e6:.1f} MB"


def zero_shot_measured(out_dir, task):
    """Tells whether any finished run of a task under OUT/runs measured its zero-shot
    evaluation, whether or not --only selects it (its summary.json or imported record has
    zero_shot_eval_loss)."""
    runs_root = os.path.join(out_dir, "runs")
    if not os.path.isdir(runs_root):
        return False
    for name in os.listdir(runs_root):
        if not name.startswith(task + "-"):
            continue
        for file in ("summary.json", IMPORTED_RECORD):
            path = os.path.join(runs_root, name, file)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    try:
                        if json.load(f).get("zero_shot_eval_loss") is not None:
                            return True
                    except (ValueError, AttributeError):
                        pass  # a summary being written, or not an object: not this run's
    return False


def task_zero_shot(records, task):
    """Returns the zero-shot (eval loss, metric, perplexity) of a task from the run that
    measured it, or Nones."""
    for r in records:
        if r["task"] == task and r.get("zero_shot_eval_loss") is not None:
            return r["zero_shot_eval_loss"], r.get("zero_shot_metric"), r.get("zero_shot_perplexity")
    return None, None, None


def results_table(records, task, steps, mode_order, label):
    """Returns the markdown lines of one task's table at one step budget (best lr marked *)."""
    _, _, ppl0 = task_zero_shot(records, task)
    lines = [f"| mode | lr | final eval loss | {label} | Moby-Dick ppl before -> after | "
             "offload / step | optimizer state | peak RSS | step s | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    rows = [r for r in records if r["task"] == task and r["steps_budget"] == steps]
    rows.sort(key=lambda r: (mode_order.index(r["mode_name"]), r["lr"]))
    for r in rows:
        best = best_record(records, task, r["mode_name"], steps)
        mark = " *" if best is r else ""
        before = r.get("zero_shot_perplexity") or ppl0
        lines.append(
            f"| {r['mode_name']} | {format_lr(r['lr'])}{mark} | {fmt(r['final_eval_loss'])} | "
            f"{fmt(r['final_metric'], '.3f')} | {fmt(before, '.1f')} -> {fmt(r['final_perplexity'], '.1f')} | "
            f"{fmt_bytes(r['offload_bytes_per_step'])} | {fmt_bytes(r['optimizer_state_bytes'])} | "
            f"{fmt_bytes(r['peak_rss_bytes'])} | {fmt(r['mean_step_seconds'], '.2f')} | "
            f"{fmt(r.get('process_seconds') or r.get('wall_seconds'), '.0f')} |")
    return lines


def best_evaluation(records, task, mode_name, steps):
    """Returns (record, evaluation) of the lowest-loss evaluation after step 0 over every run of
    a task, mode and budget (any lr): the checkpoint early stopping on the eval loss would keep
    (HF Trainer's load_best_model_at_end with metric_for_best_model="eval_loss"), or None."""
    best = None
    for r in records:
        if r["task"] != task or r["mode_name"] != mode_name or r["steps_budget"] != steps:
            continue
        for p in r.get("curve") or []:
            if p.get("step") and p.get("loss") is not None and (best is None or p["loss"] < best[1]["loss"]):
                best = (r, p)
    return best


def early_stopping_lines(records, task, ref_name, cand_name, steps, metric, label, v):
    """Returns the verdict lines comparing the candidate's and the reference's best evaluation
    along their curves at a budget (early stopping), against the same targets as the final one.
    metric is the task's metric key in the curve points (accuracy or f1), label its name."""
    ref, cand = best_evaluation(records, task, ref_name, steps), best_evaluation(records, task, cand_name, steps)
    head = f"- {cand_name} vs {ref_name} at {steps} steps, best evaluation along the curve (early stopping)"
    if ref is None or cand is None:
        return []
    (rr, rp), (cr, cp) = ref, cand
    out = []
    if cp.get(metric) is not None and rp.get(metric) is not None:
        drop = rp[metric] - cp[metric]
        out.append(f"{head}, {label}: {'PASS' if drop <= v['max_metric_drop'] + 1e-12 else 'MISS'}: "
                   f"{cp[metric]:.3f} (lr {format_lr(cr['lr'])}, step {cp['step']}) vs {rp[metric]:.3f} "
                   f"(lr {format_lr(rr['lr'])}, step {rp['step']}), {-100 * drop:+.1f} points")
    ratio = cp["loss"] / rp["loss"]
    out.append(f"{head}, eval loss: {'PASS' if ratio <= v['max_loss_ratio'] + 1e-12 else 'MISS'}: "
               f"{cp['loss']:.4f} vs {rp['loss']:.4f}, {100 * (ratio - 1):+.1f}%")
    return out


def verdict_lines(plan, records, task, label):
    """Returns the markdown lines of a task's verdict against the issue's targets."""
    v = plan["verdict"]
    ref_name, cand_name = v["reference"], v["candidate"]
    modes = {m["name"]: m for m in plan["modes"]}
    long_budget = max(set(modes[ref_name]["steps"]) & set(modes[cand_name]["steps"]))
    lines = []
    ref = best_record(records, task, ref_name, long_budget)
    cand = best_record(records, task, cand_name, long_budget)
    head = f"- {cand_name} vs {ref_name} at {long_budget} steps (each at its best lr)"
    if ref is None or cand is None:
        missing = [n for n, r in ((ref_name, ref), (cand_name, cand)) if r is None]
        lines.append(f"{head}: not measured yet ({', '.join(missing)} missing)")
    else:
        if cand["final_metric"] is None or ref["final_metric"] is None:
            lines.append(f"{head}, {label}: not measured (the runs report no {label})")
        else:
            drop = ref["final_metric"] - cand["final_metric"]
            ok = drop <= v["max_metric_drop"] + 1e-12
            lines.append(f"{head}, {label}: {'PASS' if ok else 'MISS'}: {cand['final_metric']:.3f} "
                         f"(lr {format_lr(cand['lr'])}) vs {ref['final_metric']:.3f} "
                         f"(lr {format_lr(ref['lr'])}), {-100 * drop:+.1f} points "
                         f"(target >= {-100 * v['max_metric_drop']:.1f})")
        ratio = cand["final_eval_loss"] / ref["final_eval_loss"]
        ok = ratio <= v["max_loss_ratio"] + 1e-12
        lines.append(f"{head}, eval loss: {'PASS' if ok else 'MISS'}: {cand['final_eval_loss']:.4f} vs "
                     f"{ref['final_eval_loss']:.4f}, {100 * (ratio - 1):+.1f}% "
                     f"(target <= {100 * (v['max_loss_ratio'] - 1):+.0f}%)")
    lines += early_stopping_lines(records, task, ref_name, cand_name, long_budget,
                                  plan["tasks"][task]["metric"], label, v)
    for base_name in v["baselines"]:
        for steps in sorted(set(modes[base_name]["steps"]) & set(modes[cand_name]["steps"])):
            b = best_record(records, task, base_name, steps)
            c = best_record(records, task, cand_name, steps)
            head = f"- {cand_name} at least as good as {base_name} at {steps} steps ({label})"
            if b is None or c is None:
                missing = [n for n, r in ((base_name, b), (cand_name, c)) if r is None]
                lines.append(f"{head}: not measured yet ({', '.join(missing)} missing)")
                continue
            if b["final_metric"] is None or c["final_metric"] is None:
                lines.append(f"{head}: not measured (the runs report no {label})")
                continue
            ok = c["final_metric"] >= b["final_metric"]
            lines.append(
                f"{head}: {'PASS' if ok else 'MISS'}: {c['final_metric']:.3f} vs {b['final_metric']:.3f} "
                f"({100 * (c['final_metric'] - b['final_metric']):+.1f} points); eval loss "
                f"{c['final_eval_loss']:.4f} vs {b['final_eval_loss']:.4f}; offload/step "
                f"{fmt_bytes(c['offload_bytes_per_step'])} vs {fmt_bytes(b['offload_bytes_per_step'])}; "
                f"optimizer state {fmt_bytes(c['optimizer_state_bytes'])} vs "
                f"{fmt_bytes(b['optimizer_state_bytes'])}")
    mj = v.get("main_job")
    if mj and mj["task"] == task:
        # Each lsp mode at its best lr (by eval loss, as everywhere), not the best accuracy.
        lsp_runs = [best_record(records, task, m["name"], mj["steps"])
                    for m in plan["modes"] if m["mode"] == "lsp"]
        lsp_runs = [r for r in lsp_runs if r is not None and r.get("final_metric") is not None]
        if not lsp_runs:
            lines.append(f"- main job ({mj['accuracy']} at {mj['steps']} steps): no {mj['steps']}-step lsp "
                         "run with an accuracy yet")
        else:
            top = max(lsp_runs, key=lambda r: r["final_metric"])
            beats = top["final_metric"] > mj["accuracy"]
            lines.append(f"- main job ({mj['accuracy']} at {mj['steps']} steps): best {mj['steps']}-step lsp run "
                         f"{top['name']} reaches {top['final_metric']:.4f}: "
                         f"{'beats it' if beats else 'does not beat it'}")
    return lines


def curve_lines(records, task, steps, mode_order, metric):
    """Returns markdown lines with the evaluations (loss / metric / perplexity) per step of each
    mode's best-lr run at one budget: the curves of the study."""
    best = [best_record(records, task, m, steps) for m in mode_order]
    best = [b for b in best if b is not None]
    if not best:
        return []
    eval_steps = sorted({p["step"] for b in best for p in b["curve"] if p.get("step")})
    lines = ["| step | " + " | ".join(f"{b['mode_name']} ({format_lr(b['lr'])})" for b in best) + " |",
             "|---|" + "---|" * len(best)]
    z_loss, z_metric, z_ppl = task_zero_shot(records, task)
    if z_loss is not None:  # the same model before training for every mode
        cell = f"{fmt(z_loss, '.3f')} / {fmt(z_metric, '.3f')} / {fmt(z_ppl, '.1f')}"
        lines.append("| 0 (zero-shot) | " + " | ".join([cell] * len(best)) + " |")
    for st in eval_steps:
        cells = []
        for b in best:
            p = next((p for p in b["curve"] if p.get("step") == st), None)
            cells.append("" if p is None else
                         f"{fmt(p['loss'], '.3f')} / {fmt(p.get(metric), '.3f')} / {fmt(p.get('perplexity'), '.1f')}")
        lines.append(f"| {st} | " + " | ".join(cells) + " |")
    return lines


def write_results(path, plan, args, records, pending, failures, notes, remaining_s):
    """Rewrites results.md: per task and budget the runs, the best lr per mode, the verdict,
    the curves; then the runs not done, failures and notes."""
    mode_order = [m["name"] for m in plan["modes"]]
    budgets = sorted({s for m in plan["modes"] for s in m["steps"]})
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    out = [f"# Fidelity study results{' (--quick smoke test)' if args.quick else ''}", "",
           f"Plan `{os.path.relpath(args.plan, REPO)}`, written {now}. {len(records)} runs finished, "
           f"{len(pending)} not done" + (f" (about {minutes(remaining_s)} more)" if pending else "") + ".",
           "",
           "Columns: final eval loss on the task's test examples; the task metric of the final "
           "evaluation; Moby-Dick perplexity of the zero-shot model (measured once per task) and "
           "after training; bytes offloaded per step and optimizer-state bytes (summary.json); "
           "peak RSS = ru_maxrss of the lspctl process from os.wait4 (worker, optimizer and "
           "scheduler share it in embedded mode); mean step seconds; wall seconds of the lspctl "
           "process. `*` marks each mode's best lr (lowest final eval loss) at that budget.", ""]
    if args.quick:
        out += ["--quick: tiny random model on Moby-Dick text, a few steps: the numbers only show "
                "that every run works end to end.", ""]
    for task, t in plan["tasks"].items():
        label = METRIC_LABELS[t["metric"]]
        z_loss, z_metric, z_ppl = task_zero_shot(records, task)
        out += [f"## {task} ({label}; base spec `{t['spec']}`)", "",
                f"Zero-shot: eval loss {fmt(z_loss)}, {label} {fmt(z_metric, '.3f')}, "
                f"perplexity {fmt(z_ppl, '.1f')}.", ""]
        for steps in budgets:
            out += [f"### {steps} steps", ""]
            if any(r["task"] == task and r["steps_budget"] == steps for r in records):
                out += results_table(records, task, steps, mode_order, label) + [""]
                bests = [best_record(records, task, m, steps) for m in mode_order]
                out += ["Best lr per mode: " + ", ".join(
                    f"{b['mode_name']} {format_lr(b['lr'])} (loss {b['final_eval_loss']:.4f})"
                    for b in bests if b) + ".", ""]
                curves = curve_lines(records, task, steps, mode_order, t["metric"])
                if curves:
                    out += [f"Evaluations of each mode's best run (loss / {label} / perplexity):", ""]
                    out += curves + [""]
            else:
                out += ["Not measured yet.", ""]
        out += ["### Verdict", ""] + verdict_lines(plan, records, task, label) + [""]
    if pending:
        out += ["## Runs not done", ""]
        out += [f"- {name}: {why}" for name, why in pending] + [""]
    if failures:
        out += ["## Failed runs", ""]
        out += [f"- {name}: exit {rc}: `{msg}` (log {log})" for name, rc, msg, log in failures] + [""]
    if notes:
        out += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(out))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------
# The study


def parse_args(argv):
    """Parses the command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plan", default=os.path.join(REPO, "examples/fidelity/study/plan.yaml"),
                   help="study plan (default examples/fidelity/study/plan.yaml)")
    p.add_argument("--out", default=None,
                   help="output root (default runs/fidelity; with --quick runs/fidelity-quick)")
    p.add_argument("--budget-minutes", type=float, default=90,
                   help="start no run that would end past this many minutes (default 90)")
    p.add_argument("--only", action="append", default=[],
                   help="run only TASK/MODE (wildcards; a bare name matches a task or a mode); "
                        "repeatable or comma-separated")
    p.add_argument("--lspctl", default=LSPCTL,
                   help="the lspctl binary (default build/client/lspctl)")
    p.add_argument("--resume-from", action="append", default=[],
                   help="a results.jsonl of an earlier study (e.g. docs/fidelity/study-results.jsonl "
                        "from another machine): its finished runs count as done; repeatable")
    p.add_argument("--dry-run", action="store_true",
                   help="write the specs, print the plan and the time estimate, run nothing")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: tiny random model and text data, a few steps per run")
    args = p.parse_args(argv)
    args.only = [o for arg in args.only for o in arg.split(",") if o]
    if args.out is None:
        args.out = "runs/fidelity-quick" if args.quick else "runs/fidelity"
    args.plan = os.path.abspath(args.plan)
    return args


def main(argv):
    """Runs the study: plan, specs, runs within the budget, results after every run."""
    args = parse_args(argv)
    os.chdir(REPO)
    plan = load_yaml(args.plan)
    check_plan(plan)
    out_dir = args.out
    os.makedirs(os.path.join(out_dir, "specs"), exist_ok=True)
    for path in args.resume_from:
        print(f"fidelity_study: imported {import_records(out_dir, path)} finished runs from {path}")
    runs = planned_runs(plan, args.only)
    if not runs:
        sys.exit("fidelity_study: no run of the plan matches --only " + ",".join(args.only))
    metric_of = {t: plan["tasks"][t]["metric"] for t in plan["tasks"]}
    model = TimeModel(plan, args.quick)
    results_jsonl = os.path.join(out_dir, "results.jsonl")
    results_md = os.path.join(out_dir, "results.md")

    def finished_records():
        """Records of every planned run that has a summary (long runs at whichever lr ran)."""
        recs, seen = [], set()
        for r in runs:
            name = r.get("name")
            if r["lr"] is None or r.get("long"):
                name = find_long_run(out_dir, r["task"], r["mode"]["name"], r["steps"],
                                     long_lrs_of(r["mode"], r["task"]))
            elif name is None:
                name = run_name(r["task"], r["mode"]["name"], r["steps"], r["lr"])
            if name and name not in seen and is_done(out_dir, name):
                seen.add(name)
                rec = collect_record(out_dir, dict(r, name=name), metric_of[r["task"]])
                rec["steps_budget"] = r["steps"]
                recs.append(rec)
        return recs

    records = finished_records()
    logged = {row.get("name") for row in read_jsonl(results_jsonl)}
    with open(results_jsonl, "a", encoding="utf-8") as f:  # runs finished before a crash
        for rec in records:
            if rec["name"] not in logged:
                f.write(json.dumps(rec) + "\n")

    def resolve(r):
        """Fills a run's lr (long runs: the best lr so far, or the one that already ran) and
        name; returns the run."""
        if r["lr"] is None or r.get("long"):
            r["long"] = True
            done = find_long_run(out_dir, r["task"], r["mode"]["name"], r["steps"],
                                 long_lrs_of(r["mode"], r["task"]))
            r["lr"] = lr_from_name(done) if done else choose_long_lr(records, r["task"], r["mode"])
        r["name"] = run_name(r["task"], r["mode"]["name"], r["steps"], r["lr"])
        return r

    def zero_shot_needed(task, taken):
        """Tells whether the next run of a task must measure the zero-shot evaluation (no
        finished run of the task has it, planned or left out by --only)."""
        return not zero_shot_measured(out_dir, task) and task not in taken

    bracketed = {}  # run name -> why the bracket rule leaves it out

    def schedule():
        """Returns the runs still to do with their predicted seconds, in start order (a sweep
        run the bracket rule leaves out goes into `bracketed` instead)."""
        todo, taken, names = [], set(), set()
        for r in runs:
            resolve(r)
            if is_done(out_dir, r["name"]) or r["name"] in names:
                continue  # done, or a fixed long lr that is also the chosen one
            why = bracket_skip(records, r)
            if why:
                bracketed[r["name"]] = why
                continue
            bracketed.pop(r["name"], None)
            names.add(r["name"])
            zs = zero_shot_needed(r["task"], taken)
            taken.add(r["task"])
            todo.append((r, zs, model.seconds(records, r["task"], r["mode"]["name"], r["steps"], zs)))
        return todo

    todo = schedule()
    total = sum(s for _, _, s in todo)
    print(f"fidelity_study: plan {os.path.relpath(args.plan, REPO)}, {len(runs)} runs, "
          f"{len(runs) - len(todo) - len(bracketed)} already done, {len(bracketed)} not needed "
          f"(sweep bracketed), {len(todo)} to do; output {out_dir}/")
    for name, why in bracketed.items():
        print(f"  not needed: {name}: {why}")
    print(f"{'#':>3} {'run':<36} {'mode':<7} {'steps':>5} {'lr':>8} {'zero-shot':>9} {'est.':>9} {'cum.':>9}")
    cum, fit = 0.0, 0
    for i, (r, zs, s) in enumerate(todo, 1):
        cum += s
        fit += cum <= args.budget_minutes * 60
        flag = "" if cum <= args.budget_minutes * 60 else "  (past the budget)"
        print(f"{i:>3} {r['name']:<36} {r['mode']['mode']:<7} {r['steps']:>5} {format_lr(r['lr']):>8} "
              f"{'yes' if zs else 'no':>9} {minutes(s):>9} {minutes(cum):>9}{flag}")
        write_spec(build_spec(plan, r, out_dir, args.quick, zs),
                   os.path.join(out_dir, "specs", r["name"] + ".yaml"))
    print(f"fidelity_study: estimated {minutes(total)} for all {len(todo)} runs "
          f"({'measured' if records else 'plan priors'}: "
          + "; ".join(f"{t} {model.measured(records, t)[0] or model.priors[t]['step_seconds']:.2f} s/step"
                      for t in plan["tasks"])
          + f"); the {args.budget_minutes:g}-minute budget holds the first {fit}")
    if args.dry_run:
        print(f"fidelity_study: --dry-run: specs in {out_dir}/specs/, nothing run")
        return 0
    if not os.access(args.lspctl, os.X_OK):
        sys.exit(f"fidelity_study: {args.lspctl} is missing: build it (scripts/build --target lspctl)")

    signal.signal(signal.SIGTERM, forward_sigterm)
    t_start = time.monotonic()
    failures, notes, attempted = [], [], set()
    first_measured = bool(records)
    while True:
        todo = [t for t in schedule() if t[0]["name"] not in attempted]
        if not todo:
            break
        elapsed = time.monotonic() - t_start
        # The first run (in order) that still fits into the budget.
        pick = None
        for r, zs, s in todo:
            if elapsed + s <= args.budget_minutes * 60:
                pick = (r, zs, s)
                break
        if pick is None:
            break
        r, zs, est = pick
        spec_path = os.path.join(out_dir, "specs", r["name"] + ".yaml")
        write_spec(build_spec(plan, r, out_dir, args.quick, zs), spec_path)
        log_path = os.path.join(out_dir, "logs", r["name"] + ".log")
        print(f"[{minutes(elapsed)}] {r['name']}: starting (estimate {minutes(est)}; log {log_path})",
              flush=True)
        attempted.add(r["name"])
        version = source_version()  # what lspctl was built from, taken before the run starts
        rc, secs, rss = run_job(args.lspctl, spec_path, run_dir(out_dir, r["name"]), log_path)
        os.makedirs(run_dir(out_dir, r["name"]), exist_ok=True)  # a job refused at once made none
        with open(os.path.join(run_dir(out_dir, r["name"]), "study.json"), "w", encoding="utf-8") as f:
            json.dump({"process_seconds": secs, "peak_rss_bytes": rss, "exit_code": rc,
                       "commit": version,
                       "spec": spec_path, "log": log_path}, f)
        if rc == 0 and is_done(out_dir, r["name"]):
            rec = collect_record(out_dir, r, metric_of[r["task"]])
            rec["steps_budget"] = r["steps"]
            records.append(rec)
            print(f"[{minutes(time.monotonic() - t_start)}] {r['name']}: done in {secs:.0f} s: "
                  f"eval loss {fmt(rec['final_eval_loss'])}, {metric_of[r['task']]} "
                  f"{fmt(rec['final_metric'], '.3f')}, {fmt(rec['mean_step_seconds'], '.2f')} s/step, "
                  f"peak RSS {fmt_bytes(rss)}", flush=True)
        else:
            msg = last_error(log_path)
            failures.append((r["name"], rc, msg, log_path))
            rec = {"name": r["name"], "task": r["task"], "mode_name": r["mode"]["name"],
                   "steps_budget": r["steps"], "lr": r["lr"], "status": "failed", "exit_code": rc,
                   "error": msg, "log": log_path, "spec": spec_path}
            print(f"[{minutes(time.monotonic() - t_start)}] {r['name']}: FAILED (exit {rc}): {msg}",
                  flush=True)
        with open(results_jsonl, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")
        left = [t for t in schedule() if t[0]["name"] not in attempted]
        left_s = sum(s for _, _, s in left)
        if not first_measured and rec["status"] == "done":
            first_measured = True
            all_s = sum(model.seconds(records, x["task"], x["mode"]["name"], x["steps"], False)
                        for x in runs)
            print(f"fidelity_study: measured {rec['mean_step_seconds']:.2f} s/step on {r['task']}: "
                  f"the whole plan would take about {minutes(all_s)}, "
                  f"{minutes(left_s)} left for {len(left)} runs; budget {args.budget_minutes:g} min",
                  flush=True)
        pending = [(x["name"], "not started yet") for x, _, _ in left]
        pending += [(name, "not needed: " + why) for name, why in bracketed.items()]
        write_results(results_md, plan, args, records, pending, failures, notes, left_s)

    left = [t for t in schedule() if t[0]["name"] not in attempted]
    pending = [(r["name"], f"skipped: past the {args.budget_minutes:g}-minute budget "
                           f"(estimate {minutes(s)})") for r, _, s in left]
    pending += [(name, "not needed: " + why) for name, why in bracketed.items()]
    if left:
        notes.append(f"{len(left)} runs skipped by the time budget ({args.budget_minutes:g} min); "
                     "run scripts/fidelity again to continue (finished runs are kept).")
    write_results(results_md, plan, args, records, pending, failures, notes,
                  sum(s for _, _, s in left))
    print(f"fidelity_study: {len(records)} runs finished, {len(failures)} failed, {len(left)} skipped "
          f"by the budget, in {minutes(time.monotonic() - t_start)}; results in {results_md}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
