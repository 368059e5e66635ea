"""What the package does through the `lspctl` binary: plan(), run(), and finding lspctl.

`lspctl plan` and `lspctl run` have no RPC behind them (the plan is computed by the client
from the model's config; `run` starts the three services inside the lspctl process), so these
functions run lspctl as a subprocess, with the spec written to a temporary file when it is not
one already.
"""
import os
import re
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, TextIO, overload

from lspo.errors import JobFailedError, LspoError
from lspo.spec import Overrides, SpecLike, override_args, spec_file

# Where a repository checkout keeps the CMake-built binary (README, "Builds").
_BUILD_PATH = Path("build") / "client" / "lspctl"


@overload
def find_lspctl(lspctl: Optional[str] = None) -> str: ...


@overload
def find_lspctl(lspctl: Optional[str] = None, *, required: bool) -> Optional[str]: ...


def find_lspctl(lspctl: Optional[str] = None, *, required: bool = True) -> Optional[str]:
    """The lspctl binary to run: `lspctl` when given, else $LSPO_LSPCTL, else `lspctl` on
    PATH, else build/client/lspctl of a repository checkout that holds the current folder or
    this package.

    Raises LspoError when none is found, unless `required` is False (then returns None), and
    always when `lspctl` or $LSPO_LSPCTL names something that is not an executable file.
    """
    for given in (lspctl, os.environ.get("LSPO_LSPCTL")):
        if given:
            if os.path.isfile(given) and os.access(given, os.X_OK):
                return os.path.abspath(given)
            raise LspoError(f"lspctl '{given}' is not an executable file")
    on_path = shutil.which("lspctl")
    if on_path:
        return on_path
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for d in (start, *start.parents):
            candidate = d / _BUILD_PATH
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    if not required:
        return None
    raise LspoError("cannot find lspctl: pass lspctl=PATH, set LSPO_LSPCTL, put it on PATH, or "
                    "run from a repository checkout with build/client/lspctl (scripts/build)")


def _failure(stderr: str, what: str) -> str:
    """lspctl's own error lines ("lspctl: ...") from `stderr`, else its last lines."""
    lines = [ln[len("lspctl: "):] for ln in stderr.splitlines() if ln.startswith("lspctl: ")]
    if not lines:
        lines = [ln for ln in stderr.splitlines() if ln.strip()][-5:]
    return f"{what}: " + ("; ".join(lines) if lines else "no output")


@dataclass
class PlanRow:
    """One line of the plan's table: the MiB of one term in every mode (None where the term
    does not apply, "-" in lspctl's table).

    Attributes:
        section: the block it is in ("worker, GPU memory", "optimizer service (host)"; ""
            for the lines of their own: "shared-memory arena ...", "moved per step, ...").
        label: the term, as lspctl prints it ("trained weights (bf16)", "peak: ...").
        mib: {mode: MiB or None}.
    """

    section: str
    label: str
    mib: Dict[str, Optional[float]]


@dataclass
class Plan:
    """The memory plan of a job in every mode (`lspctl plan`).

    Attributes:
        text: lspctl's whole output.
        modes: the modes of the table, in its order ("lsp", "zero", "native", ...).
        job_mode: the job's own mode (marked * by lspctl).
        rows: the table's lines with numbers.
        fits: {mode: whether the job fits the device} when a device size was given, else {}.
        verdicts: {mode: lspctl's line on that device} ("fits: peak 1.87 GiB; largest ...").
    """

    text: str
    modes: List[str] = field(default_factory=list)
    job_mode: str = ""
    rows: List[PlanRow] = field(default_factory=list)
    fits: Dict[str, bool] = field(default_factory=dict)
    verdicts: Dict[str, str] = field(default_factory=dict)

    def peak_mib(self, mode: Optional[str] = None) -> Optional[float]:
        """The worker's peak memory in MiB of `mode` (default: the job's mode): the table's
        "peak" line; None when the plan has no such line or mode."""
        mode = mode or self.job_mode
        for row in self.rows:
            if row.label.startswith("peak"):
                return row.mib.get(mode)
        return None


_NUMBER = re.compile(r"^-?\d+(\.\d+)?$")


def parse_plan(text: str) -> Plan:
    """Reads `lspctl plan`'s output into a Plan (the text is kept whole in Plan.text)."""
    plan = Plan(text=text)
    section = ""
    for line in text.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "MiB" and not plan.modes:
            names = words[1:]
            for k, name in enumerate(names):
                if name == "*":
                    plan.job_mode = names[k - 1]
            plan.modes = [n for n in names if n != "*"]
            continue
        if not plan.modes:
            continue
        n = len(plan.modes)
        tail = words[-n:]
        if len(words) > n and all(w == "-" or _NUMBER.match(w) for w in tail):
            values = [None if w == "-" else float(w) for w in tail]
            cut = re.match(r"^\s*(.*?)" + r"\s+\S+" * n + r"\s*$", line)
            label = cut.group(1) if cut else line.strip()
            if not line.startswith(" "):  # a line of its own after the blocks
                section = ""
            plan.rows.append(PlanRow(section, label, dict(zip(plan.modes, values))))
            continue
        m = re.match(r"^\s+(\S+)(?:\s+\*)?\s+(fits|does not fit): (.*)$", line)
        if m and m.group(1) in plan.modes:
            plan.fits[m.group(1)] = m.group(2) == "fits"
            plan.verdicts[m.group(1)] = f"{m.group(2)}: {m.group(3)}"
            continue
        if not line.startswith(" ") and not line.startswith("on a "):
            section = line.strip()
    return plan


def plan(spec: SpecLike, *, device: str = "", device_memory_gb: float = 0.0,
         overrides: Overrides = (), lspctl: Optional[str] = None,
         cwd: Optional[str] = None, timeout: float = 300.0) -> Plan:
    """The memory plan of `spec` in every mode, as `lspctl plan` computes it from the model's
    config alone (no weight is read).

    Args:
        spec: a JobSpec, a dict, a YAML/JSON file path or YAML/JSON text (lspo.spec).
        device: "cpu" or "cuda" ("" = the spec's device).
        device_memory_gb: a device size in GiB: then Plan.fits says, per mode, whether the job
            fits it (0 = the plan only).
        overrides: KEY=VALUE spec overrides, as lspctl takes them (docs/spec.md).
        lspctl: the lspctl binary (find_lspctl's search when None).
        cwd: the folder the spec's relative paths resolve against (default: the current one).
        timeout: seconds before lspctl is stopped.
    Raises:
        LspoError: lspctl is not found, or refuses the spec (the message is lspctl's).
    """
    exe = find_lspctl(lspctl)
    with spec_file(spec) as path:
        args = [exe, "plan", f"--spec={path}", *override_args(overrides)]
        if device:
            args.append(f"--device={device}")
        if device_memory_gb:
            args.append(f"--device_memory_gb={device_memory_gb}")
        try:
            out = subprocess.run(args, cwd=cwd, capture_output=True, text=True,
                                 timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise LspoError(f"lspctl plan did not finish within {timeout} s") from e
    if out.returncode != 0:
        raise LspoError(_failure(out.stderr, "lspctl plan"))
    return parse_plan(out.stdout)


@dataclass
class RunResult:
    """The outcome of run().

    Attributes:
        state: the job's final state ("SUCCEEDED", "FAILED", "CANCELLED"; "" when lspctl
            stopped before the job was submitted).
        job_id: the embedded scheduler's id of the job.
        output_dir: the job's output folder, absolute ("" when lspctl reports none).
        returncode: lspctl's exit status (0 = SUCCEEDED, 1 = failed or cancelled, 2 = usage).
        output: everything lspctl printed (stdout and stderr together).
    """

    state: str
    job_id: str
    output_dir: str
    returncode: int
    output: str


def run(spec: SpecLike, *, overrides: Overrides = (), output_dir: Optional[str] = None,
        mode: Optional[str] = None, steps: Optional[int] = None,
        extra_args: Sequence[str] = (), lspctl: Optional[str] = None,
        cwd: Optional[str] = None, echo: Optional[TextIO] = None,
        timeout: Optional[float] = None, check: bool = True) -> RunResult:
    """Trains `spec` in embedded mode: `lspctl run`, which starts the scheduler, the worker
    and the optimizer service inside one process, and waits for the job to end.

    Args:
        spec: a JobSpec, a dict, a YAML/JSON file path or YAML/JSON text (lspo.spec).
        overrides: KEY=VALUE spec overrides (a field path or an alias: docs/spec.md).
        output_dir, mode, steps: lspctl's --output_dir, --mode and --steps.
        extra_args: more lspctl flags (e.g. ["--verbose"]).
        lspctl: the lspctl binary (find_lspctl's search when None).
        cwd: the folder the spec's relative paths resolve against (default: the current one).
        echo: a stream to copy lspctl's output to while it runs (e.g. sys.stdout); None keeps
            it quiet (RunResult.output has it either way).
        timeout: seconds before lspctl is stopped (None = no limit).
        check: raise when the job does not succeed.
    Raises:
        LspoError: lspctl is not found, refuses the spec, or is stopped by `timeout`.
        JobFailedError: with `check`, the job ended FAILED or CANCELLED.
    """
    exe = find_lspctl(lspctl)
    with spec_file(spec) as path:
        args = [exe, "run", f"--spec={path}", *override_args(overrides), *extra_args]
        if output_dir:
            args.append(f"--output_dir={output_dir}")
        if mode:
            args.append(f"--mode={mode}")
        if steps:
            args.append(f"--steps={steps}")
        chunks: List[str] = []
        with subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace") as proc:
            timer = threading.Timer(timeout, proc.kill) if timeout else None
            if timer is not None:
                timer.start()
            try:
                assert proc.stdout is not None
                for line in proc.stdout:  # one line per step and phase when not on a tty
                    chunks.append(line)
                    if echo is not None:
                        echo.write(line)
                        echo.flush()
                proc.wait()
            except BaseException:
                # Interrupted (KeyboardInterrupt in a notebook): lspctl cancels the job on
                # SIGINT, as on Ctrl-C, and writes its report; wait for that.
                proc.send_signal(signal.SIGINT)
                proc.wait()
                raise
            finally:
                if timer is not None:
                    timer.cancel()
            if timer is not None and proc.returncode == -signal.SIGKILL:
                raise LspoError(f"lspctl run did not finish within {timeout} s")
    text = "".join(chunks)
    result = _parse_run(text, proc.returncode)
    if result.output_dir and not os.path.isabs(result.output_dir):
        result.output_dir = os.path.join(os.path.abspath(cwd or os.getcwd()), result.output_dir)
    if check and proc.returncode != 0:
        if result.state:
            raise JobFailedError(_failure(text, f"job {result.job_id} {result.state}"),
                                 result.state, result.output_dir)
        raise LspoError(_failure(text, "lspctl run"))
    return result


def _parse_run(text: str, returncode: int) -> RunResult:
    """The state, job id and output folder from `lspctl run`'s closing lines."""
    state = job_id = out = ""
    for line in text.splitlines():
        m = re.match(r"^job (\S+): ([A-Z_]+)$", line)
        if m:
            job_id, state = m.group(1), m.group(2)
        m = re.match(r"^output: (.*?) \(", line)
        if m:
            out = m.group(1)
    return RunResult(state, job_id, out, returncode, text)


__all__ = ["find_lspctl", "plan", "parse_plan", "Plan", "PlanRow", "run", "RunResult"]
