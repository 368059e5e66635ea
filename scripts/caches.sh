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
# A cache directory that is missing, not a directory, not writable or unreadable by ccache is
# made anew: a damaged cache costs a cold build, never a failed run.

LSPO_CACHE_ROOT=${LSPO_CACHE_DIR:-$HOME/.cache/lsp-offload}
LSPO_CCACHE_DIR=$LSPO_CACHE_ROOT/ccache
LSPO_BAZEL_DISK_CACHE=$LSPO_CACHE_ROOT/bazel-disk
LSPO_BAZEL_REPO_CACHE=$LSPO_CACHE_ROOT/bazel-repo
# Flags for every bazel command of the scripts (.bazelrc names the default location too).
LSPO_BAZEL_CACHE_FLAGS=(--disk_cache="$LSPO_BAZEL_DISK_CACHE"
                        --repository_cache="$LSPO_BAZEL_REPO_CACHE")

# _lspo_fresh_dir DIR WHAT: DIR exists as a writable directory afterwards; anything else in its
# place (a file, a dangling link, an unwritable directory) is removed first.
_lspo_fresh_dir() {
  local dir=$1 what=$2
  if [ -e "$dir" ] || [ -L "$dir" ]; then
    if [ ! -d "$dir" ] || [ ! -w "$dir" ] || [ ! -x "$dir" ] || ! touch "$dir/.lspo-probe" 2>/dev/null; then
      echo "caches: $what at $dir is not a writable directory: removing it and starting empty"
      chmod -R u+rwx "$dir" 2>/dev/null || true
      rm -rf "$dir"
    fi
    rm -f "$dir/.lspo-probe" 2>/dev/null || true
  fi
  mkdir -p "$dir"
}

# lspo_caches_prepare: checks and (re)creates the three cache directories, writes ccache's
# size bound, and empties the Bazel disk cache when it is over its bound. Never fails the caller.
lspo_caches_prepare() {
  _lspo_fresh_dir "$LSPO_CACHE_ROOT" "the cache root"
  _lspo_fresh_dir "$LSPO_CCACHE_DIR" "the ccache store"
  _lspo_fresh_dir "$LSPO_BAZEL_DISK_CACHE" "the Bazel disk cache"
  _lspo_fresh_dir "$LSPO_BAZEL_REPO_CACHE" "the Bazel repository cache"
  if command -v ccache >/dev/null; then
    # A ccache.conf that ccache cannot parse makes every compile fail: start that store anew.
    if ! ccache -d "$LSPO_CCACHE_DIR" -M "${LSPO_CCACHE_MAXSIZE:-12G}" >/dev/null 2>&1; then
      echo "caches: ccache cannot use $LSPO_CCACHE_DIR (corrupt configuration?): starting it empty"
      rm -rf "$LSPO_CCACHE_DIR"; mkdir -p "$LSPO_CCACHE_DIR"
      ccache -d "$LSPO_CCACHE_DIR" -M "${LSPO_CCACHE_MAXSIZE:-12G}" >/dev/null 2>&1 || true
    fi
  fi
  local mb max=${LSPO_BAZEL_DISK_CACHE_MAX_MB:-16384}
  mb=$(du -sm "$LSPO_BAZEL_DISK_CACHE" 2>/dev/null | cut -f1)
  if [ -n "$mb" ] && [ "$mb" -gt "$max" ]; then
    echo "caches: the Bazel disk cache holds $mb MiB > $max MiB (LSPO_BAZEL_DISK_CACHE_MAX_MB): emptying it"
    rm -rf "$LSPO_BAZEL_DISK_CACHE"; mkdir -p "$LSPO_BAZEL_DISK_CACHE"
  fi
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
