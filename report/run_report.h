// A run's report: <out_dir>/report.html, one self-contained HTML page (inline SVG charts, no
// JavaScript, no external resources) drawn from the run's metrics.jsonl (docs/outputs.md).
// Charts, each against the optimizer step:
//   Loss              train loss per step (line); eval loss at each evaluation (markers + line)
//   Evaluation        accuracy (classification data, or non-zero in one eval line), exact
//                     match and tag-set F1 (when an eval line generated answers)
//   Perplexity        on its own chart (its scale differs), when measured (perplexity > 0)
//   Learning rate     lr per step
//   Step time         the <phase>_seconds present (forward, backward, update, apply, wait,
//                     offload: non-zero in one step line) stacked per step, step_seconds as
//                     a line over them
//   Projector bias    mean relative estimation bias before and after each projector fit
// A chart without data is replaced by one line saying it was not measured. Above them a table
// (steps, final train loss, the last evaluation, mean tokens/s, ...) and one of the data
// lines (one per split).
// Input: lines that are not JSON objects with a string "kind" (or, for step, eval and
// projector_fit lines, without an integral "step") are skipped; other kinds (checkpoint,
// resume, master_drift, ...) are ignored. Numbers are JSON numbers or strings holding one
// (protobuf's JSON mapping writes int64 as decimal strings, NaN as "NaN"). A resumed run
// repeats steps: the last line for a step (per kind; per split for data lines) wins.
// Non-finite values are left out of the charts (a line breaks around them).
//
// Thread-safety: pure functions; WriteRunReport as runtime/file_io.h.
#ifndef LSPO_REPORT_RUN_REPORT_H_
#define LSPO_REPORT_RUN_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lspo::scheduler {

// Writes <out_dir>/report.html (replaced atomically, runtime::WriteFileAtomically) from
// <out_dir>/metrics.jsonl; the report's title is the name of the folder `out_dir`.
// Errors: those of runtime/file_io.h reading metrics.jsonl (kNotFound naming it when it is
// missing) or writing report.html. Bad lines in metrics.jsonl never fail it (file comment).
// `outcome` (may be empty) is shown under the title: how the job ended ("succeeded",
// "failed: <error>", "cancelled ...").
absl::Status WriteRunReport(const std::string& out_dir, absl::string_view outcome = "");

// The report page for the metrics.jsonl contents `metrics_jsonl`, titled `title` (escaped).
// Never fails: an empty or unreadable input gives a page whose charts say "not measured".
// A non-empty `outcome` is shown (escaped) under the title.
std::string RunReportHtml(absl::string_view metrics_jsonl, absl::string_view title,
                          absl::string_view outcome = "");

// The ticks of a linear axis covering [lo, hi]: multiples of a step 1, 2 or 5 x 10^k, the
// smallest such step that needs at most `max_ticks` ticks (raised to 3), from the largest
// multiple <= lo to the smallest >= hi, ascending; e.g. (0, 1, 6) -> 0, 0.2, ..., 1.
// lo > hi are swapped; lo == hi is widened by 10% of |lo| either side (0: to 0..1) so a
// constant series gets several ticks. Empty when lo or hi is not finite.
std::vector<double> NiceTicks(double lo, double hi, int max_ticks);

}  // namespace lspo::scheduler

#endif  // LSPO_REPORT_RUN_REPORT_H_
