"""Shared by the Python client's tests: where the repository and the built binaries are, free
loopback ports, and the three services started as separate processes (as the systemd units
and tests/integration/multiprocess_test.cc start them).

Environment (python/tests/run_tests sets it): LSPO_BUILD_DIR (default: the repository's
build/), LSPO_LSPCTL (default: BUILD_DIR/client/lspctl).
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from typing import Dict, List, Optional

import grpc

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("LSPO_BUILD_DIR") or os.path.join(REPO, "build")
LSPCTL = os.environ.get("LSPO_LSPCTL") or os.path.join(BUILD, "client", "lspctl")
BINARIES = {
    "worker": os.path.join(BUILD, "gpu_worker", "lsp_gpu_worker"),
    "optimizer": os.path.join(BUILD, "cpu_optimizer_service", "lsp_cpu_optimizer"),
    "scheduler": os.path.join(BUILD, "scheduler", "lsp_scheduler"),
}
MODEL = os.path.join(REPO, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
MAIN_JOB = "examples/smollm2-sms-spam.yaml"
TINY_JOB = "examples/tiny-moby-dick.yaml"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_binaries() -> List[str]:
    """The service binaries and lspctl that are not built."""
    return [p for p in [*BINARIES.values(), LSPCTL] if not os.access(p, os.X_OK)]


def wait_ready(address: str, seconds: float = 60.0, local_credentials: bool = False,
               tls_ca: Optional[str] = None) -> None:
    """Waits until a gRPC server answers at `address` (raises TimeoutError); with `tls_ca`,
    one that serves TLS with a certificate of that CA; with `local_credentials`, one that
    serves gRPC's local credentials (a token and no TLS)."""
    if tls_ca:
        with open(tls_ca, "rb") as f:
            ch = grpc.secure_channel(address, grpc.ssl_channel_credentials(f.read()))
    elif local_credentials:
        ch = grpc.secure_channel(address, grpc.local_channel_credentials())
    else:
        ch = grpc.insecure_channel(address)
    with ch:
        try:
            grpc.channel_ready_future(ch).result(timeout=seconds)
        except grpc.FutureTimeoutError:
            raise TimeoutError(f"nothing answers at {address} after {seconds} s") from None


class Services:
    """lsp_gpu_worker, lsp_cpu_optimizer and lsp_scheduler on free loopback ports, started
    from the repository root (relative spec paths resolve there), logs and default job
    outputs (--runs_root) in a temporary folder. `scheduler_args` are added to the
    scheduler's command line; `peers=False` starts the scheduler alone."""

    def __init__(self, scheduler_args: Optional[List[str]] = None, peers: bool = True,
                 tls_ca: Optional[str] = None) -> None:
        self.tmp = tempfile.mkdtemp(prefix="lspo-pytest-")
        self.runs = os.path.join(self.tmp, "runs")
        self.procs: Dict[str, subprocess.Popen] = {}
        self.address = f"127.0.0.1:{free_port()}"
        w, o = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        try:
            if peers:
                self._start("worker", [f"--listen={w}"])
                self._start("optimizer", [f"--listen={o}"])
                wait_ready(w)
                wait_ready(o)
            self._start("scheduler", [f"--listen={self.address}", f"--worker={w}",
                                      f"--optimizer={o}", f"--runs_root={self.runs}",
                                      "--rpc_deadline_seconds=120", *(scheduler_args or [])])
            token = any(a.startswith("--auth_token_file") for a in scheduler_args or [])
            wait_ready(self.address, local_credentials=token, tls_ca=tls_ca)
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, args: List[str]) -> None:
        log = open(os.path.join(self.tmp, f"{name}.log"), "wb")
        self.procs[name] = subprocess.Popen([BINARIES[name], *args], cwd=REPO, stdout=log,
                                            stderr=subprocess.STDOUT)
        log.close()

    def log_tail(self, name: str, lines: int = 20) -> str:
        """The last lines of a service's log (for failure messages)."""
        try:
            with open(os.path.join(self.tmp, f"{name}.log"), errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Stops the services (SIGTERM, then SIGKILL after 20 s) and removes the folder."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


def tiny_spec(output_dir: str, steps: int = 3) -> Dict:
    """The smoke job (examples/tiny-moby-dick.yaml: a seeded tiny random Llama on Moby-Dick
    blocks) as a dict, `steps` steps, writing to `output_dir`."""
    return {
        "name": "py-tiny", "mode": "lsp",
        "model": {"format": "tiny-random", "tokenizer_path": MODEL, "init_seed": 1234},
        "data": {"format": "text",
                 "train_path": os.path.join(REPO, "datasets/moby-dick/moby-dick.txt"),
                 "eval_path": os.path.join(REPO, "datasets/moby-dick/moby-dick.txt"),
                 "max_blocks": 64, "max_eval_examples": 8},
        "lsp": {"d": 16, "r": 4, "fit_iters": 10, "calibration_examples": 8},
        "optim": {"lr": 0.05}, "steps": steps, "micro_batch_size": 4, "seq_len": 32,
        "seed": 7, "output_dir": output_dir,
    }
