#!/usr/bin/env bash
# Checks deploy/systemd with systemd-analyze verify, honestly despite the install paths:
# the units are copied to a temporary directory with ExecStart's /opt/lsp-offload/bin/NAME
# rewritten to the built binary (passed as NAME=PATH), so verify also checks that each command
# exists and is executable. Any message from verify fails the test (verify exits 0 on unknown
# directives and only logs them). Then:
#   - each ExecStart flag must be a flag the binary knows (from its --helpfull);
#   - the hardening this project relies on must be present (deploy/README.md lists it);
#   - the bearer token (issue 43): lsp-offload-token.service creates it, every unit running a
#     service binary (/opt/lsp-offload/bin/lsp_*) passes --auth_token_file and Requires= and
#     comes After= the token unit (token_checks; self-check: copies without them must fail);
#     the token unit's script is run for real in a temporary directory, and the scheduler is
#     started with its unit's command line and that token: calls without it are refused,
#     calls with it and health checks without it are answered;
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
sched_pid=
trap '[ -n "$sched_pid" ] && kill "$sched_pid" 2>/dev/null && wait "$sched_pid"; rm -rf "$tmp"' EXIT
fail=0
err() { echo "FAIL: $*"; fail=1; }

cp "$units_src"/*.service "$units_src"/*.target "$tmp"/
declare -A bin
for kv in "$@"; do bin[${kv%%=*}]=$(realpath -m "${kv#*=}"); done
token_unit=lsp-offload-token.service
token=/var/lib/lsp-offload/auth_token
for u in "$tmp"/*.service; do
  [ "$(basename "$u")" = "$token_unit" ] && continue  # /bin/sh -ec SCRIPT: checked below
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
  # The token unit is a oneshot: a failed run fails the same way again (the journal says why).
  [ "$(basename "$u")" = "$token_unit" ] || grep -q '^Restart=' "$u" || err "$(basename "$u"): no Restart="
done
grep -q -- '--state_dir=/var/lib/lsp-offload/state' "$units_src/lsp-scheduler.service" \
  || err "lsp-scheduler.service: no --state_dir=/var/lib/lsp-offload/state"
for u in lsp-scheduler lsp-gpu-worker lsp-cpu-optimizer; do
  grep -q -- '^ExecStart=.* --allowed_roots=/var/lib/lsp-offload' "$units_src/$u.service" \
    || err "$u.service: no --allowed_roots=/var/lib/lsp-offload"
done

# The bearer token (issue 43): any local user could otherwise call the worker's and the
# optimizer's RPCs on 127.0.0.1. token_checks DIR prints a FAIL line per finding.
token_checks() {
  local dir=$1 u name
  local t="$dir/$token_unit"
  if [ ! -f "$t" ]; then echo "FAIL: no $token_unit"; else
    for line in "Type=oneshot" "RemainAfterExit=yes" "User=lspo" "UMask=0077" \
        "PartOf=lsp-offload.target" "StateDirectory=lsp-offload" "${common[@]/Restart=on-failure/PrivateDevices=yes}"; do
      grep -qxF -- "$line" "$t" || echo "FAIL: $token_unit: missing '$line'"
    done
    grep -q "^ExecStart=/bin/sh -ec '.*f=$token;" "$t" \
      || echo "FAIL: $token_unit: ExecStart is not /bin/sh -ec '...f=$token;...'"
  fi
  grep -q "^Wants=\(.* \)\?$token_unit\( \|\$\)" "$dir/lsp-offload.target" \
    || echo "FAIL: lsp-offload.target: does not want $token_unit"
  # Every unit that runs a service binary serves (or, the scheduler, calls) the services' RPCs.
  # lsp-rank@.service runs `lspctl run`: one process, its services in-process, no port.
  for u in "$dir"/*.service; do
    name=$(basename "$u")
    grep -q '^ExecStart=/opt/lsp-offload/bin/lsp_' "$u" || continue
    grep -q -- "^ExecStart=.* --auth_token_file=$token\( \|\$\)" "$u" \
      || echo "FAIL: $name: ExecStart lacks --auth_token_file=$token"
    grep -q "^Requires=\(.* \)\?$token_unit\( \|\$\)" "$u" || echo "FAIL: $name: no Requires=$token_unit"
    grep -q "^After=\(.* \)\?$token_unit\( \|\$\)" "$u" || echo "FAIL: $name: not After=$token_unit"
  done
}
out=$(token_checks "$units_src")
if [ -n "$out" ]; then echo "$out"; fail=1; fi
# Self-check: a service unit without the token, or not requiring its unit, must fail.
for broken in "s# --auth_token_file=[^ ]*##" "/^Requires=lsp-offload-token.service\$/d"; do
  rm -rf "$tmp/notoken" && mkdir "$tmp/notoken" && cp "$units_src"/*.service "$units_src"/*.target "$tmp/notoken"/
  sed -i "$broken" "$tmp/notoken/lsp-gpu-worker.service"
  out=$(token_checks "$tmp/notoken")
  if ! grep -q "^FAIL: lsp-gpu-worker.service" <<<"$out"; then
    err "self-check: lsp-gpu-worker.service edited with sed '$broken' passed the token checks"
  else
    echo "self-check: caught: $(grep -m1 "^FAIL: lsp-gpu-worker.service" <<<"$out" | sed 's/^FAIL: //')"
  fi
done

# The token unit's script, for real, in a temporary /var/lib/lsp-offload ("$$" is systemd's "$").
var="$tmp/var-lib-lsp-offload"
mkdir -p "$var/state" "$var/runs"
script=$(sed -n "s#^ExecStart=/bin/sh -ec '\(.*\)'\$#\1#p" "$units_src/$token_unit" \
         | sed "s/\\\$\\\$/\$/g; s#/var/lib/lsp-offload#$var#g")
tf=$var/auth_token
run_script() { (umask 0077 && cd "$var" && /bin/sh -ec "$script" >/dev/null); }
if ! run_script; then
  err "$token_unit: its script failed"
elif [ "$(stat -c %a "$tf" 2>/dev/null)" != 600 ] || ! grep -qxE '[0-9a-f]{64}' "$tf" \
     || [ "$(wc -c <"$tf")" != 65 ]; then
  err "$token_unit: $tf is not 64 hex digits and a newline, mode 0600: $(stat -c %a "$tf" 2>&1) $(head -c 80 "$tf")"
else
  first=$(cat "$tf") fail_before=$fail
  run_script && [ "$(cat "$tf")" = "$first" ] || err "$token_unit: a second run changed the token"
  : >"$tf"
  run_script && grep -qxE '[0-9a-f]{64}' "$tf" && [ "$(cat "$tf")" != "$first" ] \
    || err "$token_unit: an empty file was not replaced by a new token"
  [ "$(ls -A "$var" | grep -c auth_token)" = 1 ] || err "$token_unit: left files behind: $(ls -A "$var")"
  [ "$fail" = "$fail_before" ] \
    && echo "token unit: $tf created (64 hex digits, mode 0600), kept on a second run, replaced when empty"
fi

# The scheduler, started with its unit's command line (built binary, the temporary directory,
# a free port) and that token: unauthenticated calls refused, health open, the token accepted.
lspctl=${bin[lspctl]:-}
sched_cmd=$(sed -n 's#^ExecStart=##p' "$tmp/lsp-scheduler.service" | sed "s#/var/lib/lsp-offload#$var#g")
if [ -z "$lspctl" ] || [ ! -x "$lspctl" ] || [ ! -x "${sched_cmd%% *}" ] || [ ! -s "$tf" ]; then
  err "token: cannot start the scheduler with the token (lspctl=$lspctl, scheduler=${sched_cmd%% *})"
else
  port=
  for _ in 1 2 3 4 5; do
    p=$((20000 + RANDOM % 40000))
    # shellcheck disable=SC2086  # the unit's ExecStart: words without quotes
    ${sched_cmd/--listen=127.0.0.1:50060/--listen=127.0.0.1:$p} >"$tmp/scheduler.log" 2>&1 &
    sched_pid=$!
    for _ in $(seq 50); do
      if "$lspctl" health --scheduler="127.0.0.1:$p" --timeout_seconds=1 >/dev/null 2>&1; then port=$p; break; fi
      kill -0 "$sched_pid" 2>/dev/null || break
      sleep 0.2
    done
    [ -n "$port" ] && break
    kill "$sched_pid" 2>/dev/null; wait "$sched_pid" 2>/dev/null; sched_pid=
  done
  if [ -z "$port" ]; then
    err "token: the scheduler did not start with --auth_token_file:"; sed 's/^/    /' "$tmp/scheduler.log"
  else
    fail_before=$fail
    if out=$("$lspctl" list --scheduler="127.0.0.1:$port" 2>&1); then
      err "token: lspctl list without the token succeeded"
    elif ! grep -q "auth_token_file" <<<"$out"; then
      err "token: lspctl list without the token failed, but not for the token: $out"
    fi
    out=$("$lspctl" list --scheduler="127.0.0.1:$port" --auth_token_file="$tf" 2>&1) \
      || err "token: lspctl list with the generated token failed: $out"
    (umask 0077 && echo 0123456789abcdef0123456789abcdef >"$tmp/wrong_token")
    if out=$("$lspctl" list --scheduler="127.0.0.1:$port" --auth_token_file="$tmp/wrong_token" 2>&1); then
      err "token: lspctl list with a wrong token succeeded"
    elif ! grep -q "wrong bearer token" <<<"$out"; then
      err "token: lspctl list with a wrong token failed, but not for the token: $out"
    fi
    grep -q '\[bearer token\]' "$tmp/scheduler.log" || err "token: the scheduler does not log [bearer token]"
    [ "$fail" = "$fail_before" ] && echo "token: the scheduler as deployed refuses calls without" \
      "the token or with a wrong one, answers health without it and calls with it"
    kill "$sched_pid"; wait "$sched_pid" 2>/dev/null; sched_pid=
  fi
fi

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
