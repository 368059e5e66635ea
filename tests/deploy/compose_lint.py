#!/usr/bin/env python3
"""Structural checks of the compose files (tests/deploy/compose_check.sh lint | lint-ranks).

  compose_lint.py services FILE   deploy/compose/docker-compose.yml: worker (profile cpu),
                                  worker-gpu (profile gpu), optimizer and scheduler; shared IPC
                                  optimizer -> either worker; the GPU reserved by worker-gpu only,
                                  which runs the GPU image (Dockerfile.gpu), the CPU services the
                                  CPU image; each profile (cpu, gpu) a valid project on its own
                                  (every depends_on / ipc target in it, no two services on one
                                  port: self-check, copies that break it must fail);
                                  health checks via `lspctl health`, loopback binding on the host
                                  network, scheduler flags; the bearer token (issue 43): the
                                  one-shot `token` service runs the script of
                                  deploy/systemd/lsp-offload-token.service (run here for real in
                                  a temporary directory), every other service gets
                                  --auth_token_file and starts after it (self-check: a copy
                                  without them must fail).
  compose_lint.py ranks FILE      deploy/compose/docker-compose.ranks.yml: ranks rank0..rankN-1,
                                  each `lspctl run` with its rank, rank 0's rendezvous and its
                                  own bind address, on an internal network only (the store and
                                  Gloo are unauthenticated); the spec they mount.
Both apply the same hardening to every service (hardening() below). Exit 0 and one PASS line,
or 1 and a FAIL line per finding. Needs python3-yaml.
"""
import copy
import os
import re
import stat
import subprocess
import sys
import tempfile

import yaml

STATE = "/var/lib/lsp-offload"
TOKEN = f"{STATE}/auth_token"
# The systemd unit that runs the same script, relative to the compose file.
TOKEN_UNIT = os.path.join("..", "systemd", "lsp-offload-token.service")


def hardening(name, svc, need):
    """What every service shares: no new privileges, no capabilities, not privileged, the state
    volume at /var/lib/lsp-offload, every other mount read-only."""
    need("no-new-privileges:true" in svc.get("security_opt", []), f"{name}: no no-new-privileges")
    need(svc.get("cap_drop") == ["ALL"], f"{name}: capabilities not dropped")
    need(not svc.get("privileged", False), f"{name}: privileged")
    vols = svc.get("volumes", [])
    need(any(v.split(":")[:2] == ["state", STATE] for v in vols),
         f"{name}: the state volume is not mounted at {STATE}")
    binds = [v.split(":") for v in vols if v.split(":")[0] != "state"]
    for parts in binds:
        need(parts[-1] == "ro", f"{name}: bind mount {':'.join(parts)} is not read-only")
    return binds


def run_token_script(script, need):
    """Runs the token script ("$$" is compose's and systemd's "$") with STATE moved to a
    temporary directory: a new token is 64 hex digits and a newline, mode 0600 (under umask
    022 too), kept by a second run, replaced when the file is empty, no temporary file left."""
    with tempfile.TemporaryDirectory() as d:
        sh = script.replace("$$", "$").replace(STATE, d)
        f = os.path.join(d, "auth_token")

        def run():
            r = subprocess.run(["sh", "-ec", sh], cwd=d, capture_output=True, text=True,
                               preexec_fn=lambda: os.umask(0o022))
            need(r.returncode == 0,
                 f"token: the script failed (exit {r.returncode}): {r.stderr.strip()}")
            return open(f).read() if os.path.exists(f) else ""

        first = run()
        need(re.fullmatch(r"[0-9a-f]{64}\n", first) is not None,
             f"token: the file holds {first!r}, not 64 hex digits and a newline")
        need(os.path.exists(f) and stat.S_IMODE(os.stat(f).st_mode) == 0o600,
             "token: the file is not mode 0600")
        need(run() == first, "token: a second run changed the token")
        open(f, "w").close()
        second = run()
        need(re.fullmatch(r"[0-9a-f]{64}\n", second) is not None and second != first,
             "token: an empty file was not replaced by a new token")
        need(sorted(os.listdir(d)) == ["auth_token"], f"token: files left: {sorted(os.listdir(d))}")


def lint_token(path, svcs, need):
    """The deployment's bearer token (issue 43): the one-shot `token` service writes it into
    the state volume, and every other service is given it and starts after it; otherwise any
    local user could call the worker's and the optimizer's RPCs on 127.0.0.1."""
    t = svcs.get("token")
    need(t is not None, "no `token` service (the one-shot that writes the bearer token)")
    if t is not None:
        cmd = t.get("command", [])
        need(cmd[:2] == ["sh", "-ec"] and len(cmd) == 3 and f"f={TOKEN};" in cmd[2],
             f"token: command is not [sh, -ec, 'f={TOKEN}; ...']: {cmd}")
        need(t.get("restart", "no") == "no", f"token: restart is {t.get('restart')!r} (a one-shot)")
        need(t.get("network_mode") == "none" and "ports" not in t, "token: has a network")
        need(t.get("read_only") is True, "token: root file system not read-only")
        need(f"state:{STATE}" in t.get("volumes", []),
             f"token: the state volume is not mounted writable at {STATE} (it writes {TOKEN})")
        unit = os.path.normpath(os.path.join(os.path.dirname(path), TOKEN_UNIT))
        if os.path.isfile(unit):
            m = re.search(r"^ExecStart=/bin/sh -ec '(.*)'$", open(unit).read(), re.M)
            need(m is not None and len(cmd) == 3 and m.group(1) == cmd[2],
                 f"token: its script differs from the one of {unit}")
        else:
            need(False, f"token: no {unit} to compare its script with")
        if len(cmd) == 3:
            run_token_script(cmd[2], need)
    for name, s in svcs.items():
        if name == "token":
            continue
        need(f"--auth_token_file={TOKEN}" in s.get("command", []),
             f"{name}: command lacks --auth_token_file={TOKEN} (any local user could call it)")
        dep = s.get("depends_on") or {}
        need(isinstance(dep, dict) and (dep.get("token") or {}).get("condition")
             == "service_completed_successfully",
             f"{name}: does not depend on token: {{condition: service_completed_successfully}}")


CPU_DOCKERFILE = "deploy/compose/Dockerfile"
GPU_DOCKERFILE = "deploy/compose/Dockerfile.gpu"
PROFILES = ("cpu", "gpu")


def gpu_devices(svc):
    return [d for d in svc.get("deploy", {}).get("resources", {}).get("reservations", {})
            .get("devices", []) if "gpu" in d.get("capabilities", [])]


def lint_profiles(svcs, need):
    """Each profile is a project of its own: `docker compose --profile P` enables the services
    without profiles and those listing P, and refuses the file ("depends on undefined service")
    when one of them depends on, or shares the IPC namespace of, a service that P leaves out.
    Two services of one profile must not listen on the same address (both are on the host
    network), and each profile needs the four roles."""
    declared = {p for s in svcs.values() for p in s.get("profiles", [])}
    need(declared == set(PROFILES), f"profiles are {sorted(declared)}, not {list(PROFILES)}")
    for prof in PROFILES:
        on = {n: s for n, s in svcs.items() if not s.get("profiles") or prof in s["profiles"]}
        for name, s in on.items():
            refs = list(s.get("depends_on") or [])
            ipc = str(s.get("ipc", ""))
            if ipc.startswith("service:"):
                refs.append(ipc[len("service:"):])
            for ref in refs:
                need(ref in on, f"--profile {prof}: {name} refers to {ref}, which is not in the "
                     "profile (an invalid project: depends on undefined service)")
        listens = {}
        for name, s in on.items():
            for a in s.get("command", []):
                if str(a).startswith("--listen="):
                    listens.setdefault(a, []).append(name)
        for addr, names in listens.items():
            need(len(names) == 1, f"--profile {prof}: {sorted(names)} all use {addr}")
        binaries = {str((s.get("command") or [""])[0]) for s in on.values()}
        for b in ("lsp_gpu_worker", "lsp_cpu_optimizer", "lsp_scheduler"):
            need(b in binaries, f"--profile {prof}: no service runs {b}")


def lint_images(path, svcs, need):
    """The CPU services run the CPU image and reserve no GPU; worker-gpu runs the GPU image and
    reserves one NVIDIA GPU."""
    for name, s in svcs.items():
        dockerfile = (s.get("build") or {}).get("dockerfile")
        if name == "worker-gpu":
            need(dockerfile == GPU_DOCKERFILE,
                 f"{name}: built from {dockerfile}, not {GPU_DOCKERFILE}")
            need(s.get("profiles") == ["gpu"], f"{name}: profiles {s.get('profiles')}, not [gpu]")
            devs = gpu_devices(s)
            need(len(devs) == 1 and devs[0].get("driver") == "nvidia" and devs[0].get("count") == 1,
                 f"{name}: does not reserve one NVIDIA GPU: {devs}")
        else:
            need(dockerfile == CPU_DOCKERFILE,
                 f"{name}: built from {dockerfile}, not {CPU_DOCKERFILE}")
            need(not gpu_devices(s), f"{name}: reserves a GPU but runs the CPU image (Debian's CPU "
                 "LibTorch cannot use it)")
    if "worker-gpu" in svcs and "worker" in svcs:
        need(svcs["worker-gpu"].get("image") != svcs["worker"].get("image"),
             "worker-gpu: the same image name as the CPU worker")
        need(svcs["worker"].get("profiles") == ["cpu"],
             f"worker: profiles {svcs['worker'].get('profiles')}, not [cpu]")
    gpu_file = os.path.normpath(os.path.join(os.path.dirname(path), "..", "..", GPU_DOCKERFILE))
    need(os.path.isfile(gpu_file), f"no {gpu_file}")


def lint_services(path, doc, need):
    svcs = doc.get("services", {})
    need(set(svcs) == {"token", "worker", "worker-gpu", "optimizer", "scheduler"},
         f"services are {sorted(svcs)}")
    lint_token(path, svcs, need)
    lint_profiles(svcs, need)
    lint_images(path, svcs, need)
    ports = {"worker": 50061, "worker-gpu": 50061, "optimizer": 50062, "scheduler": 50060}
    for name, s in svcs.items():
        if name == "token":
            hardening(name, s, need)
            continue
        need(s.get("restart") in ("on-failure", "unless-stopped", "always"),
             f"{name}: restart policy is {s.get('restart')!r}")
        hc = s.get("healthcheck", {}).get("test", [])
        need(hc[:3] == ["CMD", "lspctl", "health"] and f"--scheduler=127.0.0.1:{ports.get(name)}" in hc,
             f"{name}: healthcheck is not `lspctl health --scheduler=127.0.0.1:{ports.get(name)}`: {hc}")
        for parts in hardening(name, s, need):
            need(len(parts) > 1 and parts[1].startswith(STATE + "/"),
                 f"{name}: {':'.join(parts)} is outside --allowed_roots={STATE}")
        need(s.get("network_mode") == "host" and "ports" not in s,
             f"{name}: not on the host network (loopback binding) or publishes ports")
        listen = [a for a in s.get("command", []) if a.startswith("--listen=")]
        need(listen == [f"--listen=127.0.0.1:{ports.get(name)}"],
             f"{name}: --listen is {listen}, not 127.0.0.1:{ports.get(name)} (non-loopback needs TLS)")
    o, sch = svcs.get("optimizer", {}), svcs.get("scheduler", {})
    # The arena's /dev/shm: the optimizer's IPC namespace (the service of both profiles),
    # joined by whichever worker runs.
    need(o.get("ipc") == "shareable", "optimizer: ipc is not shareable")
    need("shm_size" in o, "optimizer: no shm_size (Docker's default /dev/shm is 64 MB)")
    need(o.get("ulimits", {}).get("memlock") == -1, "optimizer: memlock not unlimited")
    for name in ("worker", "worker-gpu"):
        w = svcs.get(name, {})
        need(w.get("ipc") == "service:optimizer", f"{name}: ipc is not service:optimizer")
        need(w.get("ulimits", {}).get("memlock") == -1, f"{name}: memlock not unlimited")
    cmd = sch.get("command", [])
    for flag in (f"--state_dir={STATE}/state", f"--allowed_roots={STATE}"):
        need(flag in cmd, f"scheduler: command lacks {flag}")
    # The worker's and the optimizer's RPCs check the same roots as the scheduler (issue 43).
    for name in ("worker", "worker-gpu", "optimizer"):
        need(f"--allowed_roots={STATE}" in svcs.get(name, {}).get("command", []),
             f"{name}: command lacks --allowed_roots={STATE}")
    need("state" in (doc.get("volumes") or {}), "no top-level `state` volume")
    return f"{len(svcs)} services"


def lint_ranks(path, doc, need):
    svcs = doc.get("services", {})
    need(sorted(svcs) == [f"rank{r}" for r in range(len(svcs))] and len(svcs) >= 2,
         f"services are {sorted(svcs)}, not rank0..rankN-1")
    nets = doc.get("networks") or {}
    here = os.path.dirname(path)
    for name, s in svcs.items():
        r = name[len("rank"):]
        cmd = s.get("command", [])
        need(cmd[:2] == ["lspctl", "run"], f"{name}: command is not `lspctl run`: {cmd}")
        for flag in (f"--rank={r}", f"--output_dir={STATE}/runs/rank{r}",
                     "--rendezvous=rank0:29500", f"--bind_address={name}"):
            need(flag in cmd, f"{name}: command lacks {flag}")
        need(s.get("hostname") == name, f"{name}: hostname is {s.get('hostname')!r}")
        need("network_mode" not in s and "ports" not in s,
             f"{name}: on the host network or publishes ports (the rendezvous store would be open)")
        for n in s.get("networks", []):
            need((nets.get(n) or {}).get("internal") is True, f"{name}: network {n} is not internal")
        need(bool(s.get("networks")), f"{name}: no internal network")
        need(str(s.get("restart", "")).startswith("on-failure"),
             f"{name}: restart is {s.get('restart')!r}")
        for parts in hardening(name, s, need):
            if len(parts) > 1 and parts[1] == "/etc/lsp-offload/rank.yaml":
                src = os.path.normpath(os.path.join(here, parts[0]))
                need(os.path.isfile(src), f"{name}: the spec {src} does not exist")
    # The spec the ranks run: world size = the ranks, paths where the mounts put them.
    spec_src = [v.split(":")[0] for v in svcs.get("rank0", {}).get("volumes", [])
                if v.split(":")[1:2] == ["/etc/lsp-offload/rank.yaml"]]
    need(len(spec_src) == 1, "rank0: no /etc/lsp-offload/rank.yaml mount")
    if len(spec_src) == 1 and os.path.isfile(os.path.join(here, spec_src[0])):
        spec = yaml.safe_load(open(os.path.join(here, spec_src[0])))
        ws = spec.get("distributed", {}).get("world_size")
        need(ws == len(svcs), f"rank.yaml: world_size {ws} for {len(svcs)} ranks")
        need(spec["model"]["path"].startswith(f"{STATE}/models/"), "rank.yaml: model.path")
        need(spec["data"]["train_path"].startswith(f"{STATE}/data/"),
             "rank.yaml: data.train_path not under the data mount")
    return f"{len(svcs)} ranks"


def self_check_token(path, doc, need):
    """A copy of a passing file whose worker lacks the token, or does not wait for it, must
    fail lint_services with a finding about the worker."""
    edits = {
        "without --auth_token_file":
            lambda d: d["services"]["worker"]["command"].remove(f"--auth_token_file={TOKEN}"),
        "without depends_on token": lambda d: d["services"]["worker"]["depends_on"].pop("token"),
    }
    for what, edit in edits.items():
        bad = copy.deepcopy(doc)
        edit(bad)
        found = []
        lint_services(path, bad, lambda cond, msg: cond or found.append(msg))
        caught = [m for m in found if m.startswith("worker:")]
        need(bool(caught), f"self-check: a worker {what} passed the lint")
        if caught:
            print(f"self-check: a worker {what} is caught: {caught[0]}")


def self_check_profiles(path, doc, need):
    """Copies of a passing file that the profile and image checks must catch: the CPU worker
    reserving a GPU again, the CPU worker in every profile (two workers on one port under
    --profile gpu), the scheduler waiting for the CPU worker (an invalid project under
    --profile gpu), the GPU worker from the CPU image."""
    def reserve(d):
        d["services"]["worker"]["deploy"] = copy.deepcopy(d["services"]["worker-gpu"]["deploy"])

    def cpu_image_for_gpu(d):
        d["services"]["worker-gpu"]["build"] = {"context": "../..", "dockerfile": CPU_DOCKERFILE}

    edits = {
        "CPU worker reserving a GPU": (reserve, "worker:"),
        "CPU worker in both profiles": (lambda d: d["services"]["worker"].pop("profiles"),
                                        "--profile gpu: ['worker', 'worker-gpu'] all use"),
        "scheduler waiting for the CPU worker": (
            lambda d: d["services"]["scheduler"]["depends_on"].update(
                worker={"condition": "service_healthy"}),
            "--profile gpu: scheduler refers to worker"),
        "GPU worker from the CPU image": (cpu_image_for_gpu, "worker-gpu: built from"),
    }
    for what, (edit, expect) in edits.items():
        bad = copy.deepcopy(doc)
        edit(bad)
        found = []
        lint_services(path, bad, lambda cond, msg: cond or found.append(msg))
        caught = [m for m in found if m.startswith(expect)]
        need(bool(caught), f"self-check: a {what} passed the lint ({found})")
        if caught:
            print(f"self-check: a {what} is caught: {caught[0]}")


def main(argv):
    if len(argv) != 3 or argv[1] not in ("services", "ranks"):
        print("usage: compose_lint.py services|ranks FILE", file=sys.stderr)
        return 2
    path = argv[2]
    with open(path) as f:
        doc = yaml.safe_load(f)
    errors = []

    def need(cond, msg):
        if not cond:
            errors.append(msg)

    what = (lint_services if argv[1] == "services" else lint_ranks)(path, doc, need)
    if argv[1] == "services" and not errors:
        self_check_token(path, doc, need)
        self_check_profiles(path, doc, need)
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"PASS: {path}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
