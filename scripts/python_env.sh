# shellcheck shell=bash
# Sourced by scripts/setup and python/tests/run_tests (not run): the virtual environment in
# which the Python client (python/, docs/python.md) is built and tested, with the pinned
# packages of python/requirements-test.txt from PyPI.
#
#   $LSPO_CACHE_ROOT/python-venv   (scripts/caches.sh: ~/.cache/lsp-offload, or $LSPO_CACHE_DIR)
#
# It lives beside the build caches, outside every clone, so that another clone on the same
# machine (and tests/standalone_clone_check.sh's copy) finds it made. Its stamp file is a copy
# of the requirements it was made from: a change of them, a Python that no longer runs or
# imports them, or a missing stamp (an interrupted setup) makes it anew. When the cache root
# cannot be written, the venv is .venv-python in the clone. LSPO_PY_VENV names another.

if [ -z "${LSPO_CACHE_ROOT:-}" ]; then
  # shellcheck source=scripts/caches.sh
  . "$(dirname "${BASH_SOURCE[0]}")/caches.sh"
fi
_lspo_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LSPO_PY_REQUIREMENTS=$_lspo_repo/python/requirements-test.txt
if [ -z "${LSPO_PY_VENV:-}" ]; then
  if mkdir -p "$LSPO_CACHE_ROOT" 2>/dev/null && [ -w "$LSPO_CACHE_ROOT" ]; then
    LSPO_PY_VENV=$LSPO_CACHE_ROOT/python-venv
  else
    LSPO_PY_VENV=$_lspo_repo/.venv-python
  fi
fi

# lspo_python_env_ok: the venv exists, was made from the current requirements, and its Python
# (whose base installation may have gone since) runs and imports them.
lspo_python_env_ok() {
  [ -x "$LSPO_PY_VENV/bin/python" ] && [ -f "$LSPO_PY_VENV/.lspo-stamp" ] &&
    cmp -s "$LSPO_PY_VENV/.lspo-stamp" "$LSPO_PY_REQUIREMENTS" &&
    "$LSPO_PY_VENV/bin/python" -c 'import grpc, grpc_tools, google.protobuf, yaml, setuptools' \
      >/dev/null 2>&1
}

# lspo_python_env_prepare: makes the venv unless it is OK. Returns non-zero (with a message)
# when it cannot: no python3 venv module, or PyPI not reachable.
lspo_python_env_prepare() {
  if lspo_python_env_ok; then
    echo "setup: Python client environment present ($LSPO_PY_VENV)"
    return 0
  fi
  echo "setup: making the Python client environment $LSPO_PY_VENV (python/requirements-test.txt)"
  if [ -e "$LSPO_PY_VENV" ] && [ ! -f "$LSPO_PY_VENV/pyvenv.cfg" ]; then
    echo "setup: $LSPO_PY_VENV exists and is not a venv: not replacing it (set LSPO_PY_VENV)" >&2
    return 1
  fi
  rm -rf "$LSPO_PY_VENV"
  python3 -m venv "$LSPO_PY_VENV" &&
    "$LSPO_PY_VENV/bin/python" -m pip install -q --disable-pip-version-check \
      -r "$LSPO_PY_REQUIREMENTS" &&
    cp "$LSPO_PY_REQUIREMENTS" "$LSPO_PY_VENV/.lspo-stamp" &&
    lspo_python_env_ok || {
      echo "setup: could not make $LSPO_PY_VENV: the Python client's test (python_client_test)" \
           "will fail until scripts/setup makes it" >&2
      return 1
    }
}
