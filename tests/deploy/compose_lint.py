#!/usr/bin/env python3
"""Structural checks of the compose files (tests/deploy/compose_check.sh lint | lint-ranks).

  compose_lint.py services FILE   deploy/compose/docker-compose.yml: worker, optimizer and
                                  scheduler; shared IPC worker -> optimizer, GPU reservation,
                                  health checks via `lspctl health`, loopback binding on the host
                                  network, scheduler flags.
  compose_lint.py ranks FILE      deploy/compose/docker-compose.ranks.yml: ranks rank0..rankN-1,
                                  each `lspctl run` with its rank, rank 0's rendezvous and its
                                  own bind address, on an internal network only (the store and
                                  Gloo are unauthenticated); the spec they mount.
Both apply the same hardening to every service (hardening() below). Exit 0 and one PASS line,
or 1 and a FAIL line per finding. Needs python3-yaml.
"""
import os
import sys

import yaml

STATE = "/var/lib/lsp-offload"


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


def lint_services(path, doc, need):
    svcs = doc.get("services", {})
    need(set(svcs) == {"worker", "optimizer", "scheduler"}, f"services are {sorted(svcs)}")
    ports = {"worker": 50061, "optimizer": 50062, "scheduler": 50060}
    for name, s in svcs.items():
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
    w, o, sch = svcs.get("worker", {}), svcs.get("optimizer", {}), svcs.get("scheduler", {})
    need(w.get("ipc") == "shareable", "worker: ipc is not shareable")
    need(o.get("ipc") == "service:worker", "optimizer: ipc is not service:worker")
    need(w.get("ulimits", {}).get("memlock") == -1 and o.get("ulimits", {}).get("memlock") == -1,
         "worker/optimizer: memlock not unlimited")
    devs = w.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    need(any("gpu" in d.get("capabilities", []) for d in devs), "worker: no GPU reservation")
    need("shm_size" in w, "worker: no shm_size (Docker's default /dev/shm is 64 MB)")
    cmd = sch.get("command", [])
    for flag in (f"--state_dir={STATE}/state", f"--allowed_roots={STATE}"):
        need(flag in cmd, f"scheduler: command lacks {flag}")
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
    for e in errors:
        print("FAIL:", e)
    if errors:
        return 1
    print(f"PASS: {path}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
