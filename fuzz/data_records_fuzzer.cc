// Fuzzes the data file readers of data/ on in-memory text: the record reader
// (records.h ParseJsonRecords: JSON Lines or a whole-file JSON array), the classification
// readers (datasets.h LabeledFromJsonRecords for .jsonl/.json, ParseLabeledTsv for .tsv) and
// the SFT readers (sft.h DetectSftFormatOfRecords, SftRecordsFromJson in each of the three
// formats). Each input goes through all of them. For every input:
//   - a refusal is kInvalidArgument (kResourceExhausted too for a JSON line over the record
//     limit, set to 4 KiB here so that the bound is reached), never another code or an
//     exception;
//   - round trip: the records read, written back as one JSON array (what a .json data file
//     holds), read back to the same values (for records nested at most 1000 deep: nlohmann
//     writes and compares recursively; the readers get the deeper ones too);
//   - accepted classification rows have a non-empty label, and TSV rows a label without a tab,
//     both fields valid UTF-8 (a Latin-1 line is converted) without a line break;
//   - accepted SFT records: one per JSON record, messages of the roles system / user /
//     assistant, a chat record with an assistant turn, completion_from within the messages,
//     plain prompt/completion text only in the prompt_completion format; every turn has a
//     name for messages (SftTurnName).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "data/datasets.h"
#include "data/records.h"
#include "data/sft.h"
#include "fuzz/fuzz_harness.h"
#include "runtime/utf8.h"

namespace lspo::fuzz {
namespace {

// Nesting depth of `j` (1 for a scalar), without recursion: the round trip below copies,
// compares and writes values recursively (nlohmann), so it is skipped for values nested deeper
// than a reader ever needs, which the readers themselves must still survive.
size_t Depth(const nlohmann::ordered_json& j) {
  size_t deepest = 0;
  std::vector<std::pair<const nlohmann::ordered_json*, size_t>> todo = {{&j, 1}};
  while (!todo.empty()) {
    auto [v, d] = todo.back();
    todo.pop_back();
    deepest = std::max(deepest, d);
    if (v->is_structured()) {
      for (const auto& child : *v) todo.push_back({&child, d + 1});
    }
  }
  return deepest;
}

bool AllowedRefusal(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument;
}

void CheckSft(const std::vector<data::JsonRecord>& records, data::SftFormat format) {
  absl::StatusOr<std::vector<data::SftRecord>> sft = data::SftRecordsFromJson(records, format);
  if (!sft.ok()) {
    LSPO_FUZZ_CHECK(AllowedRefusal(sft.status()));
    return;
  }
  LSPO_FUZZ_CHECK(sft->size() == records.size());
  for (const data::SftRecord& r : *sft) {
    LSPO_FUZZ_CHECK(r.format == format && !r.where.empty());
    if (!r.conversational) {
      LSPO_FUZZ_CHECK(format == data::SftFormat::kPromptCompletion && r.messages.empty());
      continue;
    }
    LSPO_FUZZ_CHECK(!r.messages.empty() && r.completion_from <= r.messages.size());
    bool assistant = false;
    for (size_t k = 0; k < r.messages.size(); ++k) {
      const std::string& role = r.messages[k].role;
      LSPO_FUZZ_CHECK(role == "system" || role == "user" || role == "assistant");
      assistant = assistant || role == "assistant";
      LSPO_FUZZ_CHECK(!data::SftTurnName(r, k).empty());
    }
    if (format == data::SftFormat::kChat) LSPO_FUZZ_CHECK(assistant);
    if (format == data::SftFormat::kAlpaca) LSPO_FUZZ_CHECK(r.messages.size() == 2);
  }
}

void CheckJson(absl::string_view text) {
  data::DataFileLimits limits;
  limits.max_record_bytes = 4096;
  absl::StatusOr<std::vector<data::JsonRecord>> records =
      data::ParseJsonRecords(text, "<fuzz>.jsonl", limits);
  if (!records.ok()) {
    LSPO_FUZZ_CHECK(AllowedRefusal(records.status()) ||
                    records.status().code() == absl::StatusCode::kResourceExhausted);
    return;
  }
  size_t deepest = 0;
  for (const data::JsonRecord& r : *records) {
    LSPO_FUZZ_CHECK(r.where.rfind("<fuzz>.jsonl", 0) == 0);
    deepest = std::max(deepest, Depth(r.value));
  }
  if (deepest <= 1000) {  // copying a value recurses too
    nlohmann::ordered_json all = nlohmann::ordered_json::array();
    for (const data::JsonRecord& r : *records) all.push_back(r.value);
    absl::StatusOr<std::vector<data::JsonRecord>> back =
        data::ParseJsonRecords(all.dump(), "<round trip>.json", limits);
    LSPO_FUZZ_CHECK(back.ok() && back->size() == records->size());
    for (size_t i = 0; i < back->size(); ++i) {
      LSPO_FUZZ_CHECK((*back)[i].value == (*records)[i].value);
    }
  }

  absl::StatusOr<std::vector<data::LabeledText>> labeled = data::LabeledFromJsonRecords(*records);
  if (!labeled.ok()) {
    LSPO_FUZZ_CHECK(AllowedRefusal(labeled.status()));
  } else {
    for (const data::LabeledText& row : *labeled) LSPO_FUZZ_CHECK(!row.label.empty());
  }

  absl::StatusOr<data::SftFormat> format = data::DetectSftFormatOfRecords(*records, "<fuzz>.jsonl");
  if (!format.ok()) LSPO_FUZZ_CHECK(AllowedRefusal(format.status()));
  for (data::SftFormat f : {data::SftFormat::kAlpaca, data::SftFormat::kChat,
                            data::SftFormat::kPromptCompletion}) {
    CheckSft(*records, f);
  }
}

void CheckTsv(absl::string_view text) {
  absl::StatusOr<std::vector<data::LabeledText>> rows = data::ParseLabeledTsv(text, "<fuzz>.tsv");
  if (!rows.ok()) {
    LSPO_FUZZ_CHECK(AllowedRefusal(rows.status()));
    return;
  }
  for (const data::LabeledText& row : *rows) {
    LSPO_FUZZ_CHECK(!row.label.empty() && row.label.find('\t') == std::string::npos);
    LSPO_FUZZ_CHECK(runtime::IsValidUtf8(row.label) && runtime::IsValidUtf8(row.text));
    LSPO_FUZZ_CHECK(row.label.find('\n') == std::string::npos &&
                    row.text.find('\n') == std::string::npos);
  }
}

}  // namespace

int FuzzDataRecords(const uint8_t* data, size_t size) {
  if (size > (size_t{1} << 20)) return 0;  // deeply nested JSON must fit (regressions/)
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  CheckJson(text);
  CheckTsv(text);
  return 0;
}

}  // namespace lspo::fuzz

LSPO_FUZZ_ENTRY(FuzzDataRecords)
