#!/usr/bin/env python3
"""Tests of scripts/check_test_lists (CMake's and Bazel's test targets and labels compared) on
listings written here in the formats of `ctest --show-only=json-v1` and
`bazel query --output=build`. Standard library unittest; run by CTest (tests/CMakeLists.txt)."""

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "check_test_lists")


def _load_checker():
    """scripts/check_test_lists as a module (the file has no .py suffix)."""
    loader = importlib.machinery.SourceFileLoader("check_test_lists", SCRIPT)
    spec = importlib.util.spec_from_loader("check_test_lists", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


# Every CMake-only script test the checker expects (it fails when one of them is missing):
# the checker's own list, so that a test added there needs no second edit here.
PLAIN = sorted(_load_checker().CMAKE_ONLY)


def ctest_case(name, exe, labels=()):
    """One test of ctest's json-v1 listing, as gtest_discover_tests declares it."""
    props = [{"name": "WORKING_DIRECTORY", "value": "/src"}]
    if labels:
        props.append({"name": "LABELS", "value": list(labels)})
    return {"name": name, "command": [f"/src/build/tests/{exe}", f"--gtest_filter={name}"],
            "properties": props}


def bazel_rule(name, tags):
    """One cc_test as `bazel query --output=build` prints it."""
    tag_list = ", ".join(f'"{t}"' for t in tags)
    return (f"# /src/tests/BUILD.bazel:1:10\ncc_test(\n  name = \"{name}\",\n"
            f"  tags = [{tag_list}],\n  srcs = [\"//tests:{name}.cc\"],\n)\n")


class CheckTestListsTest(unittest.TestCase):
    def run_check(self, cases, rules, plain=PLAIN, smoke=()):
        tests = cases + [{"name": p, "command": ["/bin/sh", "x.sh"], "properties": []}
                         for p in plain]
        with tempfile.TemporaryDirectory() as tmp:
            cj, bq = os.path.join(tmp, "c.json"), os.path.join(tmp, "q.txt")
            with open(cj, "w") as f:
                json.dump({"kind": "ctestInfo", "tests": tests}, f)
            with open(bq, "w") as f:
                f.write("\n".join(rules))
            sm = os.path.join(tmp, "smoke.txt")
            with open(sm, "w") as f:
                f.write("# comment\n\n" + "\n".join(smoke) + "\n")
            return subprocess.run([SCRIPT, "--cmake-json", cj, "--bazel-query", bq,
                                   "--smoke", sm],
                                  capture_output=True, text=True, timeout=60)

    def test_the_same_targets_and_labels_pass(self):
        r = self.run_check(
            [ctest_case("A.One", "a_test"), ctest_case("A.Two", "a_test"),
             ctest_case("J.Runs", "job_test", ["integration", "cuda"]),
             ctest_case("b_test_NOT_BUILT", "b_test")],
            [bazel_rule("a_test", ["local"]), bazel_rule("b_test", ["local"]),
             bazel_rule("job_test", ["local", "integration", "cuda", "exclusive"])])
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn(f"{3 + len(PLAIN)} passed, 0 failed", r.stdout)

    def test_a_target_in_one_build_only_fails_naming_it(self):
        r = self.run_check([ctest_case("A.One", "a_test"), ctest_case("C.One", "c_test")],
                           [bazel_rule("a_test", ["local"]), bazel_rule("d_test", ["local"])])
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAIL c_test: a CMake test target with no Bazel cc_test", r.stdout)
        self.assertIn("FAIL d_test: a Bazel cc_test with no CMake lspo_test", r.stdout)
        self.assertIn("2 failed", r.stdout)

    def test_labels_that_differ_fail(self):
        r = self.run_check([ctest_case("J.Runs", "job_test", ["integration"])],
                           [bazel_rule("job_test", ["local", "integration", "cuda"])])
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAIL job_test: labels differ: CMake ['integration'], "
                      "Bazel ['cuda', 'integration']", r.stdout)

    def test_an_unlisted_script_test_and_a_stale_listing_fail(self):
        plain = [p for p in PLAIN if p != "caches_test"] + ["new_script_check"]
        r = self.run_check([ctest_case("A.One", "a_test")], [bazel_rule("a_test", ["local"])],
                           plain=plain)
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAIL new_script_check: a CTest test that is neither", r.stdout)
        self.assertIn("FAIL caches_test: listed in CMAKE_ONLY but CTest has no such test",
                      r.stdout)


    def test_labels_of_a_binary_not_built_yet_are_not_compared(self):
        r = self.run_check([ctest_case("job_test_NOT_BUILT", "job_test")],
                           [bazel_rule("job_test", ["local", "integration"])])
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_a_smoke_filter_must_select_a_case(self):
        cases = [ctest_case("J.Runs", "job_test", ["integration"]),
                 ctest_case("J.Fails", "job_test", ["integration"])]
        rules = [bazel_rule("job_test", ["local", "integration"])]
        ok = self.run_check(cases, rules, smoke=["//tests/integration:job_test J.Runs",
                                                 "//tests/integration:job_test J.*-J.Fails"])
        self.assertEqual(ok.returncode, 0, ok.stdout)
        bad = self.run_check(cases, rules, smoke=["//tests/integration:job_test J.Renamed",
                                                  "//tests/integration:gone_test A.B"])
        self.assertEqual(bad.returncode, 1)
        self.assertIn("FAIL smoke //tests/integration:job_test --test_filter=J.Renamed: "
                      "selects none of its 2 cases", bad.stdout)
        self.assertIn("FAIL smoke //tests/integration:gone_test: no such Bazel cc_test",
                      bad.stdout)


if __name__ == "__main__":
    unittest.main()
