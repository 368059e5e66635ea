# shellcheck shell=bash
# Sourced by scripts/setup and scripts/quickstart (not run): the GPU path of the README's first
# command (docs/gpu.md, "GPU quickstart"). On a machine with an NVIDIA GPU, its driver and a
# CUDA toolkit (nvcc), the main job is built against a CUDA PyTorch's LibTorch in build-cuda/
# and trained with device=cuda; everywhere else nothing changes (build/, Debian's CPU LibTorch).
#
#   lspo_gpu_detect [WHO]     a GPU listed by nvidia-smi? Sets LSPO_GPU_NAME ("NVIDIA H100 80GB
#                             HBM3, 81559 MiB") or LSPO_GPU_REASON; prints one line; 0 / 1.
#   lspo_gpu_torch_prepare    a Python whose torch can use the GPU and be linked here: sets
#                             LSPO_TORCH_PY, LSPO_TORCH_VERSION, LSPO_TORCH_CUDA, LSPO_TORCH_ROOT,
#                             LSPO_TORCH_CMAKE, LSPO_TORCH_PREFIXES ("ROOT;CMAKE"),
#                             LSPO_TORCH_ARCH ("9.0"), LSPO_CUDA_ARCHS ("90"), LSPO_NVCC_PATH;
#                             or LSPO_GPU_REASON and returns 1.
#   lspo_gpu_build [TARGET..] configures build-cuda/ as docs/gpu.md says and builds the targets
#                             (default lspctl).
#   lspo_gpu_setup            scripts/setup's part: detect, then prepare when there is a GPU.
#   lspo_gpu_run CMD...       runs CMD, or prints "dry run: CMD" under LSPO_GPU_DRY_RUN=1.
#
# Environment:
#   LSPO_GPU=0                the CPU path even with a GPU; LSPO_GPU=1: the GPU path or an error
#                             (no fallback to the CPU); unset: the GPU path when it is usable.
#   LSPO_NVIDIA_SMI           the nvidia-smi to ask (default: nvidia-smi on PATH).
#   LSPO_TORCH_PYTHON         a Python with a CUDA torch to build against (default: the venv
#                             below, made on demand with torch==2.11.0 from PyPI).
#   LSPO_TORCH_VENV           that venv (default $LSPO_CACHE_ROOT/torch-cuda-venv, beside the
#                             build caches: scripts/caches.sh; .venv-torch-cuda in the clone when
#                             the cache root cannot be written).
#   LSPO_NVCC                 the nvcc to build with (default: nvcc on PATH, else
#                             /usr/local/cuda/bin/nvcc).
#   LSPO_GPU_BUILD_DIR        the build folder (default build-cuda, relative to the repository).
#   LSPO_GPU_DRY_RUN=1        print the commands that would install torch, configure, build and
#                             train instead of running them; nvidia-smi, nvcc --version and the
#                             torch probes still run (tests/scripts/gpu_env_test.py).
# No `set -e` here: every function reports failure by its return status and LSPO_GPU_REASON.

if [ -z "${LSPO_CACHE_ROOT:-}" ]; then
  # shellcheck source=scripts/caches.sh
  . "$(dirname "${BASH_SOURCE[0]}")/caches.sh"
fi
_lspo_gpu_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# The pinned CUDA PyTorch: PyPI's Linux x86_64 wheel of torch 2.11.0 is built for CUDA 13.0
# (torch.__version__ 2.11.0+cu130) and brings its CUDA libraries as nvidia-* wheels; docs/gpu.md
# records it building and running with nvcc 13.0.
LSPO_TORCH_PIN=torch==2.11.0
LSPO_TORCH_PIN_CUDA_MAJOR=13
if [ -z "${LSPO_TORCH_VENV:-}" ]; then
  if mkdir -p "$LSPO_CACHE_ROOT" 2>/dev/null && [ -w "$LSPO_CACHE_ROOT" ]; then
    LSPO_TORCH_VENV=$LSPO_CACHE_ROOT/torch-cuda-venv
  else
    LSPO_TORCH_VENV=$_lspo_gpu_repo/.venv-torch-cuda
  fi
fi
LSPO_GPU_NAME=${LSPO_GPU_NAME:-}
LSPO_GPU_REASON=${LSPO_GPU_REASON:-}

# What one Python call reports about its torch (key=value lines). Capability and device name
# only when CUDA is usable: they would initialise CUDA and fail otherwise.
_LSPO_TORCH_PROBE='
import os, torch
print("version=" + torch.__version__)
print("cuda=" + (torch.version.cuda or ""))
print("cxx11_abi=" + str(bool(torch._C._GLIBCXX_USE_CXX11_ABI)))
print("cmake_prefix_path=" + torch.utils.cmake_prefix_path)
print("root=" + os.path.dirname(torch.__file__))
ok = torch.cuda.is_available()
print("cuda_available=" + str(ok))
if ok:
    print("capability=%d.%d" % torch.cuda.get_device_capability(0))
    print("device=" + torch.cuda.get_device_name(0))
'

_lspo_gpu_dry() { [ "${LSPO_GPU_DRY_RUN:-0}" = 1 ]; }

# _lspo_gpu_quote ARG...: the arguments as one shell-readable line (an argument with characters
# a shell would split or expand is single-quoted).
_lspo_gpu_quote() {
  local a out=() re='^[A-Za-z0-9_./=:,+@%-]+$'
  for a in "$@"; do
    if [[ $a =~ $re ]]; then out+=("$a"); else out+=("'${a//\'/\'\\\'\'}'"); fi
  done
  echo "${out[*]}"
}

lspo_gpu_run() {
  if _lspo_gpu_dry; then
    echo "dry run: $(_lspo_gpu_quote "$@")"
  else
    "$@"
  fi
}

# lspo_gpu_detect [WHO]: whether nvidia-smi lists a GPU (the first one is used: device 0).
lspo_gpu_detect() {
  local who=${1:-gpu} smi=${LSPO_NVIDIA_SMI:-nvidia-smi} out line rc=0 n
  local re='^[^,]+, *([0-9]+ MiB|\[N/A\])$'
  LSPO_GPU_NAME="" LSPO_GPU_REASON="" LSPO_GPU_COUNT=0
  if [ "${LSPO_GPU:-}" = 0 ]; then
    LSPO_GPU_REASON="LSPO_GPU=0 asks for the CPU path"
  elif ! command -v "$smi" >/dev/null 2>&1; then
    LSPO_GPU_REASON="no nvidia-smi"
    [ "$smi" = nvidia-smi ] || LSPO_GPU_REASON="no nvidia-smi at $smi (LSPO_NVIDIA_SMI)"
  else
    # A wedged driver can make nvidia-smi hang: bounded when coreutils' timeout is there.
    local bound=()
    if command -v timeout >/dev/null 2>&1; then bound=(timeout 60); fi
    out=$("${bound[@]}" "$smi" --query-gpu=name,memory.total --format=csv,noheader 2>&1) || rc=$?
    line=$(printf '%s\n' "$out" | sed -n '1{s/^[[:space:]]*//;s/[[:space:]]*$//;p;}')
    if [ "$rc" = 0 ] && [[ $line =~ $re ]]; then
      LSPO_GPU_NAME=$line
      n=$(printf '%s\n' "$out" | grep -c ',') || true
      LSPO_GPU_COUNT=${n:-1}
    elif [ -z "$line" ]; then
      LSPO_GPU_REASON="nvidia-smi lists no GPU (exit $rc)"
    else
      LSPO_GPU_REASON="nvidia-smi lists no GPU (exit $rc: ${line:0:160})"
    fi
  fi
  if [ -n "$LSPO_GPU_NAME" ]; then
    echo "$who: NVIDIA GPU: $LSPO_GPU_NAME$([ "$LSPO_GPU_COUNT" -gt 1 ] && echo " (device 0 of $LSPO_GPU_COUNT)")"
    return 0
  fi
  echo "$who: no NVIDIA GPU ($LSPO_GPU_REASON): CPU build"
  return 1
}

# _lspo_gpu_find_nvcc: LSPO_NVCC_PATH and LSPO_NVCC_VERSION ("13.0") of the CUDA compiler, or
# LSPO_GPU_REASON. A CUDA LibTorch's CMake config needs the toolkit; its major version must be
# the torch wheel's (one CUDA runtime per process: docs/gpu.md, "Known limits").
_lspo_gpu_find_nvcc() {
  local nvcc=${LSPO_NVCC:-}
  if [ -z "$nvcc" ]; then
    nvcc=$(command -v nvcc 2>/dev/null) || nvcc=""
    if [ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ]; then nvcc=/usr/local/cuda/bin/nvcc; fi
  fi
  if [ -z "$nvcc" ] || ! [ -x "$nvcc" ]; then
    LSPO_GPU_REASON="no nvcc${nvcc:+ at $nvcc} (the CUDA toolkit, on PATH or in /usr/local/cuda/bin): building against a CUDA LibTorch needs CUDA $LSPO_TORCH_PIN_CUDA_MAJOR's toolkit"
    return 1
  fi
  LSPO_NVCC_PATH=$nvcc
  LSPO_NVCC_VERSION=$("$nvcc" --version 2>/dev/null | sed -n 's/.*release \([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' | head -1) || true
  if [ -z "$LSPO_NVCC_VERSION" ]; then
    LSPO_GPU_REASON="$nvcc --version names no CUDA release"
    return 1
  fi
}

# _lspo_gpu_venv_ok: the venv exists, was made for the pinned torch, and imports it.
_lspo_gpu_venv_ok() {
  [ -x "$LSPO_TORCH_VENV/bin/python" ] && [ -f "$LSPO_TORCH_VENV/.lspo-stamp" ] &&
    [ "$(cat "$LSPO_TORCH_VENV/.lspo-stamp")" = "$LSPO_TORCH_PIN" ] &&
    "$LSPO_TORCH_VENV/bin/python" -c 'import torch' >/dev/null 2>&1
}

# _lspo_gpu_venv: makes $LSPO_TORCH_VENV with the pinned torch unless it is OK.
_lspo_gpu_venv() {
  if _lspo_gpu_venv_ok; then
    echo "gpu: CUDA PyTorch environment present ($LSPO_TORCH_VENV, $LSPO_TORCH_PIN)"
    return 0
  fi
  if [ "${LSPO_NVCC_VERSION%%.*}" != "$LSPO_TORCH_PIN_CUDA_MAJOR" ]; then
    LSPO_GPU_REASON="nvcc is CUDA $LSPO_NVCC_VERSION but the pinned $LSPO_TORCH_PIN wheel is built for CUDA $LSPO_TORCH_PIN_CUDA_MAJOR: install CUDA $LSPO_TORCH_PIN_CUDA_MAJOR's toolkit, or set LSPO_TORCH_PYTHON to a Python whose torch matches CUDA $LSPO_NVCC_VERSION"
    return 1
  fi
  if [ -e "$LSPO_TORCH_VENV" ] && [ ! -f "$LSPO_TORCH_VENV/pyvenv.cfg" ]; then
    LSPO_GPU_REASON="$LSPO_TORCH_VENV exists and is not a venv: not replacing it (set LSPO_TORCH_VENV)"
    return 1
  fi
  echo "gpu: making the CUDA PyTorch environment $LSPO_TORCH_VENV ($LSPO_TORCH_PIN from PyPI" \
       "with its CUDA $LSPO_TORCH_PIN_CUDA_MAJOR libraries: 2.7 GB to download, 4.7 GB installed)"
  lspo_gpu_run rm -rf "$LSPO_TORCH_VENV"
  lspo_gpu_run python3 -m venv "$LSPO_TORCH_VENV"
  lspo_gpu_run "$LSPO_TORCH_VENV/bin/python" -m pip install --disable-pip-version-check \
    --progress-bar off "$LSPO_TORCH_PIN"
  if _lspo_gpu_dry; then
    echo "dry run: echo $LSPO_TORCH_PIN > $LSPO_TORCH_VENV/.lspo-stamp"
    LSPO_GPU_REASON="dry run: $LSPO_TORCH_VENV was not made"
    return 1
  fi
  if [ -x "$LSPO_TORCH_VENV/bin/python" ] && echo "$LSPO_TORCH_PIN" >"$LSPO_TORCH_VENV/.lspo-stamp" &&
    _lspo_gpu_venv_ok; then
    return 0
  fi
  LSPO_GPU_REASON="could not make $LSPO_TORCH_VENV with $LSPO_TORCH_PIN (python3-venv missing, PyPI unreachable or the disk full? the output above says)"
  return 1
}

lspo_gpu_torch_prepare() {
  local py out rc=0 key val cap_major cap_minor
  local version="" cuda="" abi="" cmake="" root="" avail="" cap="" device=""
  LSPO_TORCH_PY="" LSPO_TORCH_VERSION="" LSPO_TORCH_CUDA="" LSPO_TORCH_ROOT=""
  LSPO_TORCH_CMAKE="" LSPO_TORCH_PREFIXES="" LSPO_TORCH_ARCH="" LSPO_CUDA_ARCHS=""
  LSPO_NVCC_PATH="" LSPO_NVCC_VERSION="" LSPO_GPU_REASON=""
  _lspo_gpu_find_nvcc || return 1
  if [ -n "${LSPO_TORCH_PYTHON:-}" ]; then
    py=$LSPO_TORCH_PYTHON
    if ! command -v "$py" >/dev/null 2>&1; then
      LSPO_GPU_REASON="LSPO_TORCH_PYTHON=$py is not a program"
      return 1
    fi
  else
    _lspo_gpu_venv || return 1
    py=$LSPO_TORCH_VENV/bin/python
  fi
  out=$("$py" -c "$_LSPO_TORCH_PROBE" 2>&1) || rc=$?
  if [ "$rc" != 0 ]; then
    LSPO_GPU_REASON="cannot import torch with $py: $(printf '%s\n' "$out" | tail -n 1)"
    return 1
  fi
  while IFS='=' read -r key val; do
    case $key in
      version) version=$val ;;
      cuda) cuda=$val ;;
      cxx11_abi) abi=$val ;;
      cmake_prefix_path) cmake=$val ;;
      root) root=$val ;;
      cuda_available) avail=$val ;;
      capability) cap=$val ;;
      device) device=$val ;;
    esac
  done <<<"$out"
  echo "gpu: torch $version from $py: CUDA ${cuda:-none}, C++11 ABI $abi," \
       "torch.cuda.is_available() $avail${cap:+, capability $cap${device:+ ($device)}}"
  echo "gpu:   package root $root; cmake prefix $cmake; nvcc $LSPO_NVCC_VERSION ($LSPO_NVCC_PATH)"
  if [ -z "$cuda" ]; then
    LSPO_GPU_REASON="torch $version ($py) is a CPU-only build"
    return 1
  fi
  if [ "$abi" != True ]; then
    LSPO_GPU_REASON="torch $version ($py) uses the pre-C++11 ABI (torch._C._GLIBCXX_USE_CXX11_ABI is $abi): it cannot be linked with Debian's gRPC/Abseil/glog; use a wheel with the C++11 ABI (torch >= 2.7, e.g. $LSPO_TORCH_PIN; docs/gpu.md, \"ABI\")"
    return 1
  fi
  if [ "$avail" != True ]; then
    LSPO_GPU_REASON="torch $version ($py) cannot use the GPU (torch.cuda.is_available() is $avail: a driver too old for CUDA $cuda, or no device visible to this process)"
    return 1
  fi
  if [ "${cuda%%.*}" != "${LSPO_NVCC_VERSION%%.*}" ]; then
    LSPO_GPU_REASON="torch $version is built for CUDA $cuda but nvcc ($LSPO_NVCC_PATH) is CUDA $LSPO_NVCC_VERSION: one CUDA major version per process (set LSPO_NVCC, PATH or LSPO_TORCH_PYTHON)"
    return 1
  fi
  cap_major=${cap%%.*} cap_minor=${cap#*.}
  if ! [[ $cap =~ ^[0-9]+\.[0-9]+$ ]]; then
    LSPO_GPU_REASON="torch $version reports no compute capability for device 0 ('$cap')"
    return 1
  fi
  if [ "$cap_major" -lt 7 ] || { [ "$cap_major" = 7 ] && [ "$cap_minor" -lt 5 ]; }; then
    LSPO_GPU_REASON="the GPU's compute capability $cap is below 7.5, the oldest that CUDA 13 (nvcc and this torch) supports"
    return 1
  fi
  # shellcheck disable=SC2034  # for the scripts that source this file
  LSPO_TORCH_PY=$py LSPO_TORCH_VERSION=$version LSPO_TORCH_CUDA=$cuda LSPO_TORCH_ROOT=$root
  # shellcheck disable=SC2034
  LSPO_TORCH_CMAKE=$cmake LSPO_TORCH_PREFIXES="$root;$cmake"
  LSPO_TORCH_ARCH=$cap LSPO_CUDA_ARCHS=$cap_major$cap_minor
  return 0
}

# lspo_gpu_build [TARGET...]: after lspo_gpu_torch_prepare. Configures LSPO_GPU_BUILD_DIR when
# it is new or was configured with another LibTorch, nvcc or architecture (the cache is then
# started anew), and builds the targets. Returns the first failing command's status.
lspo_gpu_build() {
  local dir=${LSPO_GPU_BUILD_DIR:-build-cuda} jobs=${LSPO_BUILD_JOBS:-$(nproc)} targets=("$@")
  local cfg want
  [ ${#targets[@]} -gt 0 ] || targets=(lspctl)
  if [ -z "${LSPO_TORCH_PREFIXES:-}" ]; then
    echo "gpu: lspo_gpu_build needs lspo_gpu_torch_prepare first" >&2
    return 2
  fi
  # docs/gpu.md, "A CUDA LibTorch from pip": the torch package root first on the prefix path
  # (its lib/ wins over Debian's libtorch), the architectures pinned to this GPU's.
  cfg=(cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
       "-DCMAKE_PREFIX_PATH=$LSPO_TORCH_PREFIXES" "-DCMAKE_CUDA_COMPILER=$LSPO_NVCC_PATH"
       "-DCMAKE_CUDA_ARCHITECTURES=$LSPO_CUDA_ARCHS" "-DTORCH_CUDA_ARCH_LIST=$LSPO_TORCH_ARCH")
  want=$(_lspo_gpu_quote "${cfg[@]}")
  if [ -f "$dir/build.ninja" ] && [ "$(cat "$dir/lspo-gpu-configure.txt" 2>/dev/null)" = "$want" ]; then
    echo "gpu: $dir/ is configured (LibTorch $LSPO_TORCH_VERSION, TORCH_CUDA_ARCH_LIST=$LSPO_TORCH_ARCH)"
  else
    echo "gpu: configuring $dir/ (LibTorch $LSPO_TORCH_VERSION from $LSPO_TORCH_ROOT," \
         "TORCH_CUDA_ARCH_LIST=$LSPO_TORCH_ARCH, CMAKE_CUDA_ARCHITECTURES=$LSPO_CUDA_ARCHS)"
    lspo_gpu_run rm -f "$dir/CMakeCache.txt" || return
    lspo_gpu_run "${cfg[@]}" || return
    if ! _lspo_gpu_dry; then echo "$want" >"$dir/lspo-gpu-configure.txt"; fi
  fi
  lspo_gpu_run cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
}

# lspo_gpu_setup: scripts/setup's GPU part. Without a GPU: the one line of lspo_gpu_detect.
# With one: makes or checks the CUDA PyTorch environment. Returns 1 only under LSPO_GPU=1 when
# the GPU path is not usable.
lspo_gpu_setup() {
  if ! lspo_gpu_detect setup; then
    [ "${LSPO_GPU:-}" != 1 ] || { echo "setup: LSPO_GPU=1 needs the GPU path" >&2; return 1; }
    return 0
  fi
  if lspo_gpu_torch_prepare; then
    echo "setup: GPU build ready: LibTorch $LSPO_TORCH_VERSION from $LSPO_TORCH_PY," \
         "TORCH_CUDA_ARCH_LIST=$LSPO_TORCH_ARCH (scripts/quickstart builds ${LSPO_GPU_BUILD_DIR:-build-cuda}/)"
    return 0
  fi
  echo "setup: the GPU cannot be used ($LSPO_GPU_REASON): CPU build"
  [ "${LSPO_GPU:-}" != 1 ] || { echo "setup: LSPO_GPU=1 needs the GPU path" >&2; return 1; }
  return 0
}
