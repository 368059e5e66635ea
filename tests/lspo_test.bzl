"""lspo_test: the Bazel twin of CMake's lspo_test() (top-level CMakeLists.txt).

One gtest binary linked with GoogleTest + GMock + gtest_main and //:base (lspo_base), plus
LibTorch when torch = True. Unlike CTest, Bazel starts a test in its runfiles tree, so every
test also links //tests:chdir_to_workspace, which chdir()s to the source root before main():
the tests then read models/, tests/oracle/data/ and datasets/ by the same relative paths.
They read files outside the workspace, so they are tagged "local" (never sandboxed, cached
remotely or executed remotely; nothing is downloaded).
"""

load("@local_cuda//:defs.bzl", "HAS_CUDA")

def lspo_test(
        name,
        srcs,
        deps = [],
        torch = False,
        cuda = False,
        labels = [],
        tags = [],
        **kwargs):
    """Declares a cc_test like CMake's lspo_test(name SOURCES ... DEPS ... [TORCH] [LABELS ...]).

    Args:
      name: test name (same as the CMake one).
      srcs: test sources (same as CMake's SOURCES).
      deps: libraries under test (CMake's DEPS, as Bazel labels).
      torch: link LibTorch (CMake's TORCH).
      cuda: declare the test only when a CUDA toolkit was found (CMake: if(LSPO_HAS_CUDA)).
      labels: CMake LABELS, added as tags ("integration", "serial", "cuda"); "serial" also
        tags the test "exclusive".
      tags: further tags.
      **kwargs: passed to cc_test (timeout, data, copts, local_defines, ...).
    """
    if cuda and not HAS_CUDA:
        return
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps + [
            "//:base",
            "//tests:chdir_to_workspace",
            "//tests:test_files",
            "//third_party/gtest:gmock",
            "//third_party/gtest:gtest_main",
            "//third_party/gtest:gtest",
        ] + (["//third_party/torch"] if torch else []),
        # Static libraries, like the CMake build (fewer link actions than per-library .so).
        linkstatic = True,
        # "serial" (binds loopback ports or asserts wall times) runs alone, as CTest's
        # RUN_SERIAL does for the same label.
        tags = ["local"] + labels + tags + (["exclusive"] if "serial" in labels else []),
        **kwargs
    )

def lspo_integration_test(
        name,
        srcs = [],
        deps = [],
        embedded = True,
        labels = [],
        **kwargs):
    """An integration test: lspo_test of `name`.cc with the shared job helpers.

    Every integration test trains small jobs and checks /dev/shm for leftover "lspo-job"
    segments, so it is tagged "exclusive" (never alongside another test) and has no timeout
    short of "eternal"; CMake gives the same tests LABELS integration (tests/integration/
    CMakeLists.txt), and CI runs that label one test at a time.

    Args:
      name: test name; its source is `name`.cc.
      srcs: further sources besides `name`.cc and test_jobs.h.
      deps: libraries under test.
      embedded: the test starts the services in-process (start_embedded.h, //client:embedded).
      labels: CMake LABELS besides "integration" (e.g. "cuda").
      **kwargs: passed to lspo_test (torch, copts, data, ...).
    """
    lspo_test(
        name = name,
        srcs = [name + ".cc", "test_jobs.h"] + (["start_embedded.h"] if embedded else []) + srcs,
        deps = deps + (["//client:embedded"] if embedded else []),
        timeout = "eternal",
        labels = ["integration"] + labels,
        tags = ["exclusive"],
        **kwargs
    )
