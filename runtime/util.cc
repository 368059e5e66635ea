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
    if ((i == dir.size() || dir[i] == '/') && !cur.empty() && mkdir(cur.c_str(), 0755) != 0 &&
        errno != EEXIST) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot create directory '", cur, "': ", std::strerror(errno),
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

bool ResetPeakRss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

absl::StatusOr<HostPort> ParseHostPort(const std::string& value, const std::string& field) {
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat(field, " = '", value, "' is invalid (", why,
                                                   "): use host:port, e.g. 10.0.0.5:29500"));
  };
  HostPort out;
  std::string port;
  if (!value.empty() && value[0] == '[') {
    const size_t close = value.find(']');
    if (close == std::string::npos || close + 1 >= value.size() || value[close + 1] != ':') {
      return bad("an IPv6 address needs [address]:port");
    }
    out.host = value.substr(1, close - 1);
    port = value.substr(close + 2);
  } else {
    const size_t colon = value.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    out.host = value.substr(0, colon);
    port = value.substr(colon + 1);
    if (out.host.find(':') != std::string::npos) return bad("an IPv6 address needs brackets");
  }
  if (out.host.empty()) return bad("no host");
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return bad("the port is not a number");
  }
  out.port = std::stoi(port);
  if (out.port < 1 || out.port > 65535) return bad("the port is not in 1..65535");
  return out;
}

}  // namespace lspo::runtime
