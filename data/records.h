// Reading data files line by line and record by record: UTF-8 validation, line splitting and
// the JSON records of .jsonl / .json files, with "file:line" locations for error messages.
// Torch-free; shared by data/datasets.cc and data/sft.cc.
#ifndef LSPO_DATA_RECORDS_H_
#define LSPO_DATA_RECORDS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/status_macros.h"
#include "runtime/utf8.h"

namespace lspo::data {

using runtime::IsValidUtf8;  // runtime/utf8.h

// Splits `content` into lines ("\n", a trailing "\r" removed) and calls
// fn(line number starting at 1, line) -> absl::Status for each; stops at the first error.
template <typename Fn>
absl::Status ForEachLine(absl::string_view content, Fn fn) {
  int64_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(content, '\n')) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    RETURN_IF_ERROR(fn(line_no, line));
  }
  return absl::OkStatus();
}

// One JSON value of a data file and where it is ("file:line", or "file: record N" for the
// N-th element, from 1, of a top-level array).
struct JsonRecord {
  nlohmann::ordered_json value;
  std::string where;
};

// What a data file may make a reader hold: the file is read whole (8 GiB at most by default:
// a larger data set is split first), and one line of a JSON Lines file is parsed whole (64 MiB
// at most: nlohmann's tree of it is several times larger). A whole-file JSON array is parsed
// at once, bounded by the file limit only.
struct DataFileLimits {
  int64_t max_file_bytes = int64_t{8} << 30;
  int64_t max_record_bytes = int64_t{64} << 20;
};

// The whole data file `path` within `limits.max_file_bytes` (runtime::ReadFileToString).
absl::StatusOr<std::string> ReadDataFile(const std::string& path,
                                         const DataFileLimits& limits = {});

// The records of `path`: JSON Lines (one value per non-blank line), or for a file whose whole
// content is one JSON array, its elements. Errors: kNotFound / the read's errors naming the
// file; kResourceExhausted for a file over limits.max_file_bytes (naming it, its size and the
// limit) or a line over limits.max_record_bytes (naming "file:line"); kInvalidArgument
// naming "file:line" for a line that is not valid UTF-8 (with the byte offset in the line) or
// not valid JSON.
absl::StatusOr<std::vector<JsonRecord>> ReadJsonRecords(const std::string& path,
                                                        const DataFileLimits& limits = {});

// The records of `content`, the text of a data file named `path` in the records' locations and
// in messages (nothing is read from disk): what ReadJsonRecords returns for a file holding
// `content`, with its errors except those of reading the file and its size.
absl::StatusOr<std::vector<JsonRecord>> ParseJsonRecords(absl::string_view content,
                                                         absl::string_view path,
                                                         const DataFileLimits& limits = {});

}  // namespace lspo::data

#endif  // LSPO_DATA_RECORDS_H_
