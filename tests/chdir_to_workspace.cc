// Bazel-only: chdir() to the source root before main(). See tests/chdir_to_workspace.h.
#include "tests/chdir_to_workspace.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace lspo::tests {
namespace {

// Must match workspace(name = ...) in WORKSPACE; $TEST_WORKSPACE overrides it.
constexpr char kWorkspaceName[] = "lsp_offload";

std::string Getenv(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? std::string() : std::string(value);
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

std::string CurrentDir() {
  char buf[PATH_MAX];
  return getcwd(buf, sizeof(buf)) == nullptr ? std::string() : std::string(buf);
}

std::string Absolute(const std::string& path, const std::string& cwd) {
  if (path.empty() || path[0] == '/' || cwd.empty()) return path;
  return cwd + "/" + path;
}

std::string RealPath(const std::string& path) {
  char buf[PATH_MAX];
  return realpath(path.c_str(), buf) == nullptr ? std::string() : std::string(buf);
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string FindRunfilesDir() {
  const std::string cwd = CurrentDir();
  std::string workspace = Getenv("TEST_WORKSPACE");
  if (workspace.empty()) workspace = kWorkspaceName;
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    const std::string root = Getenv(var);
    if (root.empty()) continue;
    const std::string dir = Absolute(root, cwd) + "/" + workspace;
    if (Exists(dir)) return dir;
  }
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    const std::string dir = std::string(exe) + ".runfiles/" + workspace;
    if (Exists(dir)) return dir;
  }
  return std::string();
}

std::string FindSourceRoot(const std::string& runfiles_dir) {
  const std::string from_bazel_run = Getenv("BUILD_WORKSPACE_DIRECTORY");
  if (!from_bazel_run.empty() && Exists(from_bazel_run + "/WORKSPACE")) return from_bazel_run;
  if (runfiles_dir.empty()) return std::string();
  const std::string workspace_file = RealPath(runfiles_dir + "/WORKSPACE");
  return workspace_file.empty() ? std::string() : Dirname(workspace_file);
}

struct Dirs {
  std::string runfiles;
  std::string source_root;
};

// Computed once, before the chdir (relative runfiles variables are relative to the original
// working directory).
const Dirs& GetDirs() {
  static const Dirs* const dirs = [] {
    auto* d = new Dirs;
    d->runfiles = FindRunfilesDir();
    d->source_root = FindSourceRoot(d->runfiles);
    return d;
  }();
  return *dirs;
}

const bool kChangedDir = [] {
  const Dirs& dirs = GetDirs();
  if (dirs.source_root.empty()) {
    std::fprintf(stderr,
                 "chdir_to_workspace: source root not found (no $BUILD_WORKSPACE_DIRECTORY and "
                 "no runfile WORKSPACE under '%s'); staying in '%s'\n",
                 dirs.runfiles.c_str(), CurrentDir().c_str());
    return false;
  }
  if (chdir(dirs.source_root.c_str()) != 0) {
    std::perror(("chdir_to_workspace: chdir(" + dirs.source_root + ")").c_str());
    return false;
  }
  return true;
}();

}  // namespace

const std::string& RunfilesDir() { return GetDirs().runfiles; }

std::string RunfilePath(const std::string& path_in_workspace) {
  return GetDirs().runfiles + "/" + path_in_workspace;
}

const std::string& SourceRoot() { return GetDirs().source_root; }

}  // namespace lspo::tests
