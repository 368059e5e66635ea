#!/usr/bin/env bash
# Checks deploy/systemd with systemd-analyze verify, honestly despite the install paths:
# the units are copied to a temporary directory with ExecStart's /opt/lsp-offload/bin/NAME
# rewritten to the built binary (passed as NAME=PATH), so verify also checks that each command
# exists and is executable. Any message from verify fails the test (verify exits 0 on unknown
# directives and only logs them). Then:
#   - each ExecStart flag must be a flag the binary knows (from its --helpfull);
#   - the hardening this project relies on must be present (deploy/README.md lists it);
#   - self-check: a copy with a misspelt directive must fail verify, so a typo cannot pass.
# Usage: verify_units.sh UNIT_DIR NAME=PATH...   Exit 77 (CTest: skipped) without systemd-analyze.
set -uo pipefail
units_src=${1:?usage: verify_units.sh UNIT_DIR NAME=PATH...}
shift
if ! command -v systemd-analyze >/dev/null; then
  echo "SKIP: systemd-analyze not installed (Debian package systemd)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
err() { echo "FAIL: $*"; fail=1; }

cp "$units_src"/*.service "$units_src"/*.target "$tmp"/
declare -A bin
for kv in "$@"; do bin[${kv%%=*}]=$(realpath -m "${kv#*=}"); done
for u in "$tmp"/*.service; do
  exe=$(sed -n 's#^ExecStart=/opt/lsp-offload/bin/\([^ ]*\).*#\1#p' "$u")
  [ -n "$exe" ] || { err "$(basename "$u"): ExecStart is not /opt/lsp-offload/bin/NAME"; continue; }
  path=${bin[$exe]:-}
  [ -n "$path" ] || { err "$(basename "$u"): no built binary given for $exe"; continue; }
  [ -x "$path" ] || { err "$(basename "$u"): $path is not built (build $exe first)"; continue; }
  sed -i "s#^ExecStart=/opt/lsp-offload/bin/$exe#ExecStart=$path#" "$u"
  # Every --flag of ExecStart must be known to the binary.
  help=$("$path" --helpfull 2>&1)
  for flag in $(grep -o -- ' --[a-z_]*' <<<"$(grep '^ExecStart=' "$u")"); do
    grep -q -- "-${flag#--}\b" <<<"$help" || err "$(basename "$u"): $exe has no flag $flag"
  done
done

verify() {  # verify DIR: prints verify's messages; returns non-zero on any message
  local out rc
  out=$(cd "$1" && SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no ./*.target ./*.service 2>&1)
  rc=$?
  [ -n "$out" ] && echo "$out"
  [ "$rc" = 0 ] && [ -z "$out" ]
}
if out=$(verify "$tmp"); then
  echo "systemd-analyze verify: $(ls "$tmp" | wc -l) units clean"
else
  err "systemd-analyze verify reported:"; echo "$out" | sed 's/^/    /'
fi

# The hardening the deployment relies on (see deploy/README.md).
need() {  # need UNIT LINE...
  local u=$1; shift
  for line in "$@"; do
    grep -qxF -- "$line" "$units_src/$u" || err "$u: missing '$line'"
  done
}
common=("User=lspo" "ProtectSystem=strict" "ReadWritePaths=/var/lib/lsp-offload" "ProtectHome=yes"
        "NoNewPrivileges=yes" "CapabilityBoundingSet=" "SystemCallFilter=@system-service"
        "Restart=on-failure" "PrivateTmp=yes" "RemoveIPC=no")
need lsp-scheduler.service "${common[@]/RemoveIPC=no/PrivateDevices=yes}" \
  "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6"
need lsp-gpu-worker.service "${common[@]}" "LimitMEMLOCK=infinity" "PrivateDevices=no"
need lsp-cpu-optimizer.service "${common[@]}" "LimitMEMLOCK=infinity"
# A data-parallel rank: loopback only unless a drop-in admits the ranks' network (the
# rendezvous store and Gloo are unauthenticated), the rank from the instance name.
need lsp-rank@.service "${common[@]}" "LimitMEMLOCK=infinity" "IPAddressDeny=any" \
  "IPAddressAllow=localhost"
grep -q -- '--rank=%i ' "$units_src/lsp-rank@.service" \
  || err "lsp-rank@.service: the rank is not the instance (--rank=%i)"
for u in "$units_src"/*.service; do
  grep -q '^DynamicUser=yes' "$u" && err "$(basename "$u"): DynamicUser=yes implies RemoveIPC=yes (drops the arena)"
  grep -q '^Restart=' "$u" || err "$(basename "$u"): no Restart="
done
grep -q -- '--state_dir=/var/lib/lsp-offload/state' "$units_src/lsp-scheduler.service" \
  || err "lsp-scheduler.service: no --state_dir=/var/lib/lsp-offload/state"
grep -q -- '--allowed_roots=/var/lib/lsp-offload' "$units_src/lsp-scheduler.service" \
  || err "lsp-scheduler.service: no --allowed_roots=/var/lib/lsp-offload"

# Self-check: a misspelt directive must be caught.
mkdir "$tmp/typo"
cp "$tmp"/*.service "$tmp"/*.target "$tmp/typo"/
sed -i 's/^ProtectSystem=strict/ProtectSystm=strict/' "$tmp/typo/lsp-scheduler.service"
if out=$(verify "$tmp/typo"); then
  err "self-check: a unit with 'ProtectSystm=strict' passed systemd-analyze verify"
elif ! grep -q "ProtectSystm" <<<"$out"; then
  err "self-check: verify failed, but not on the misspelt directive:"; echo "$out" | sed 's/^/    /'
else
  echo "self-check: misspelt directive caught: $(grep -m1 ProtectSystm <<<"$out" | sed 's#^.*/##')"
fi

if [ "$fail" = 0 ]; then echo "PASS: deploy/systemd"; else echo "FAILED: deploy/systemd"; fi
exit "$fail"
