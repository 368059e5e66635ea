// Fuzzes a training checkpoint's checksum manifest reader (scheduler/checkpoint.h
// ParseChecksumManifest, what VerifyCheckpoint applies to <checkpoint>/checksums.sha256 before
// it hashes the files the manifest names) on any text. For every input:
//   - a refusal is kDataLoss (resume then skips the checkpoint, or fails naming it), never
//     another code or an exception;
//   - every accepted name is one VerifyCheckpoint may open: a relative path inside the
//     checkpoint folder (not empty, not starting with '/', no empty or ".." part) whose bytes
//     are the path the kernel opens (no NUL byte: "a\0/../x" would verify the file "a" while
//     the manifest lists another name), on one line; every sha256 is 64 characters;
//   - round trip through the writer: ChecksumManifestText (what CommitCheckpoint writes) of the
//     entries is the input without its empty lines, each line ended by '\n', and reads back to
//     the same entries.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "fuzz/fuzz_harness.h"
#include "scheduler/checkpoint.h"

namespace lspo::fuzz {

int FuzzCheckpointManifest(const uint8_t* data, size_t size) {
  if (size > 65536) return 0;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string path = "<fuzz>/checkpoints/step-00000001/checksums.sha256";
  absl::StatusOr<std::vector<scheduler::ChecksumEntry>> entries =
      scheduler::ParseChecksumManifest(text, path);
  if (!entries.ok()) {
    LSPO_FUZZ_CHECK(entries.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  std::string lines;  // the input's non-empty lines, each ended by '\n'
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!line.empty()) absl::StrAppend(&lines, line, "\n");
  }
  for (const scheduler::ChecksumEntry& e : *entries) {
    LSPO_FUZZ_CHECK(e.sha256.size() == 64);
    LSPO_FUZZ_CHECK(!e.name.empty() && e.name[0] != '/');
    LSPO_FUZZ_CHECK(e.name.find('\n') == std::string::npos);
    LSPO_FUZZ_CHECK(std::string(e.name.c_str()) == e.name);  // what open() is given
    for (absl::string_view part : absl::StrSplit(e.name, '/')) {
      LSPO_FUZZ_CHECK(!part.empty() && part != "..");
    }
  }
  const std::string written = scheduler::ChecksumManifestText(*entries);
  if (written != lines) {
    std::fprintf(stderr, "written manifest differs from the input's lines:\n%s\n---\n%s\n",
                 lines.c_str(), written.c_str());
  }
  LSPO_FUZZ_CHECK(written == lines);
  absl::StatusOr<std::vector<scheduler::ChecksumEntry>> back =
      scheduler::ParseChecksumManifest(written, path);
  LSPO_FUZZ_CHECK(back.ok() && back->size() == entries->size());
  for (size_t i = 0; i < back->size(); ++i) {
    LSPO_FUZZ_CHECK((*back)[i].sha256 == (*entries)[i].sha256);
    LSPO_FUZZ_CHECK((*back)[i].name == (*entries)[i].name);
  }
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzCheckpointManifest)
