#!/usr/bin/env python3
"""Tests of scripts/caches.sh, the build caches a fresh clone reuses (docs/testing.md, "Build
caches"): a missing, misplaced or damaged cache is made anew and never fails a build; the
Bazel disk cache is emptied past its bound; ccache keys on content, so a changed header is
picked up and a damaged entry is recompiled, not served. Each case uses its own LSPO_CACHE_DIR
in a temporary folder. Standard library unittest; run by CTest (tests/CMakeLists.txt)."""

import os
import shutil
import subprocess
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAVE_CCACHE = shutil.which("ccache") is not None and shutil.which("cc") is not None


def bash(script, cache_dir, **env):
    """Runs `script` in bash after sourcing scripts/caches.sh with LSPO_CACHE_DIR=cache_dir;
    returns the CompletedProcess (stdout and stderr as text)."""
    e = dict(os.environ, LSPO_CACHE_DIR=cache_dir, **{k: str(v) for k, v in env.items()})
    return subprocess.run(["bash", "-c", f'set -u; . scripts/caches.sh; {script}'], cwd=REPO,
                          env=e, capture_output=True, text=True, timeout=120)


class CachesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="lspo-caches-")
        self.root = os.path.join(self.tmp, "cache")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def dirs(self):
        return [os.path.join(self.root, d) for d in ("ccache", "bazel-disk", "bazel-repo")]

    def test_missing_caches_are_created(self):
        r = bash("lspo_caches_prepare", self.root)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for d in self.dirs():
            self.assertTrue(os.path.isdir(d), d)

    def test_a_file_in_place_of_a_store_is_replaced(self):
        bash("lspo_caches_prepare", self.root)
        ccache = os.path.join(self.root, "ccache")
        shutil.rmtree(ccache)
        with open(ccache, "w") as f:
            f.write("not a directory")
        # The Bazel disk cache as a dangling link.
        disk = os.path.join(self.root, "bazel-disk")
        shutil.rmtree(disk)
        os.symlink(os.path.join(self.tmp, "nowhere"), disk)
        r = bash("lspo_caches_prepare; echo CCACHE_DISABLE=${CCACHE_DISABLE:-}", self.root)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("not a writable directory: removing it", r.stdout)
        self.assertIn("CCACHE_DISABLE=\n", r.stdout)  # the caches stay on
        for d in self.dirs():
            self.assertTrue(os.path.isdir(d) and not os.path.islink(d), d)

    def test_an_unusable_root_turns_the_caches_off_and_is_left_alone(self):
        # LSPO_CACHE_DIR naming a file (or any folder that cannot be used) is never removed:
        # the run goes on without caches.
        with open(self.root, "w") as f:
            f.write("a file of the user's")
        r = bash("lspo_caches_prepare; echo CCACHE_DISABLE=${CCACHE_DISABLE:-}; "
                 "echo FLAGS=${LSPO_BAZEL_CACHE_FLAGS[*]}", self.root)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("building without the caches", r.stdout)
        self.assertIn("CCACHE_DISABLE=1", r.stdout)
        self.assertIn("FLAGS=--disk_cache= --repository_cache=", r.stdout)
        with open(self.root) as f:
            self.assertEqual(f.read(), "a file of the user's")
        # A shell that did not prepare them (scripts/test after scripts/setup) checks too.
        r = bash("lspo_caches_check; echo CCACHE_DISABLE=${CCACHE_DISABLE:-}", self.root)
        self.assertIn("CCACHE_DISABLE=1", r.stdout)

    def test_a_relative_cache_dir_is_made_absolute(self):
        r = bash("echo $LSPO_CACHE_ROOT", "rel/cache")
        self.assertEqual(r.stdout.strip(), os.path.join(REPO, "rel/cache"))

    def test_bazel_disk_cache_past_its_bound_is_emptied(self):
        bash("lspo_caches_prepare", self.root)
        blob = os.path.join(self.root, "bazel-disk", "cas", "ab", "blob")
        os.makedirs(os.path.dirname(blob))
        with open(blob, "wb") as f:
            f.write(os.urandom(3 << 20))  # 3 MiB
        r = bash("lspo_caches_prepare", self.root, LSPO_BAZEL_DISK_CACHE_MAX_MB=8)
        self.assertTrue(os.path.exists(blob), "emptied under its bound: " + r.stdout)
        r = bash("lspo_caches_prepare", self.root, LSPO_BAZEL_DISK_CACHE_MAX_MB=2)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("emptying it", r.stdout)
        self.assertFalse(os.path.exists(blob))
        self.assertTrue(os.path.isdir(os.path.join(self.root, "bazel-disk")))

    @unittest.skipUnless(HAVE_CCACHE, "ccache or cc not installed")
    def test_unreadable_ccache_configuration_is_replaced_and_size_bounded(self):
        bash("lspo_caches_prepare", self.root, LSPO_CCACHE_MAXSIZE="3G")
        conf = os.path.join(self.root, "ccache", "ccache.conf")
        with open(conf) as f:
            self.assertIn("max_size = 3G", f.read())
        with open(conf, "w") as f:
            f.write("max_size = what\n")  # ccache refuses every call with this file
        r = bash("lspo_caches_prepare", self.root)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("starting it empty", r.stdout)
        with open(conf) as f:
            self.assertIn("max_size = 12G", f.read())

    @unittest.skipUnless(HAVE_CCACHE, "ccache or cc not installed")
    def test_ccache_keys_on_content_and_recompiles_a_damaged_entry(self):
        bash("lspo_caches_prepare", self.root)
        src = os.path.join(self.tmp, "src")
        os.makedirs(src)
        with open(os.path.join(src, "k.h"), "w") as f:
            f.write("#define K 3\n")
        with open(os.path.join(src, "a.c"), "w") as f:
            f.write('#include "k.h"\nint k(void) { return K; }\n')
        ccache_dir = os.path.join(self.root, "ccache")

        def compile_(out):
            r = subprocess.run(["ccache", "cc", "-O1", "-c", "a.c", "-o", out], cwd=src,
                               env=dict(os.environ, CCACHE_DIR=ccache_dir),
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(os.path.join(src, out), "rb") as f:
                return f.read()

        def counts():
            out = bash("lspo_ccache_counts", self.root).stdout.split()
            return int(out[0]), int(out[1])

        first = compile_("a1.o")
        self.assertEqual(counts(), (0, 1))
        self.assertEqual(compile_("a2.o"), first)
        self.assertEqual(counts(), (1, 1))
        report = bash("lspo_ccache_report 0 0", self.root).stdout
        self.assertIn("1 hits, 1 misses (50% hit rate", report)
        # A changed header is a different key: a miss and a different object, although the
        # source file and every file time but the header's are unchanged.
        with open(os.path.join(src, "k.h"), "w") as f:
            f.write("#define K 4\n")
        changed = compile_("a3.o")
        self.assertNotEqual(changed, first)
        self.assertEqual(counts(), (1, 2))
        # Damaged entries (every stored result and manifest overwritten) are recompiled.
        damaged = 0
        for dirpath, _, files in os.walk(ccache_dir):
            for name in files:
                if name.endswith(("R", "M")):
                    with open(os.path.join(dirpath, name), "wb") as f:
                        f.write(b"damaged")
                    damaged += 1
        self.assertGreater(damaged, 0)
        self.assertEqual(compile_("a4.o"), changed)
        self.assertEqual(counts(), (1, 3))
        self.assertEqual(compile_("a5.o"), changed)  # stored again: a hit
        self.assertEqual(counts(), (2, 3))


if __name__ == "__main__":
    unittest.main()
