# Sourced by scripts/setup and scripts/test (not run): the build caches that a fresh clone on
# the same machine reuses (docs/testing.md, "Build caches").
#
#   $LSPO_CACHE_DIR (default ~/.cache/lsp-offload), outside every clone:
#     ccache/      ccache's store for every CMake build directory (CMakeLists.txt sets the
#                  launcher); bounded by ccache itself (max_size, LSPO_CCACHE_MAXSIZE, 12G)
#     bazel-disk/  Bazel's --disk_cache (action results, content-addressed); Bazel 4 never
#                  trims it, so lspo_caches_prepare empties it when it has grown past
#                  LSPO_BAZEL_DISK_CACHE_MAX_MB (default 16384)
#     bazel-repo/  Bazel's --repository_cache
#
# Every entry of both caches is keyed by content (ccache: the hash of the source, its headers
# and the flags; Bazel: the digest of an action's inputs and command line), never by file times.
# A store that is missing, not a directory, not writable or unreadable by ccache is made anew;
# when that is not possible the caches are turned off: a damaged cache costs a cold build,
# never a failed run.

# The root: LSPO_CACHE_DIR (made absolute against the current folder, as CMake does against
# the source root: both are the repository root in the scripts), else ~/.cache/lsp-offload.
_lspo_home=${HOME:-}
[ -n "$_lspo_home" ] || _lspo_home=$(getent passwd "$(id -u)" 2>/dev/null | cut -d: -f6)
[ -n "$_lspo_home" ] || _lspo_home=/tmp/lspo-home-$(id -u)
LSPO_CACHE_ROOT=${LSPO_CACHE_DIR:-$_lspo_home/.cache/lsp-offload}
case "$LSPO_CACHE_ROOT" in /*) ;; *) LSPO_CACHE_ROOT=$PWD/$LSPO_CACHE_ROOT ;; esac
LSPO_CCACHE_DIR=$LSPO_CACHE_ROOT/ccache
LSPO_BAZEL_DISK_CACHE=$LSPO_CACHE_ROOT/bazel-disk
LSPO_BAZEL_REPO_CACHE=$LSPO_CACHE_ROOT/bazel-repo
# Flags for every bazel command of the scripts (.bazelrc names the default location too).
LSPO_BAZEL_CACHE_FLAGS=(--disk_cache="$LSPO_BAZEL_DISK_CACHE"
                        --repository_cache="$LSPO_BAZEL_REPO_CACHE")

# lspo_caches_disable WHY: builds go on without the caches: ccache passes every compile
# straight to the compiler (CCACHE_DISABLE reaches it through CMake's launcher) and Bazel runs
# with empty --disk_cache / --repository_cache (off, overriding .bazelrc).
lspo_caches_disable() {
  echo "caches: $1: building without the caches"
  export CCACHE_DISABLE=1
  LSPO_BAZEL_CACHE_FLAGS=(--disk_cache= --repository_cache=)
}

# _lspo_writable_dir DIR: DIR is a directory this user can create files in.
_lspo_writable_dir() {
  [ -d "$1" ] && [ -w "$1" ] && [ -x "$1" ] && touch "$1/.lspo-probe" 2>/dev/null &&
    rm -f "$1/.lspo-probe" 2>/dev/null
}

# _lspo_fresh_subdir DIR WHAT: DIR (one of the three stores, inside the root) exists as a
# writable directory afterwards; anything else in its place (a file, a dangling link, an
# unwritable directory) is removed first. Returns non-zero when that fails.
_lspo_fresh_subdir() {
  local dir=$1 what=$2
  if { [ -e "$dir" ] || [ -L "$dir" ]; } && ! _lspo_writable_dir "$dir"; then
    echo "caches: $what at $dir is not a writable directory: removing it and starting empty"
    rm -rf "$dir" 2>/dev/null || return 1
  fi
  mkdir -p "$dir" 2>/dev/null && _lspo_writable_dir "$dir"
}

# lspo_caches_prepare: checks and (re)creates the three stores, writes ccache's size bound,
# and empties the Bazel disk cache when it is over its bound. The root itself is never
# removed (LSPO_CACHE_DIR may name a folder of the user's): when it cannot be used, or a store
# cannot be mended, the caches are turned off for this shell. Always returns 0.
lspo_caches_prepare() {
  if ! { mkdir -p "$LSPO_CACHE_ROOT" 2>/dev/null && _lspo_writable_dir "$LSPO_CACHE_ROOT"; }; then
    lspo_caches_disable "the cache root $LSPO_CACHE_ROOT is not a writable directory"
    return 0
  fi
  _lspo_fresh_subdir "$LSPO_CCACHE_DIR" "the ccache store" &&
    _lspo_fresh_subdir "$LSPO_BAZEL_DISK_CACHE" "the Bazel disk cache" &&
    _lspo_fresh_subdir "$LSPO_BAZEL_REPO_CACHE" "the Bazel repository cache" ||
    { lspo_caches_disable "a store under $LSPO_CACHE_ROOT cannot be made anew"; return 0; }
  if command -v ccache >/dev/null; then
    # A ccache.conf that ccache cannot parse makes every compile fail: start that store anew.
    if ! ccache -d "$LSPO_CCACHE_DIR" -M "${LSPO_CCACHE_MAXSIZE:-12G}" >/dev/null 2>&1; then
      echo "caches: ccache cannot use $LSPO_CCACHE_DIR (corrupt configuration?): starting it empty"
      rm -rf "$LSPO_CCACHE_DIR" 2>/dev/null; mkdir -p "$LSPO_CCACHE_DIR" 2>/dev/null
      ccache -d "$LSPO_CCACHE_DIR" -M "${LSPO_CCACHE_MAXSIZE:-12G}" >/dev/null 2>&1 ||
        { lspo_caches_disable "ccache cannot use $LSPO_CCACHE_DIR"; return 0; }
    fi
  fi
  local mb max=${LSPO_BAZEL_DISK_CACHE_MAX_MB:-16384}
  mb=$(du -sm "$LSPO_BAZEL_DISK_CACHE" 2>/dev/null | cut -f1) || true
  if [ -n "$mb" ] && [ "$mb" -gt "$max" ]; then
    echo "caches: the Bazel disk cache holds $mb MiB > $max MiB (LSPO_BAZEL_DISK_CACHE_MAX_MB): emptying it"
    rm -rf "$LSPO_BAZEL_DISK_CACHE" 2>/dev/null; mkdir -p "$LSPO_BAZEL_DISK_CACHE" 2>/dev/null
  fi
  return 0
}

# lspo_caches_check: for a shell that did not prepare the caches itself (scripts/test after
# scripts/setup): turns them off unless both stores are writable directories.
lspo_caches_check() {
  _lspo_writable_dir "$LSPO_CCACHE_DIR" && _lspo_writable_dir "$LSPO_BAZEL_DISK_CACHE" ||
    lspo_caches_disable "$LSPO_CCACHE_DIR or $LSPO_BAZEL_DISK_CACHE is not a writable directory"
  return 0
}

# lspo_ccache_counts: prints "HITS MISSES" of the ccache store so far (ccache's own counters;
# uncacheable calls, such as links, are in neither). "0 0" without ccache.
lspo_ccache_counts() {
  if ! command -v ccache >/dev/null; then echo "0 0"; return; fi
  ccache -d "$LSPO_CCACHE_DIR" --print-stats 2>/dev/null | awk '
    $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { h += $2 }
    $1 == "cache_miss" { m += $2 }
    END { printf "%d %d\n", h, m }'
}

# lspo_ccache_report BEFORE_HITS BEFORE_MISSES: one line with the hit rate since those counts.
lspo_ccache_report() {
  local h m dh dm
  read -r h m < <(lspo_ccache_counts)
  dh=$((h - $1)); dm=$((m - $2))
  if [ $((dh + dm)) = 0 ]; then
    echo "ccache: no compilation went through the cache"
  else
    echo "ccache: $dh hits, $dm misses ($((100 * dh / (dh + dm)))% hit rate; store $LSPO_CCACHE_DIR, $(du -sh "$LSPO_CCACHE_DIR" 2>/dev/null | cut -f1))"
  fi
}
