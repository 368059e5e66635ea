#include "scheduler/job_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/file_io.h"
#include "runtime/proto_json.h"
#include "runtime/status_macros.h"

namespace lspo::scheduler {
namespace {

namespace fs = std::filesystem;

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 200) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

}  // namespace

absl::StatusOr<lspo::v1::JobStatus> ParseJobStoreRecord(absl::string_view text,
                                                        const std::string& path) {
  lspo::v1::JobStatus status;
  // Closed sets may be short names or, in files of earlier versions, the old strings.
  RETURN_IF_ERROR(runtime::ProtoFromJson(text, &status, path, /*ignore_unknown_fields=*/true));
  if (status.job_id() != fs::path(path).stem().string()) {
    return absl::InvalidArgumentError("job id differs from the file name");
  }
  return status;
}

absl::StatusOr<JobStore> JobStore::Open(const std::string& state_dir) {
  const std::string dir = state_dir + "/jobs";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot create the job state directory '", dir, "'",
        ec ? absl::StrCat(": ", ec.message()) : std::string(), ": pass a writable --state_dir"));
  }
  ::chmod(dir.c_str(), 0700);
  return JobStore(dir);
}

absl::StatusOr<JobStore> JobStore::OpenExclusive(const std::string& state_dir) {
  std::error_code ec;
  fs::create_directories(state_dir, ec);
  if (ec || !fs::is_directory(state_dir)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "cannot create the state directory '", state_dir, "'",
        ec ? absl::StrCat(": ", ec.message()) : std::string(), ": pass a writable --state_dir"));
  }
  const std::string path = state_dir + "/LOCK";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot open the state directory's lock '",
                                                    path, "': ", std::strerror(errno),
                                                    ": pass a writable --state_dir"));
  }
  auto lock = std::shared_ptr<const int>(new int(fd), [](const int* f) {
    ::close(*f);  // releases the flock
    delete f;
  });
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {0};
    const ssize_t n = ::pread(fd, pid, sizeof(pid) - 1, 0);
    std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : std::string();
    absl::StripAsciiWhitespace(&holder);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("the state directory '", state_dir, "' is in use by another lsp_scheduler",
                       holder.empty() ? std::string() : absl::StrCat(" (pid ", holder, ")"),
                       ", which holds ", path, ": stop it first, or pass another --state_dir"));
    }
    return absl::InternalError(absl::StrCat("cannot lock '", path, "': ", std::strerror(err)));
  }
  const std::string me = absl::StrCat(::getpid(), "\n");
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, me.data(), me.size(), 0) < 0) {
    // The pid is for the message of a second scheduler only; the lock holds without it.
  }
  ASSIGN_OR_RETURN(JobStore store, Open(state_dir));
  store.lock_ = std::move(lock);
  return store;
}

absl::Status JobStore::Save(const lspo::v1::JobStatus& status) const {
  if (!ValidId(status.job_id())) {
    return absl::InvalidArgumentError(absl::StrCat("bad job id '", status.job_id(), "'"));
  }
  const std::string json = runtime::ProtoToJson(status, runtime::ProtoJsonPrint::Pretty());
  const std::string path = dir_ + "/" + status.job_id() + ".json";
  // Replaced atomically (temp file, fsync, rename, fsync of the directory); 0600: specs may
  // name private paths.
  return runtime::WriteFileAtomically(path, json, 0600);
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
    absl::StatusOr<std::string> text = runtime::ReadFileToString(path, "job store file");
    lspo::v1::JobStatus status;
    std::string error;
    if (!text.ok()) {
      error = std::string(text.status().message());
    } else {
      absl::StatusOr<lspo::v1::JobStatus> parsed = ParseJobStoreRecord(*text, path);
      if (!parsed.ok()) {
        error = std::string(parsed.status().message());
      } else {
        status = *std::move(parsed);
      }
    }
    if (!error.empty()) {
      if (skipped != nullptr) skipped->push_back(absl::StrCat(path, ": ", error));
      std::rename(path.c_str(), (path + ".corrupt").c_str());
      continue;
    }
    out.push_back(std::move(status));
  }
  return out;
}

}  // namespace lspo::scheduler
