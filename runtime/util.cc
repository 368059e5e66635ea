#include "runtime/util.h"

#include <cinttypes>
#include <cstdio>
#include <fstream>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lspo::runtime {

absl::Status MakeDirs(const std::string& dir) {
  std::string cur;
  for (size_t i = 0; i <= dir.size(); ++i) {
    if ((i == dir.size() || dir[i] == '/') && !cur.empty() &&
        mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(absl::StrCat(
          "cannot create directory '", cur, "': ", std::strerror(errno),
          ". Choose a writable output_dir in the job spec"));
    }
    if (i < dir.size()) cur.push_back(dir[i]);
  }
  return absl::OkStatus();
}

int64_t PeakRssBytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      int64_t kb = 0;
      if (std::sscanf(line.c_str() + 6, "%" SCNd64, &kb) == 1) return kb * 1024;
    }
  }
  return 0;
}

}  // namespace lspo::runtime
