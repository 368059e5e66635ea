// Model ids from the local Hugging Face cache; see hf_cache.h.
#include "runtime/hf_cache.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace lspo::runtime {
namespace {

namespace fs = std::filesystem;

// The environment variable `name`, or "" when unset.
std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

// One part of an id: [A-Za-z0-9._-]+, not starting with '.' or '-', no "..".
bool IdPart(absl::string_view s) {
  if (s.empty() || s.size() > 96 || s[0] == '.' || s[0] == '-') return false;
  if (s.find("..") != absl::string_view::npos) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
  });
}

}  // namespace

bool LooksLikeModelId(absl::string_view path) {
  const size_t slash = path.find('/');
  if (slash == absl::string_view::npos || path.find('/', slash + 1) != absl::string_view::npos) {
    return false;
  }
  return IdPart(path.substr(0, slash)) && IdPart(path.substr(slash + 1));
}

std::string HfHubCacheDir() {
  if (std::string d = Env("HF_HUB_CACHE"); !d.empty()) return d;
  if (std::string d = Env("HUGGINGFACE_HUB_CACHE"); !d.empty()) return d;
  if (std::string d = Env("HF_HOME"); !d.empty()) return (fs::path(d) / "hub").string();
  if (std::string d = Env("XDG_CACHE_HOME"); !d.empty()) {
    return (fs::path(d) / "huggingface" / "hub").string();
  }
  return (fs::path(Env("HOME")) / ".cache" / "huggingface" / "hub").string();
}

absl::StatusOr<std::string> ResolveHfCacheModel(absl::string_view id) {
  if (!LooksLikeModelId(id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", id, "' is not a Hugging Face model id (org/name)"));
  }
  const std::string cache = HfHubCacheDir();
  const std::string folder = absl::StrCat("models--", absl::StrReplaceAll(id, {{"/", "--"}}));
  const fs::path repo = fs::path(cache) / folder;
  const std::string fix = absl::StrCat(
      "download it first (huggingface-cli download ", id,
      ", or from_pretrained once with network access), or point HF_HUB_CACHE / HF_HOME at the "
      "cache that holds it; this product makes no network access");
  std::error_code ec;
  if (!fs::is_directory(repo / "snapshots", ec)) {
    return absl::NotFoundError(absl::StrCat("model '", id, "' is not in the Hugging Face cache ",
                                            cache, " (no ", folder, "/snapshots); ", fix));
  }
  std::string commit;
  if (std::ifstream ref(repo / "refs" / "main"); ref) {
    std::getline(ref, commit);
    commit = std::string(absl::StripAsciiWhitespace(commit));
  }
  if (!commit.empty()) {
    const fs::path snapshot = repo / "snapshots" / commit;
    if (!IdPart(commit) || !fs::is_directory(snapshot, ec)) {
      return absl::NotFoundError(absl::StrCat(
          "model '", id, "' in the Hugging Face cache ", cache, ": refs/main names snapshot '",
          commit, "', which is absent (an interrupted download?); ", fix));
    }
    return snapshot.string();
  }
  std::vector<std::string> snapshots;
  for (const auto& e : fs::directory_iterator(repo / "snapshots", ec)) {
    if (e.is_directory(ec)) snapshots.push_back(e.path().string());
  }
  std::sort(snapshots.begin(), snapshots.end());
  if (snapshots.size() == 1) return snapshots[0];
  if (snapshots.empty()) {
    return absl::NotFoundError(absl::StrCat("model '", id, "' in the Hugging Face cache ", cache,
                                            " has no snapshot; ", fix));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("model '", id, "' in the Hugging Face cache ", cache,
                   " has no refs/main and several snapshots (", absl::StrJoin(snapshots, ", "),
                   "); give the one to use as the model path"));
}

}  // namespace lspo::runtime
