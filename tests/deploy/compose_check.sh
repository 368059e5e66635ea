#!/usr/bin/env bash
# Checks deploy/compose/docker-compose.yml and docker-compose.ranks.yml.
#   compose_check.sh config FILE [PROFILE...]
#                                 `docker compose -f FILE config -q` (or docker-compose v1), once
#                                 per profile given (`--profile P`: a profile is a project of its
#                                 own, valid or not); exit 77 (CTest: skipped) when no compose
#                                 implementation runs.
#   compose_check.sh lint FILE        structural checks of docker-compose.yml and
#   compose_check.sh lint-ranks FILE  docker-compose.ranks.yml (compose_lint.py; python3-yaml,
#                                     no Docker); exit 77 without python3-yaml.
set -uo pipefail
mode=${1:?usage: compose_check.sh config|lint|lint-ranks FILE [PROFILE...]}
file=${2:?usage: compose_check.sh config|lint|lint-ranks FILE [PROFILE...]}
shift 2

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
    profiles=("$@")
    [ ${#profiles[@]} -gt 0 ] || profiles=("")
    rc=0
    for p in "${profiles[@]}"; do
      args=(-f "$file")
      [ -z "$p" ] || args+=(--profile "$p")
      if "${compose[@]}" "${args[@]}" config -q; then
        echo "PASS: ${compose[*]} ${args[*]} config -q"
      else
        echo "FAIL: ${compose[*]} ${args[*]} config -q"; rc=1
      fi
    done
    exit $rc ;;
  lint | lint-ranks)
    # The structural checks (tests/deploy/compose_lint.py: shared hardening, then the
    # services' or the ranks' own rules).
    if ! python3 -c 'import yaml' 2>/dev/null; then
      echo "SKIP: python3-yaml not installed"; exit 77
    fi
    python3 "$(dirname "$0")/compose_lint.py" "$([ "$mode" = lint ] && echo services || echo ranks)" "$file" ;;
  *) echo "unknown mode $mode"; exit 2 ;;
esac
