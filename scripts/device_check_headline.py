#!/usr/bin/env python3
"""The capacity headline runs of scripts/device-check (issue 42; Python standard library only).

The paper's headline, with the default settings plus a device memory cap: the
DeepSeek-Coder-1.3B shape (hidden 2048, 24 layers, 16 heads, intermediate 5504; lsp d 1280,
r 4) under 4096 MiB and the Llama-2-7B shape (hidden 4096, 32 layers, 32 heads, intermediate
11008; d 2048, r 8) under 24576 MiB, each in the modes lsp (default settings:
micro_batch_size, activation_checkpointing and lsp.apply_rounding unset), lsp-nearest
(lsp.apply_rounding nearest, the paper's rounding: run only where lsp with the default
rounding is refused by the plan), lora (bf16 LoRA r 8), native and zero. Random weights
(model.random_shape) with the SmolLM2 tokenizer: model.random_shape has no vocabulary or
tying field, so the runs' embedding is SmolLM2's 49152 rows, tied; the real configs (vocab
32256 / 32000, untied) are planned beside them (config.json only, no weights).

Before any run, `lspctl plan` plans each job on this card (--device=cuda): as written (what
the worker would choose for the unset settings, whether it fits) and again at the chosen
settings (micro-batch 1 with checkpointing where it does not fit). A job whose plan does not
fit is not run: it is "refused by plan" (the worker would refuse it before loading).

Used by scripts/device_check.py (specs, aggregate) and, as a command, by scripts/device-check:

  rusage FILE CMD...
      Runs CMD, writes FILE (JSON: ru_maxrss_bytes, the largest resident set of CMD and its
      descendants, and wall_seconds) and exits with CMD's status (128 + signal if killed).
"""
import concurrent.futures
import json
import os
import re
import resource
import subprocess
import sys
import time

# key -> what the shape is, HF sizes, lsp d and r, the cap's environment variable and default,
# the real config.json (planned only), and per mode the expected seconds / 10 on an
# H100/H200 host (the time budget's weight; not measured yet).
SHAPES = {
    "ds-1.3b": dict(
        label="DeepSeek-Coder-1.3B shape (hidden 2048, 24 layers, 16 heads, intermediate 5504)",
        hidden=2048, intermediate=5504, layers=24, heads=16, kv_heads=16, d=1280, r=4,
        cap_env="LSPO_DC_CAP_DS13_MB", cap=4096, order=1,
        weight={"lsp": 4, "lsp-nearest": 4, "lora": 2, "native": 3, "zero": 4},
        # deepseek-ai/deepseek-coder-1.3b-base (LlamaForCausalLM); its rope_scaling (linear,
        # factor 4) is left out: it changes no tensor's size.
        config={"vocab_size": 32256, "max_position_embeddings": 16384, "rms_norm_eps": 1e-6,
                "rope_theta": 100000.0, "bos_token_id": 32013, "eos_token_id": 32014}),
    "llama2-7b": dict(
        label="Llama-2-7B shape (hidden 4096, 32 layers, 32 heads, intermediate 11008)",
        hidden=4096, intermediate=11008, layers=32, heads=32, kv_heads=32, d=2048, r=8,
        cap_env="LSPO_DC_CAP_7B_MB", cap=24576, order=2,
        weight={"lsp": 14, "lsp-nearest": 14, "lora": 6, "native": 8, "zero": 14},
        config={"vocab_size": 32000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}),
}
# name, TrainingMode, plan column.
MODES = [("lsp", "MODE_LSP", "lsp"), ("lsp-nearest", "MODE_LSP", "lsp"),
         ("lora", "MODE_LORA", "lora"), ("native", "MODE_NATIVE", "native"),
         ("zero", "MODE_ZERO", "zero")]
DEFAULT_SHAPES = "ds-1.3b,llama2-7b"
DEFAULT_MODES = "lsp,lsp-nearest,lora,native,zero"
SEQ_LEN = 512
LORA_R = 8
MAX_MICRO_BATCH = 32  # offload::kMaxChosenMicroBatch: the data must hold this many per step
SMOKE_CARD_MIB = 81920  # --smoke plans for an 80 GiB card (the caps decide the budget)
NO_CUDA = "skipped (--smoke: no CUDA; planned only)"


def _env_list(name, default):
    v = os.environ.get(name, default)
    return [] if v.strip() in ("", "none") else [s for s in v.split(",") if s]


def _int_env(name, default):
    v = os.environ.get(name, "")
    return int(v) if v.strip() else default


def _hf_config(s):
    """The real model's config.json (what `lspctl plan` needs of a Hugging Face folder)."""
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
         "hidden_size": s["hidden"], "intermediate_size": s["intermediate"],
         "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
         "num_key_value_heads": s["kv_heads"], "tie_word_embeddings": False,
         "torch_dtype": "bfloat16"}
    c.update(s["config"])
    return c


def _spec(ctx, key, s, mode, enum, steps, cap, run_dir):
    name = f"{key}-{mode}"
    spec = {
        "name": f"device-check-{name}",
        "mode": enum,
        "model": {"format": "tiny-random", "tokenizer_path": ctx["tokenizer"], "init_seed": 1234,
                  "random_shape": {"hidden_size": s["hidden"],
                                   "intermediate_size": s["intermediate"],
                                   "num_hidden_layers": s["layers"],
                                   "num_attention_heads": s["heads"],
                                   "num_key_value_heads": s["kv_heads"]}},
        "data": {"format": "text", "train_path": ctx["data"],
                 "max_blocks": steps * MAX_MICRO_BATCH + ctx["calib"] + 8},
        "optim": {"lr": 1.0e-4},
        "steps": steps,
        "seq_len": SEQ_LEN,
        "seed": 7,
        "device": "cuda",
        "device_memory_limit_mb": cap,
        "skip_initial_eval": True,
        "skip_checkpoint": True,
        "output_dir": run_dir,
    }
    if enum == "MODE_LSP":
        spec["lsp"] = {"d": s["d"], "r": s["r"], "fit_iters": ctx["fit_iters"],
                       "calibration_examples": ctx["calib"],
                       "calibration_memory_mb": ctx["calib_mb"], "check_freq": 0}
        if mode == "lsp-nearest":
            spec["lsp"]["apply_rounding"] = "nearest"
    if enum == "MODE_LORA":
        spec["lora"] = {"r": LORA_R}
    return spec


def card_mib(value):
    """The card's memory in MiB from nvidia-smi's text, or SMOKE_CARD_MIB where unreadable."""
    try:
        return int(float(value)) if value and float(value) > 0 else SMOKE_CARD_MIB
    except ValueError:
        return SMOKE_CARD_MIB


def make_specs(ctx):
    """_make_specs, or no headline run (and a warning) where it fails: the speed runs of the
    same call must not depend on it."""
    try:
        return _make_specs(ctx)
    except Exception as e:  # noqa: BLE001 (any failure here leaves the headline runs out)
        print(f"device_check specs: the headline runs are left out: {type(e).__name__}: {e}",
              file=sys.stderr)
        return [], []


def _make_specs(ctx):
    """Writes the headline specs (and the real configs' specs, planned only), plans them with
    `lspctl plan` and returns (manifest runs, run lines): per run to execute (order, index,
    "name<TAB>weight<TAB>spec<TAB>output dir<TAB>arena bytes<TAB>cap MiB"), and a
    manifest entry per run (group "headline", its plans, and "status_without_run" for the
    runs that are not executed: refused by plan, skipped). ctx: out, spec_dir, smoke, data,
    tokenizer, fit_iters, calib, calib_mb, lspctl (or ""), card_mib, lib_path, write_spec."""
    shapes = [k for k in _env_list("LSPO_DC_HEADLINE", DEFAULT_SHAPES) if k in SHAPES]
    modes = _env_list("LSPO_DC_HEADLINE_MODES", DEFAULT_MODES)
    steps = _int_env("LSPO_DC_HEADLINE_STEPS", 4)
    runs = []
    for key in shapes:
        s = SHAPES[key]
        cap = _int_env(s["cap_env"], s["cap"])
        cfg_dir = os.path.join(ctx["out"], "headline", key + "-config")
        os.makedirs(cfg_dir, exist_ok=True)
        with open(os.path.join(cfg_dir, "config.json"), "w") as f:
            json.dump(_hf_config(s), f, indent=1)
        for mode, enum, column in MODES:
            if mode not in modes:
                continue
            name = f"{key}-{mode}"
            run_dir = os.path.join(ctx["out"], "runs", name)
            spec = _spec(ctx, key, s, mode, enum, steps, cap, run_dir)
            path = os.path.join(ctx["spec_dir"], name + ".yaml")
            ctx["write_spec"](path, f"{s['label']}, random weights, mode {mode}, "
                              f"device_memory_limit_mb {cap}", spec)
            real = dict(spec, model={"format": "hf", "path": cfg_dir})
            real_path = os.path.join(ctx["spec_dir"], name + "-real-config.yaml")
            ctx["write_spec"](real_path, f"{s['label']}, the real config (planned only)", real)
            runs.append(dict(name=name, model=key, model_label=s["label"], mode=mode,
                             group="headline", plan_column=column, spec=path,
                             real_config_spec=real_path, output_dir=run_dir,
                             shape=dict(hidden_size=s["hidden"],
                                        intermediate_size=s["intermediate"],
                                        num_hidden_layers=s["layers"],
                                        num_attention_heads=s["heads"],
                                        num_key_value_heads=s["kv_heads"]),
                             real_vocab_size=s["config"]["vocab_size"],
                             d=s["d"] if enum == "MODE_LSP" else 0,
                             r=s["r"] if enum == "MODE_LSP" else LORA_R if mode == "lora" else 0,
                             micro_batch_size=None, seq_len=SEQ_LEN, steps=steps,
                             weight=s["weight"][mode], device_memory_limit_mb=cap,
                             apply_rounding="nearest" if mode == "lsp-nearest" else "default",
                             order=s["order"]))
    _plan_all(ctx, runs)
    lines = []
    for i, run in enumerate(runs):
        why = _why_not_run(ctx, run, runs)
        if why:
            run["status_without_run"] = why
            continue
        arena = (run["plan"].get("at_choice") or {}).get("arena_mib") or 0
        lines.append((run["order"], i, f"{run['name']}\t{run['weight']}\t{run['spec']}\t"
                      f"{run['output_dir']}\t{int(arena * 2**20)}\t"
                      f"{run['device_memory_limit_mb']}"))
    return runs, lines


def _why_not_run(ctx, run, runs):
    """Why a headline run is not executed ("" = run it)."""
    if ctx["smoke"]:
        return NO_CUDA
    plan = run["plan"]
    if plan.get("error"):
        return f"not planned ({plan['error']})"
    if not plan["fits"]:
        return "refused by plan"
    if run["mode"] == "lsp-nearest":
        lsp = next((r for r in runs if r["model"] == run["model"] and r["mode"] == "lsp"), None)
        if lsp is not None and lsp["plan"].get("fits"):
            return "skipped (lsp with the default rounding fits the cap: that run measures lsp)"
    return ""


# ------------------------------------------------------------------------------------------
# lspctl plan.

_FIT = re.compile(r"^\s+(\S+)( \*)?\s+(fits|does not fit): peak ([\d.]+) GiB(.*)$")


def parse_plan(text):
    """`lspctl plan` text -> {columns, own, rows: {label: {column: MiB}}, fit: {column:
    {fits, peak_gib, line}}, choices: [the worker's choices]}. Rows keep their section:
    "optimizer service (host): total"."""
    out = {"columns": [], "own": None, "rows": {}, "fit": {}, "choices": [], "title": ""}
    section = ""
    in_table = False
    for line in text.splitlines():
        if line.startswith("memory plan of"):
            out["title"] = line
        if line.startswith("MiB "):
            toks = line.split()[1:]
            for t in toks:
                if t == "*":
                    out["own"] = out["columns"][-1]
                else:
                    out["columns"].append(t)
            in_table = True
            continue
        m = _FIT.match(line)
        if m:
            out["fit"][m.group(1)] = {"fits": m.group(3) == "fits",
                                      "peak_gib": float(m.group(4)), "line": line.strip()}
            continue
        if line.startswith("the worker would choose: "):
            out["choices"].append(line[len("the worker would choose: "):])
            continue
        if not in_table:
            continue
        if not line.strip():
            in_table = False
            continue
        n = len(out["columns"])
        toks = line.split()
        vals = toks[-n:] if len(toks) > n else []
        if not vals or not all(re.fullmatch(r"-|[\d.]+", v) for v in vals):
            section = line.strip() if not line.startswith(" ") else section
            continue
        label = " ".join(toks[:-n])
        if not line.startswith(" "):
            section = ""
        key = f"{section}: {label}" if section else label
        out["rows"][key] = {c: (None if v == "-" else float(v))
                            for c, v in zip(out["columns"], vals)}
    return out


def _row(plan, prefix, column):
    for label, vals in plan["rows"].items():
        if label.startswith(prefix) or label.split(": ", 1)[-1].startswith(prefix):
            return vals.get(column)
    return None


def _lspctl_plan(ctx, spec, overrides):
    env = dict(os.environ)
    if ctx.get("lib_path"):
        env["LD_LIBRARY_PATH"] = ctx["lib_path"] + (
            ":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    cmd = [ctx["lspctl"], "plan", f"--spec={spec}"] + overrides + [
        "--device=cuda", f"--device_memory_gib={ctx['card_mib'] / 1024:.3f}"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    return p.returncode, p.stdout + p.stderr, " ".join(cmd)


def plan_job(ctx, spec, column, log_path):
    """Plans one job twice (as written; at the settings the worker would choose, or at
    micro-batch 1 with checkpointing where it does not fit) and returns what the results
    keep: fits, the choice, the fit line, the peak and host terms (MiB) at the choice."""
    rc, text, cmd = _lspctl_plan(ctx, spec, [])
    log = [f"$ {cmd}\n{text}"]
    res = {"fits": False, "choices": [], "micro_batch_size": None,
           "activation_checkpointing": None}
    try:
        if rc != 0:
            last = text.strip().splitlines()[-1] if text.strip() else ""
            res["error"] = f"lspctl plan exited {rc}: {last}"
            return res
        p1 = parse_plan(text)
        res["choices"] = p1["choices"]
        fit = p1["fit"].get(column, {})
        res["fit_line"] = fit.get("line", "")
        mb = next((int(m.group(1)) for c in p1["choices"]
                   for m in [re.match(r"micro_batch_size: (\d+)", c)] if m), None)
        ckpt = any(c.startswith("activation checkpointing: on") for c in p1["choices"])
        res["fits"] = mb is not None or bool(fit.get("fits"))
        if not res["fits"]:
            mb, ckpt = 1, True  # the smallest plan: what it misses by
        res["micro_batch_size"] = mb or 8
        res["activation_checkpointing"] = ckpt
        rc, text, cmd = _lspctl_plan(ctx, spec, [f"micro_batch_size={res['micro_batch_size']}",
                                                 f"activation_checkpointing={str(ckpt).lower()}"])
        log.append(f"$ {cmd}\n{text}")
        if rc != 0:
            res["error"] = f"lspctl plan exited {rc} at the chosen settings"
            return res
        p2 = parse_plan(text)
        at = {k: _row(p2, prefix, column) for k, prefix in (
            ("device_peak_mib", "peak:"), ("worker_loading_host_mib", "worker host memory"),
            ("optimizer_host_mib", "optimizer service (host): total"),
            ("master_mib", "fp32 model"), ("subspace_adam_mib", "subspace Adam"),
            ("arena_mib", "shared-memory arena"))}
        # The process's host peak: the plan's own row where it has one, else the sum of its
        # host terms (lspctl run holds worker and optimizer in one process: an upper bound).
        hp = _row(p2, "host peak", column)
        at["host_peak_mib"] = hp if hp is not None else sum(
            at[k] or 0 for k in ("worker_loading_host_mib", "optimizer_host_mib", "arena_mib"))
        at["host_peak_basis"] = ("the plan's host peak row" if hp is not None else
                                 "worker while loading + optimizer total + arena")
        at["lora_device_peak_mib"] = _row(p2, "peak:", "lora")
        at["lsp_device_peak_mib"] = _row(p2, "peak:", "lsp")
        at["title"] = p2["title"]
        res["at_choice"] = at
        return res
    finally:
        with open(log_path, "w") as f:
            f.write("\n".join(log))


def _plan_all(ctx, runs):
    """Plans every run and its real config, in parallel (one lspctl process each)."""
    if not ctx.get("lspctl") or not os.access(ctx["lspctl"], os.X_OK):
        for run in runs:
            run["plan"] = run["real_config_plan"] = {"fits": False, "error": "no lspctl"}
        return
    plan_dir = os.path.join(ctx["out"], "plans")
    os.makedirs(plan_dir, exist_ok=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        jobs = {}
        for run in runs:
            for key, spec, suffix in (("plan", run["spec"], ""),
                                      ("real_config_plan", run["real_config_spec"], "-real")):
                jobs[(run["name"], key)] = pool.submit(
                    plan_job, ctx, spec, run["plan_column"],
                    os.path.join(plan_dir, run["name"] + suffix + ".txt"))
        for run in runs:
            for key in ("plan", "real_config_plan"):
                try:
                    run[key] = jobs[(run["name"], key)].result()
                except (OSError, subprocess.SubprocessError, ValueError) as e:
                    run[key] = {"fits": False, "error": str(e)}


# ------------------------------------------------------------------------------------------
# Results.

def read_rusage(run_dir):
    """ru_maxrss of the run's process in bytes (rusage.json of the `rusage` command), or None."""
    try:
        with open(os.path.join(run_dir, "rusage.json")) as f:
            return json.load(f).get("ru_maxrss_bytes")
    except (OSError, ValueError):
        return None


def _chosen(run_dir):
    """The micro-batch and checkpointing the job ran with, and the worker's choices."""
    out = {"micro_batch_size": None, "activation_checkpointing": None, "chosen_settings": []}
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            s = json.load(f)
        out.update({k: s.get(k) for k in ("micro_batch_size", "activation_checkpointing",
                                          "apply_rounding") if k in s})
        out["chosen_settings"] = list(s.get("chosen_settings") or [])
        return out
    except (OSError, ValueError):
        pass
    try:  # a job that did not finish: its settings_chosen lines
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            for line in f:
                if '"settings_chosen"' in line:
                    out["chosen_settings"].append(json.loads(line).get("setting", ""))
    except (OSError, ValueError):
        pass
    for c in out["chosen_settings"]:
        m = re.match(r"micro_batch_size: (\d+)", c)
        if m:
            out["micro_batch_size"] = int(m.group(1))
        if c.startswith("activation checkpointing: on"):
            out["activation_checkpointing"] = True
    return out


def annotate(res, run):
    """Adds a headline run's plans, chosen settings and refusal message to its result `res`
    (scripts/device_check.py aggregate's per-run dict)."""
    try:
        _annotate(res, run)
    except Exception as e:  # noqa: BLE001 (the run's own numbers are already in res)
        res["annotate_error"] = f"{type(e).__name__}: {e}"


def _annotate(res, run):
    for k in ("group", "plan", "real_config_plan", "device_memory_limit_mb", "apply_rounding",
              "real_vocab_size", "shape"):
        res[k] = run.get(k)
    res.update(_chosen(run["output_dir"]))
    run["apply_rounding"] = res["apply_rounding"]  # what it ran with, for the memory model
    if res["status"] == "refused by plan":  # by lspctl plan, or by the worker before loading
        res["refusal"] = next((line for line in res.get("log_tail", "").splitlines()
                               if "will not fit" in line),
                              (run.get("plan") or {}).get("fit_line", ""))


def _gib(mib=None, b=None):
    v = b / 2**30 if b is not None else mib / 1024 if mib is not None else None
    return "-" if v is None else f"{v:.2f}"


def _ratio(a, b):
    return a / b if a is not None and b else None


def _settings(mb, ckpt):
    return "-" if mb is None else f"mb {mb}, ckpt {'on' if ckpt else 'off'}"


def _targets(rows, cap):
    """The issue's targets for one shape's rows (dict by mode)."""
    def ok(m):
        """Whether mode m ran to the end."""
        return m in rows and rows[m]["status"] == "ok"
    lsp_run = "lsp" if ok("lsp") else "lsp-nearest" if ok("lsp-nearest") else None
    lsp, lora = rows.get(lsp_run or "lsp"), rows.get("lora")
    t = {"cap_mib": cap, "lsp_run": lsp_run}
    plan = (rows.get("lsp") or {}).get("plan") or {}
    t["planned_lsp_fits_with_micro_batch_ge_4"] = (
        bool(plan.get("fits")) and (plan.get("micro_batch_size") or 0) >= 4 if plan else None)
    # lsp / lora at the same settings (each lsp run's plan has a lora column beside it).
    t["planned_lsp_over_lora_peak_same_settings"] = {}
    for m in ("lsp", "lsp-nearest"):
        p = (rows.get(m) or {}).get("plan") or {}
        at = p.get("at_choice") or {}
        ratio = _ratio(at.get("lsp_device_peak_mib"), at.get("lora_device_peak_mib"))
        if ratio is not None:
            t["planned_lsp_over_lora_peak_same_settings"][m] = {
                "ratio": ratio, "at": _settings(p.get("micro_batch_size"),
                                                p.get("activation_checkpointing"))}
    if lsp_run:
        peak = lsp.get("peak_gpu_allocated_bytes")
        t["measured_fits_with_micro_batch_ge_4"] = (
            (lsp.get("micro_batch_size") or 0) >= 4 and peak is not None and peak <= cap * 2**20)
    if lsp_run and lora and lora["status"] == "ok":
        t["measured_lsp_over_lora_peak"] = _ratio(lsp.get("peak_gpu_allocated_bytes"),
                                                  lora.get("peak_gpu_allocated_bytes"))
        t["lsp_micro_batch"], t["lora_micro_batch"] = (lsp.get("micro_batch_size"),
                                                       lora.get("micro_batch_size"))
    for m in ("native", "zero"):
        if m in rows:
            r = rows[m]
            t[f"{m}_refused"] = (r["status"] == "refused by plan" or
                                 (r["status"] == NO_CUDA and not (r.get("plan") or {}).get("fits")))
    if lsp_run:
        a = (lsp.get("plan") or {}).get("at_choice") or {}
        terms = [a.get(k) for k in ("master_mib", "subspace_adam_mib", "arena_mib")]
        if None not in terms:
            t["host_target_bytes"] = 1.1 * sum(terms) * 2**20
            t["host_peak_over_target"] = _ratio(lsp.get("process_max_rss_bytes"),
                                                t["host_target_bytes"])
    return t


def _fmt(v, f=".2f"):
    return "-" if v is None else format(v, f)


def _yes(v):
    return "-" if v is None else "yes" if v else "no"


def report(runs):
    """(results.json's "headline" section, the printed lines) from the headline runs'
    results (after annotate); an error line instead where that fails."""
    if not runs:
        return {}, []
    try:
        return _report(runs)
    except Exception as e:  # noqa: BLE001 (results.json and the speed table come first)
        return {"error": f"{type(e).__name__}: {e}"}, [f"headline: no table ({e})"]


def _report(runs):
    head = ["shape", "mode", "cap MiB", "plan", "status", "planned GiB", "peak GiB",
            "host GiB (plan / worker / process)", "step s", "tok/s", "ran with"]
    table, section, lines = [head], {}, []
    for r in runs:
        p = r.get("plan") or {}
        at = p.get("at_choice") or {}
        verdict = ("not planned" if p.get("error") else
                   ("fits: " if p.get("fits") else "refused; at ") +
                   _settings(p.get("micro_batch_size"), p.get("activation_checkpointing")))
        ran = _settings(r.get("micro_batch_size"), r.get("activation_checkpointing"))
        if r.get("chosen_settings"):
            ran += " (chosen)"
        table.append([r["model"], r["mode"], str(r.get("device_memory_limit_mb")), verdict,
                      r["status"], _gib(mib=at.get("device_peak_mib")),
                      _gib(b=r.get("peak_gpu_allocated_bytes")),
                      f"{_gib(mib=at.get('host_peak_mib'))} / "
                      f"{_gib(b=r.get('worker_peak_rss_bytes'))} / "
                      f"{_gib(b=r.get('process_max_rss_bytes'))}",
                      _fmt(r.get("mean_step_seconds"), ".3f"),
                      _fmt(r.get("tokens_per_second"), ".0f"),
                      ran if r["status"] not in (NO_CUDA, "refused by plan") else "-"])
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines.append("headline (issue 42): default settings plus a device cap, random weights in "
                 "the shape, SmolLM2 vocabulary (49152, tied); planned GiB at the plan's "
                 "settings (the smallest where refused); host plan = worker while loading + "
                 "optimizer + arena (one process)")
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in table]
    for model in dict.fromkeys(r["model"] for r in runs):
        rows = {r["mode"]: r for r in runs if r["model"] == model}
        cap = next(iter(rows.values()))["device_memory_limit_mb"]
        t = _targets(rows, cap)
        real = []
        for mode, r in rows.items():
            rp = r.get("real_config_plan") or {}
            a = rp.get("at_choice") or {}
            real.append(f"{mode} " + ("not planned" if rp.get("error") else
                                      ("fits " if rp.get("fits") else "refused, ")
                                      + _settings(rp.get("micro_batch_size"),
                                                  rp.get("activation_checkpointing"))
                                      + f" {_gib(mib=a.get('device_peak_mib'))} GiB"))
        vocab = next(iter(rows.values())).get("real_vocab_size")
        lines.append(f"{model}, the real config by plan (vocab {vocab}, untied): "
                     + "; ".join(real))
        measured = (f"measured {t['lsp_run']} {_fmt(t.get('measured_lsp_over_lora_peak'))}x "
                    f"(micro-batch {t.get('lsp_micro_batch')} vs {t.get('lora_micro_batch')})"
                    if "measured_lsp_over_lora_peak" in t else "measured -")
        planned = ", ".join(f"{m} {_fmt(v['ratio'])}x at {v['at']}" for m, v in
                            t["planned_lsp_over_lora_peak_same_settings"].items()) or "-"
        lines.append(
            f"{model} targets under {cap} MiB: lsp (default settings) fits with micro-batch "
            f">= 4: plan {_yes(t['planned_lsp_fits_with_micro_batch_ge_4'])}, measured "
            f"{_yes(t.get('measured_fits_with_micro_batch_ge_4'))}"
            f"{' (' + t['lsp_run'] + ')' if t['lsp_run'] else ''}; lsp/lora r {LORA_R} peak "
            f"<= 1: plan {planned}; {measured}; native refused {_yes(t.get('native_refused'))}, "
            f"zero refused {_yes(t.get('zero_refused'))}; host peak / (master + subspace Adam"
            f" + arena) x 1.1 {_fmt(t.get('host_peak_over_target'))} (<= 1)")
        section[model] = {"runs": [r["name"] for r in rows.values()], "targets": t}
    bad = [r["name"] + ("" if k == "plan" else " (real config)") for r in runs
           for k in ("plan", "real_config_plan")
           if (r.get(k) or {}).get("error", "no lspctl") != "no lspctl"]
    if bad:  # scripts/device-check fails the call on this line
        lines.append(f"headline: {len(bad)} jobs could not be planned ({', '.join(bad)}; "
                     "detail/check/plans/)")
    return section, lines


def rusage_main(argv):
    """`rusage FILE CMD...`: runs CMD, writes FILE, returns CMD's exit status."""
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        rc = subprocess.call(argv[1:])
    except OSError as e:
        print(f"device_check_headline rusage: {e}", file=sys.stderr)
        rc = 127
    if rc < 0:
        rc = 128 - rc
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(argv[0], "w") as f:
        json.dump({"ru_maxrss_bytes": ru.ru_maxrss * 1024,
                   "wall_seconds": time.monotonic() - t0, "exit_status": rc}, f)
    return rc


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "rusage":
        sys.exit(rusage_main(sys.argv[2:]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
