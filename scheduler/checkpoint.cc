#include "scheduler/checkpoint.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <set>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/file_io.h"
#include "runtime/status_macros.h"

namespace lspo::scheduler {
namespace {

namespace fs = std::filesystem;

constexpr char kChecksums[] = "checksums.sha256";
constexpr char kTrainerState[] = "trainer_state.json";
constexpr char kLatestPointer[] = "latest";

std::string StepName(int step) { return absl::StrFormat("step-%08d", step); }

void RemoveQuietly(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

// True when `text`, read as JSON, nests at most `levels` arrays and objects (brackets inside
// strings do not count). Exact for valid JSON; invalid JSON fails the parse that follows.
// Linear, no recursion: checked before parsing, so a deep file is never built.
bool JsonTextNestedAtMost(absl::string_view text, int levels) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, a quote included
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > levels) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

// True for a JSON integer in [0, INT_MAX] (what an `int` step or counter holds).
bool IsStepInteger(const nlohmann::json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>() <= static_cast<uint64_t>(INT_MAX);
  return v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= INT_MAX;
}

// True for a manifest name that stays inside the checkpoint folder and names a file the
// kernel can open: not empty, not absolute, no empty or ".." part, no NUL byte.
bool IsInsideName(absl::string_view name) {
  if (name.empty() || name[0] == '/' || name.find('\0') != absl::string_view::npos) {
    return false;
  }
  for (absl::string_view part : absl::StrSplit(name, '/')) {
    if (part.empty() || part == "..") return false;
  }
  return true;
}

}  // namespace

std::string NewRunId() {
  std::random_device rd;
  return absl::StrFormat("%s-%08x",
                         absl::FormatTime("%Y%m%dT%H%M%SZ", absl::Now(), absl::UTCTimeZone()),
                         static_cast<uint32_t>(rd()));
}

std::string CheckpointRoot(const std::string& output_dir) { return output_dir + "/checkpoints"; }

absl::StatusOr<std::string> BeginCheckpoint(const std::string& output_dir, int step) {
  const std::string root = CheckpointRoot(output_dir);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec || !fs::is_directory(root)) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create the checkpoint directory '", root, "'",
                     ec ? absl::StrCat(": ", ec.message()) : std::string(": it is not a directory"),
                     " (check output_dir and its permissions)"));
  }
  const std::string tmp = absl::StrCat(root, "/.tmp-", StepName(step));
  fs::remove_all(tmp, ec);
  if (ec) return runtime::FileErrnoStatus("remove stale", tmp, ec.value());
  if (::mkdir(tmp.c_str(), 0755) != 0) return runtime::FileErrnoStatus("mkdir", tmp, errno);
  return tmp;
}

absl::StatusOr<std::string> CommitCheckpoint(const std::string& tmp_dir,
                                             const nlohmann::json& trainer_state) {
  auto fail = [&](absl::Status st) {
    RemoveQuietly(tmp_dir);
    return st;
  };
  if (!trainer_state.contains("step") || !trainer_state["step"].is_number_integer()) {
    return fail(absl::InvalidArgumentError("trainer_state has no integer 'step'"));
  }
  const int step = trainer_state["step"].get<int>();
  absl::Status st =
      runtime::WriteFileSynced(tmp_dir + "/" + kTrainerState, trainer_state.dump(2) + "\n");
  if (!st.ok()) return fail(st);
  // Checksums over every regular file, sub-folders included (mode lora's adapter/), by path
  // relative to the checkpoint (sorted for a stable manifest).
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(tmp_dir, ec)) {
    if (e.is_regular_file()) names.push_back(fs::relative(e.path(), tmp_dir).string());
  }
  if (ec) return fail(runtime::FileErrnoStatus("list", tmp_dir, ec.value()));
  std::sort(names.begin(), names.end());
  std::vector<ChecksumEntry> entries;
  for (const std::string& name : names) {
    const std::string path = tmp_dir + "/" + name;
    st = runtime::FsyncFile(path);
    if (!st.ok()) return fail(st);
    absl::StatusOr<std::string> sum = Sha256File(path);
    if (!sum.ok()) return fail(sum.status());
    entries.push_back({*std::move(sum), name});
  }
  st = runtime::WriteFileSynced(tmp_dir + "/" + kChecksums, ChecksumManifestText(entries));
  if (!st.ok()) return fail(st);
  for (const std::string& name : names) {  // the sub-folders' entries (adapter/)
    const std::string sub = fs::path(name).parent_path().string();
    if (sub.empty()) continue;
    st = runtime::FsyncDir(tmp_dir + "/" + sub);
    if (!st.ok()) return fail(st);
  }
  st = runtime::FsyncDir(tmp_dir);
  if (!st.ok()) return fail(st);
  const std::string parent = fs::path(tmp_dir).parent_path().string();
  const std::string final_dir = parent + "/" + StepName(step);
  // A complete checkpoint of the same step (re-run after a resume) is replaced: move it aside
  // first so that the rename below is atomic.
  if (fs::exists(final_dir)) {
    const std::string old = parent + "/.old-" + StepName(step);
    RemoveQuietly(old);
    if (std::rename(final_dir.c_str(), old.c_str()) != 0) {
      return fail(runtime::FileErrnoStatus("rename", final_dir, errno));
    }
    RemoveQuietly(old);
  }
  if (std::rename(tmp_dir.c_str(), final_dir.c_str()) != 0) {
    return fail(runtime::FileErrnoStatus("rename", tmp_dir, errno));
  }
  RETURN_IF_ERROR(runtime::FsyncDir(parent));
  // The newest checkpoint by commit, whatever its step (checkpoint.h, "Lineage").
  RETURN_IF_ERROR(
      runtime::WriteFileAtomically(parent + "/" + kLatestPointer, StepName(step) + "\n"));
  return final_dir;
}

absl::StatusOr<nlohmann::json> ParseTrainerState(absl::string_view text, const std::string& path) {
  auto invalid = [&](absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat("'", path, "' is not a valid trainer state (", why, ")"));
  };
  if (!JsonTextNestedAtMost(text, kMaxTrainerStateDepth)) {
    return invalid(absl::StrCat("nested over ", kMaxTrainerStateDepth, " levels deep"));
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return invalid("not a JSON object");
  if (!j.contains("step") || !IsStepInteger(j["step"])) {
    return invalid("no integer 'step' in [0, 2^31-1]");
  }
  for (const char* key : {"run_id", "training_fingerprint"}) {
    if (j.contains(key) && !j[key].is_string()) {
      return invalid(absl::StrCat("'", key, "' is not a string"));
    }
  }
  for (const char* key : {"skipped_steps", "nonfinite_in_a_row"}) {
    if (j.contains(key) && !IsStepInteger(j[key])) {
      return invalid(absl::StrCat("'", key, "' is not an integer in [0, 2^31-1]"));
    }
  }
  if (j.contains("summary") && !j["summary"].is_object()) {
    return invalid("'summary' is not an object");
  }
  if (j.contains("evals") && !j["evals"].is_array()) return invalid("'evals' is not an array");
  if (j.contains("parent")) {
    const nlohmann::json& p = j["parent"];
    if (!p.is_null() && !p.is_object()) return invalid("'parent' is neither null nor an object");
    if (p.is_object() && p.contains("run_id") && !p["run_id"].is_string()) {
      return invalid("'parent.run_id' is not a string");
    }
    if (p.is_object() && p.contains("step") && !IsStepInteger(p["step"])) {
      return invalid("'parent.step' is not an integer in [0, 2^31-1]");
    }
  }
  return j;
}

CheckpointLineage LineageOfTrainerState(const nlohmann::json& j) {
  CheckpointLineage l;
  if (!j.is_object()) return l;
  if (j.contains("step") && IsStepInteger(j["step"])) l.step = j["step"].get<int>();
  if (j.contains("run_id") && j["run_id"].is_string()) l.run_id = j["run_id"].get<std::string>();
  if (j.contains("parent") && j["parent"].is_object()) {
    const nlohmann::json& p = j["parent"];
    if (p.contains("run_id") && p["run_id"].is_string()) {
      l.parent_run_id = p["run_id"].get<std::string>();
    }
    if (p.contains("step") && IsStepInteger(p["step"])) l.parent_step = p["step"].get<int>();
  }
  return l;
}

absl::StatusOr<CheckpointLineage> ReadCheckpointLineage(const std::string& dir) {
  const std::string path = dir + "/" + kTrainerState;
  ASSIGN_OR_RETURN(std::string text, runtime::ReadFileToString(path, "trainer state", 64 << 20));
  ASSIGN_OR_RETURN(nlohmann::json j, ParseTrainerState(text, path));
  return LineageOfTrainerState(j);
}

std::vector<CheckpointInfo> LineageOf(const std::string& output_dir, const std::string& dir) {
  struct Entry {
    CheckpointInfo info;
    CheckpointLineage lineage;
  };
  std::vector<Entry> listed;
  for (const CheckpointInfo& c : ListCheckpoints(output_dir)) {
    absl::StatusOr<CheckpointLineage> l = ReadCheckpointLineage(c.dir);
    if (l.ok()) listed.push_back({c, *l});
  }
  absl::StatusOr<CheckpointLineage> head = ReadCheckpointLineage(dir);
  if (!head.ok()) return {};
  std::vector<CheckpointInfo> out;
  std::set<std::string> runs_seen;
  std::string run = head->run_id;
  int upto = head->step;
  CheckpointLineage link = *head;
  while (runs_seen.insert(run).second) {
    // This run's checkpoints up to `upto`, newest first, then its parent's.
    std::vector<CheckpointInfo> mine;
    for (const Entry& e : listed) {
      if (e.lineage.run_id == run && e.info.step <= upto) mine.push_back(e.info);
    }
    std::sort(mine.begin(), mine.end(),
              [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step > b.step; });
    out.insert(out.end(), mine.begin(), mine.end());
    // The parent link is the oldest checkpoint's of this run (every one of them records it).
    for (const Entry& e : listed) {
      if (e.lineage.run_id == run && e.info.step <= upto) link = e.lineage;
    }
    if (run.empty() || link.parent_step < 0) break;
    run = link.parent_run_id;
    upto = link.parent_step;
  }
  return out;
}

std::vector<CheckpointInfo> LatestCheckpoints(const std::string& output_dir) {
  const std::string root = CheckpointRoot(output_dir);
  absl::StatusOr<std::string> pointer =
      runtime::ReadFileToString(root + "/" + kLatestPointer, "checkpoint pointer", 4096);
  if (pointer.ok()) {
    const std::string name(absl::StripAsciiWhitespace(*pointer));
    absl::string_view rest = name;
    int step = 0;
    if (absl::ConsumePrefix(&rest, "step-") && absl::SimpleAtoi(rest, &step) &&
        name == StepName(step) && fs::exists(root + "/" + name + "/" + kChecksums)) {
      std::vector<CheckpointInfo> lineage = LineageOf(output_dir, root + "/" + name);
      if (!lineage.empty()) return lineage;
    }
  }
  // No pointer (a folder written before lineages existed) or a broken one: by step.
  std::vector<CheckpointInfo> all = ListCheckpoints(output_dir);
  std::reverse(all.begin(), all.end());
  return all;
}

std::vector<CheckpointInfo> ListCheckpoints(const std::string& output_dir) {
  std::vector<CheckpointInfo> out;
  std::error_code ec;
  const std::string root = CheckpointRoot(output_dir);
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    absl::string_view rest = name;
    int step = 0;
    if (!e.is_directory() || !absl::ConsumePrefix(&rest, "step-") ||
        !absl::SimpleAtoi(rest, &step) || name != StepName(step)) {
      continue;
    }
    if (!fs::exists(e.path() / kChecksums)) continue;
    out.push_back({step, e.path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointInfo& a, const CheckpointInfo& b) { return a.step < b.step; });
  return out;
}

absl::Status PruneCheckpoints(const std::string& output_dir, int keep,
                              const std::string& newest_dir) {
  std::vector<CheckpointInfo> lineage = LineageOf(output_dir, newest_dir);  // newest first
  keep = std::max(keep, 1);
  for (size_t i = static_cast<size_t>(keep); i < lineage.size(); ++i) {
    std::error_code ec;
    fs::remove_all(lineage[i].dir, ec);
    if (ec) return runtime::FileErrnoStatus("remove old checkpoint", lineage[i].dir, ec.value());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SupersedeCheckpoints(const std::string& output_dir,
                                                 const std::string& label) {
  std::vector<CheckpointInfo> all = ListCheckpoints(output_dir);
  if (all.empty()) return std::string();
  const std::string root = CheckpointRoot(output_dir);
  const std::string aside = absl::StrCat(root, "/superseded-", label);
  std::error_code ec;
  fs::create_directories(aside, ec);
  if (ec) return runtime::FileErrnoStatus("mkdir", aside, ec.value());
  for (const CheckpointInfo& c : all) {
    const std::string to = aside + "/" + fs::path(c.dir).filename().string();
    if (std::rename(c.dir.c_str(), to.c_str()) != 0) {
      return runtime::FileErrnoStatus("rename", c.dir, errno);
    }
  }
  fs::remove(root + "/" + kLatestPointer, ec);
  RETURN_IF_ERROR(runtime::FsyncDir(aside));
  RETURN_IF_ERROR(runtime::FsyncDir(root));
  return aside;
}

absl::StatusOr<std::vector<ChecksumEntry>> ParseChecksumManifest(absl::string_view text,
                                                                 const std::string& path) {
  std::vector<ChecksumEntry> entries;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty()) continue;
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits("  ", 1));
    if (parts.size() != 2 || parts[0].size() != 64 || !IsInsideName(parts[1])) {
      return absl::DataLossError(absl::StrCat("'", path, "': malformed line '", line, "'"));
    }
    entries.push_back({std::string(parts[0]), std::string(parts[1])});
  }
  return entries;
}

std::string ChecksumManifestText(const std::vector<ChecksumEntry>& entries) {
  std::string text;
  for (const ChecksumEntry& e : entries) absl::StrAppend(&text, e.sha256, "  ", e.name, "\n");
  return text;
}

absl::StatusOr<nlohmann::json> VerifyCheckpoint(const std::string& dir) {
  const std::string manifest_path = dir + "/" + kChecksums;
  absl::StatusOr<std::string> manifest = runtime::ReadFileToString(manifest_path);
  if (absl::IsNotFound(manifest.status())) {
    return absl::NotFoundError(
        absl::StrCat("'", manifest_path, "' is missing: not a complete checkpoint"));
  }
  RETURN_IF_ERROR(manifest.status());
  ASSIGN_OR_RETURN(std::vector<ChecksumEntry> entries,
                   ParseChecksumManifest(*manifest, manifest_path));
  bool saw_state = false;
  for (const ChecksumEntry& e : entries) {
    const std::string path = dir + "/" + e.name;
    absl::StatusOr<std::string> sum = Sha256File(path);
    if (!sum.ok()) {
      return absl::DataLossError(absl::StrCat("checkpoint '", dir, "': ", sum.status().message()));
    }
    if (*sum != e.sha256) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint file '", path, "' does not match its SHA-256 in checksums.sha256 (",
          "corrupted or modified): resume from an earlier checkpoint"));
    }
    saw_state |= e.name == kTrainerState;
  }
  if (!saw_state) {
    return absl::NotFoundError(absl::StrCat("checkpoint '", dir, "' lists no ", kTrainerState));
  }
  const std::string state_path = dir + "/" + kTrainerState;
  absl::StatusOr<std::string> ts = runtime::ReadFileToString(state_path);
  if (!ts.ok()) {
    return absl::DataLossError(absl::StrCat("checkpoint '", dir, "': ", ts.status().message()));
  }
  return ParseTrainerState(*ts, state_path);
}

absl::StatusOr<std::string> Sha256File(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return runtime::FileErrnoStatus("open", path, errno);
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (ctx == nullptr || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) {
    ::close(fd);
    return absl::InternalError("OpenSSL SHA-256 initialisation failed");
  }
  std::vector<unsigned char> buf(1 << 20);
  while (true) {
    ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return runtime::FileErrnoStatus("read", path, err);
    }
    if (n == 0) break;
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(n));
  }
  ::close(fd);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &len);
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) absl::StrAppendFormat(&hex, "%02x", md[i]);
  return hex;
}

}  // namespace lspo::scheduler
