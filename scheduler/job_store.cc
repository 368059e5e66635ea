#include "scheduler/job_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace lspo::scheduler {
namespace {

namespace fs = std::filesystem;

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 200) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

absl::Status Errno(absl::string_view what, const std::string& path, int err) {
  const std::string msg = absl::StrCat(what, " '", path, "': ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace

absl::StatusOr<JobStore> JobStore::Open(const std::string& state_dir) {
  const std::string dir = state_dir + "/jobs";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot create the job state directory '", dir, "'",
        ec ? absl::StrCat(": ", ec.message()) : std::string(),
        ": pass a writable --state_dir"));
  }
  ::chmod(dir.c_str(), 0700);
  return JobStore(dir);
}

absl::Status JobStore::Save(const lspo::v1::JobStatus& status) const {
  if (!ValidId(status.job_id())) {
    return absl::InvalidArgumentError(absl::StrCat("bad job id '", status.job_id(), "'"));
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.add_whitespace = true;
  auto st = google::protobuf::util::MessageToJsonString(status, &json, o);
  if (!st.ok()) return absl::InternalError(std::string(st.message()));
  const std::string path = dir_ + "/" + status.job_id() + ".json";
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("create", tmp, errno);
  size_t done = 0;
  while (done < json.size()) {
    ssize_t n = ::write(fd, json.data() + done, json.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Errno("write", tmp, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Errno("fsync", tmp, err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Errno("rename", tmp, err);
  }
  int dfd = ::open(dir_.c_str(), O_DIRECTORY | O_RDONLY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

std::vector<lspo::v1::JobStatus> JobStore::LoadAll(std::vector<std::string>* skipped) const {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && absl::EndsWith(name, ".json")) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  std::vector<lspo::v1::JobStatus> out;
  for (const std::string& path : files) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    lspo::v1::JobStatus status;
    google::protobuf::util::JsonParseOptions o;
    o.ignore_unknown_fields = true;
    auto st = google::protobuf::util::JsonStringToMessage(ss.str(), &status, o);
    const std::string expect = fs::path(path).stem().string();
    if (!st.ok() || status.job_id() != expect) {
      if (skipped != nullptr) {
        skipped->push_back(absl::StrCat(path, ": ", st.ok() ? "job id differs from the file name"
                                                            : std::string(st.message())));
      }
      std::rename(path.c_str(), (path + ".corrupt").c_str());
      continue;
    }
    out.push_back(std::move(status));
  }
  return out;
}

}  // namespace lspo::scheduler
