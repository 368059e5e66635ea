// Bazel-only test support: makes a Bazel cc_test run from the repository root, as CTest does.
//
// Every Bazel test links //tests:chdir_to_workspace (see tests/lspo_test.bzl). Its static
// initializer runs before main() and chdir()s to the source root, so the tests' relative paths
// ("models/...", "tests/oracle/data/...", "datasets/...") resolve exactly as under CTest
// (WORKING_DIRECTORY = the source root). CMake does not build this file.
//
// The source root is, in order: $BUILD_WORKSPACE_DIRECTORY (set by `bazel run`); else the
// directory of the real file behind the runfile "WORKSPACE" (the runfiles tree holds symlinks
// into the source tree). If neither is found the working directory is left alone and a
// warning is printed to stderr; tests that need data then skip or fail with their own message.
#ifndef LSPO_TESTS_CHDIR_TO_WORKSPACE_H_
#define LSPO_TESTS_CHDIR_TO_WORKSPACE_H_

#include <string>

namespace lspo::tests {

// Absolute path of this workspace's runfiles directory ("<test>.runfiles/lsp_offload"), taken
// from $RUNFILES_DIR / $TEST_SRCDIR (set by `bazel test`) or "<binary>.runfiles" next to
// /proc/self/exe. Empty if none exists.
const std::string& RunfilesDir();

// Absolute path of a runfile given relative to the workspace root, e.g.
// RunfilePath("gpu_worker/lsp_gpu_worker") for a `data` dependency (`$(rootpath ...)`). Valid
// after the chdir as well (it does not depend on the working directory).
std::string RunfilePath(const std::string& path_in_workspace);

// Absolute path of the source root the initializer changed to; empty if none was found.
const std::string& SourceRoot();

}  // namespace lspo::tests

#endif  // LSPO_TESTS_CHDIR_TO_WORKSPACE_H_
