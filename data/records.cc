// Data file records; see records.h.
#include "data/records.h"

#include "absl/strings/str_cat.h"
#include "runtime/file_io.h"

namespace lspo::data {

absl::StatusOr<std::string> ReadDataFile(const std::string& path, const DataFileLimits& limits) {
  return runtime::ReadFileToString(path, "data file", limits.max_file_bytes);
}

absl::StatusOr<std::vector<JsonRecord>> ReadJsonRecords(const std::string& path,
                                                        const DataFileLimits& limits) {
  ASSIGN_OR_RETURN(std::string content, ReadDataFile(path, limits));
  return ParseJsonRecords(content, path, limits);
}

absl::StatusOr<std::vector<JsonRecord>> ParseJsonRecords(absl::string_view content,
                                                         absl::string_view path,
                                                         const DataFileLimits& limits) {
  std::vector<JsonRecord> out;
  // A whole-file array (a .json file): its elements.
  const size_t first = content.find_first_not_of(" \t\r\n");
  if (first != absl::string_view::npos && content[first] == '[' && IsValidUtf8(content)) {
    auto all = nlohmann::ordered_json::parse(content.begin(), content.end(), nullptr,
                                             /*allow_exceptions=*/false);
    if (!all.is_discarded() && all.is_array()) {
      for (size_t i = 0; i < all.size(); ++i) {
        out.push_back({std::move(all[i]), absl::StrCat(path, ": record ", i + 1)});
      }
      return out;
    }
  }
  RETURN_IF_ERROR(ForEachLine(content, [&](int64_t line_no, absl::string_view line) {
    if (line.find_first_not_of(" \t") == absl::string_view::npos) return absl::OkStatus();
    const std::string where = absl::StrCat(path, ":", line_no);
    if (static_cast<int64_t>(line.size()) > limits.max_record_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(where, ": a record of ", line.size(),
                                                       " bytes; at most ", limits.max_record_bytes,
                                                       " bytes are parsed as one record"));
    }
    size_t bad_at = 0;
    if (!IsValidUtf8(line, &bad_at)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": invalid UTF-8 at byte ", bad_at + 1,
                       " of the line; the file must be UTF-8 (re-encode it, e.g. iconv -t UTF-8)"));
    }
    auto j = nlohmann::ordered_json::parse(line.begin(), line.end(), nullptr,
                                           /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": not valid JSON; each line of a .jsonl file must be one JSON object"));
    }
    out.push_back({std::move(j), where});
    return absl::OkStatus();
  }));
  return out;
}

}  // namespace lspo::data
