#!/usr/bin/env bash
# Checks deploy/compose/docker-compose.yml and docker-compose.ranks.yml.
#   compose_check.sh config FILE  `docker compose -f FILE config -q` (or docker-compose v1);
#                                 exit 77 (CTest: skipped) when no compose implementation runs.
#   compose_check.sh lint FILE    structural checks with python3-yaml, no Docker needed: shared
#                                 IPC worker -> optimizer, GPU reservation, health checks via
#                                 `lspctl health`, restart policies, the /var/lib/lsp-offload
#                                 volume, loopback binding on the host network, scheduler flags; exit 77 without python3-yaml.
set -uo pipefail
mode=${1:?usage: compose_check.sh config|lint|lint-ranks FILE}
file=${2:?usage: compose_check.sh config|lint|lint-ranks FILE}

case "$mode" in
  config)
    if docker compose version >/dev/null 2>&1; then
      compose=(docker compose)
    elif command -v docker-compose >/dev/null && docker-compose version >/dev/null 2>&1; then
      compose=(docker-compose)
    else
      echo "SKIP: no docker compose plugin (\`docker compose version\` fails) and no docker-compose;"
      echo "      install docker-compose-plugin (Docker's repository) to run this check"
      exit 77
    fi
    # `config` resolves and validates the file against the compose schema; no engine needed.
    if "${compose[@]}" -f "$file" config -q; then
      echo "PASS: ${compose[*]} config -q $file"
    else
      echo "FAIL: ${compose[*]} config -q $file"; exit 1
    fi ;;
  lint)
    if ! python3 -c 'import yaml' 2>/dev/null; then
      echo "SKIP: python3-yaml not installed"; exit 77
    fi
    python3 - "$file" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
errors = []
def need(cond, msg):
    if not cond: errors.append(msg)
svcs = doc.get("services", {})
need(set(svcs) == {"worker", "optimizer", "scheduler"}, f"services are {sorted(svcs)}")
ports = {"worker": 50061, "optimizer": 50062, "scheduler": 50060}
for name, s in svcs.items():
    need(s.get("restart") in ("on-failure", "unless-stopped", "always"),
         f"{name}: restart policy is {s.get('restart')!r}")
    hc = s.get("healthcheck", {}).get("test", [])
    need(hc[:3] == ["CMD", "lspctl", "health"] and f"--scheduler=127.0.0.1:{ports[name]}" in hc,
         f"{name}: healthcheck is not `lspctl health --scheduler=127.0.0.1:{ports[name]}`: {hc}")
    vols = s.get("volumes", [])
    need(any(v.split(":")[:2] == ["state", "/var/lib/lsp-offload"] for v in vols),
         f"{name}: the state volume is not mounted at /var/lib/lsp-offload")
    for v in vols:
        parts = v.split(":")
        if parts[0] != "state":
            need(parts[-1] == "ro", f"{name}: bind mount {v} is not read-only")
            need(parts[1].startswith("/var/lib/lsp-offload/"),
                 f"{name}: {v} is outside --allowed_roots=/var/lib/lsp-offload")
    need("no-new-privileges:true" in s.get("security_opt", []), f"{name}: no no-new-privileges")
    need(s.get("cap_drop") == ["ALL"], f"{name}: capabilities not dropped")
    need(not s.get("privileged", False), f"{name}: privileged")
    need(s.get("network_mode") == "host" and "ports" not in s,
         f"{name}: not on the host network (loopback binding) or publishes ports")
    listen = [a for a in s.get("command", []) if a.startswith("--listen=")]
    need(listen == [f"--listen=127.0.0.1:{ports[name]}"],
         f"{name}: --listen is {listen}, not 127.0.0.1:{ports[name]} (non-loopback needs TLS)")
w, o, sch = svcs.get("worker", {}), svcs.get("optimizer", {}), svcs.get("scheduler", {})
need(w.get("ipc") == "shareable", "worker: ipc is not shareable")
need(o.get("ipc") == "service:worker", "optimizer: ipc is not service:worker")
need(w.get("ulimits", {}).get("memlock") == -1 and o.get("ulimits", {}).get("memlock") == -1,
     "worker/optimizer: memlock not unlimited")
devs = w.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
need(any("gpu" in d.get("capabilities", []) for d in devs), "worker: no GPU reservation")
need("shm_size" in w, "worker: no shm_size (Docker's default /dev/shm is 64 MB)")
cmd = sch.get("command", [])
for flag in ("--state_dir=/var/lib/lsp-offload/state", "--allowed_roots=/var/lib/lsp-offload"):
    need(flag in cmd, f"scheduler: command lacks {flag}")
need("state" in (doc.get("volumes") or {}), "no top-level `state` volume")
for e in errors: print("FAIL:", e)
if errors: sys.exit(1)
print(f"PASS: {sys.argv[1]}: {len(svcs)} services")
PY
    ;;
  lint-ranks)
    # deploy/compose/docker-compose.ranks.yml: ranks rank0..rankN-1, each `lspctl run` with its
    # rank, rank 0's rendezvous and its own bind address, on an internal network only (the
    # store and Gloo are unauthenticated), read-only mounts, the same hardening.
    if ! python3 -c 'import yaml' 2>/dev/null; then
      echo "SKIP: python3-yaml not installed"; exit 77
    fi
    python3 - "$file" <<'PY'
import os, sys, yaml
path = sys.argv[1]
doc = yaml.safe_load(open(path))
errors = []
def need(cond, msg):
    if not cond: errors.append(msg)
svcs = doc.get("services", {})
need(sorted(svcs) == [f"rank{r}" for r in range(len(svcs))] and len(svcs) >= 2,
     f"services are {sorted(svcs)}, not rank0..rankN-1")
nets = doc.get("networks") or {}
for name, s in svcs.items():
    r = name[len("rank"):]
    cmd = s.get("command", [])
    need(cmd[:2] == ["lspctl", "run"], f"{name}: command is not `lspctl run`: {cmd}")
    for flag in (f"--rank={r}", f"--output_dir=/var/lib/lsp-offload/runs/rank{r}",
                 "--rendezvous=rank0:29500", f"--bind_address={name}"):
        need(flag in cmd, f"{name}: command lacks {flag}")
    need(s.get("hostname") == name, f"{name}: hostname is {s.get('hostname')!r}")
    need("network_mode" not in s and "ports" not in s,
         f"{name}: on the host network or publishes ports (the rendezvous store would be open)")
    for n in s.get("networks", []):
        need((nets.get(n) or {}).get("internal") is True, f"{name}: network {n} is not internal")
    need(bool(s.get("networks")), f"{name}: no internal network")
    need(str(s.get("restart", "")).startswith("on-failure"), f"{name}: restart is {s.get('restart')!r}")
    need("no-new-privileges:true" in s.get("security_opt", []), f"{name}: no no-new-privileges")
    need(s.get("cap_drop") == ["ALL"], f"{name}: capabilities not dropped")
    need(not s.get("privileged", False), f"{name}: privileged")
    vols = s.get("volumes", [])
    need(any(v.split(":")[:2] == ["state", "/var/lib/lsp-offload"] for v in vols),
         f"{name}: the state volume is not mounted at /var/lib/lsp-offload")
    for v in vols:
        parts = v.split(":")
        if parts[0] != "state":
            need(parts[-1] == "ro", f"{name}: bind mount {v} is not read-only")
            if parts[1] == "/etc/lsp-offload/rank.yaml":
                src = os.path.normpath(os.path.join(os.path.dirname(path), parts[0]))
                need(os.path.isfile(src), f"{name}: the spec {src} does not exist")
# The spec the ranks run: two ranks, paths where the mounts put them.
spec_src = [v.split(":")[0] for v in svcs.get("rank0", {}).get("volumes", [])
            if v.split(":")[1] == "/etc/lsp-offload/rank.yaml"]
need(len(spec_src) == 1, "rank0: no /etc/lsp-offload/rank.yaml mount")
if spec_src:
    spec = yaml.safe_load(open(os.path.join(os.path.dirname(path), spec_src[0])))
    need(spec.get("distributed", {}).get("world_size") == len(svcs),
         f"rank.yaml: world_size {spec.get('distributed', {}).get('world_size')} for {len(svcs)} ranks")
    for key in ("path",):
        need(spec["model"][key].startswith("/var/lib/lsp-offload/models/"), "rank.yaml: model.path")
    need(spec["data"]["train_path"].startswith("/var/lib/lsp-offload/data/"),
         "rank.yaml: data.train_path not under the data mount")
for e in errors: print("FAIL:", e)
if errors: sys.exit(1)
print(f"PASS: {path}: {len(svcs)} ranks")
PY
    ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
