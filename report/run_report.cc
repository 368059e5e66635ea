// The run report: metrics.jsonl parsed into its step, eval, projector-fit and data lines, the
// charts and header tables drawn from them (charts rendered by report/svg_chart.h), the page.
#include "report/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "report/svg_chart.h"
#include "runtime/file_io.h"

namespace lspo::scheduler {
namespace {

using chart::Chart;
using chart::Escape;
using chart::kPalette;
using chart::Mark;
using chart::Point;
using chart::Value;
using Json = nlohmann::json;
using Fields = std::map<std::string, double>;  // A line's numeric fields by name.

// ---------------------------------------------------------------------------------------------
// metrics.jsonl

// `v` as a number: a JSON number or a string holding one (int64 fields, "NaN", "Infinity").
std::optional<double> Number(const Json& v) {
  if (v.is_number()) return v.get<double>();
  double d = 0;
  if (v.is_string() && absl::SimpleAtod(v.get_ref<const std::string&>(), &d)) return d;
  return std::nullopt;
}

// The line's integral "step" (a JSON integer, an integral JSON number or a decimal string).
std::optional<int64_t> Step(const Json& line) {
  const auto it = line.find("step");
  if (it == line.end()) return std::nullopt;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_number_float()) {
    const double d = it->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 9e15) {
      return static_cast<int64_t>(d);
    }
    return std::nullopt;
  }
  int64_t i = 0;
  if (it->is_string() && absl::SimpleAtoi(it->get_ref<const std::string&>(), &i)) return i;
  return std::nullopt;
}

std::string String(const Json& line, const char* key) {
  const auto it = line.find(key);
  return it != line.end() && it->is_string() ? it->get<std::string>() : std::string();
}

struct DataLine {
  std::string split, path, format;
  Fields numbers;
};

struct RunData {
  std::map<int64_t, Fields> steps, evals, fits;  // By step; the last line of a step wins.
  std::vector<DataLine> data;                    // One per split, first-seen order, last wins.
};

RunData Parse(absl::string_view jsonl) {
  RunData run;
  for (absl::string_view text : absl::StrSplit(jsonl, '\n')) {
    text = absl::StripAsciiWhitespace(text);
    if (text.empty()) continue;
    const Json line = Json::parse(text.begin(), text.end(), /*cb=*/nullptr,
                                  /*allow_exceptions=*/false);
    if (!line.is_object()) continue;  // Also a line that did not parse (is_discarded).
    const auto kind_it = line.find("kind");
    if (kind_it == line.end() || !kind_it->is_string()) continue;
    const std::string& kind = kind_it->get_ref<const std::string&>();
    Fields numbers;
    for (const auto& item : line.items()) {
      if (item.key() == "kind" || item.key() == "step") continue;
      if (const auto n = Number(item.value())) numbers[item.key()] = *n;
    }
    if (kind == "data") {
      DataLine d{String(line, "split"), String(line, "path"), String(line, "format"),
                 std::move(numbers)};
      auto same = std::find_if(run.data.begin(), run.data.end(),
                               [&](const DataLine& o) { return o.split == d.split; });
      if (same != run.data.end()) {
        *same = std::move(d);
      } else {
        run.data.push_back(std::move(d));
      }
      continue;
    }
    std::map<int64_t, Fields>* by_step = kind == "step"            ? &run.steps
                                         : kind == "eval"          ? &run.evals
                                         : kind == "projector_fit" ? &run.fits
                                                                   : nullptr;
    if (by_step == nullptr) continue;
    const std::optional<int64_t> step = Step(line);
    if (!step) continue;
    (*by_step)[*step] = std::move(numbers);
  }
  return run;
}

// The field of a line, when present and finite.
std::optional<double> Field(const Fields& f, const std::string& name) {
  const auto it = f.find(name);
  if (it == f.end() || !std::isfinite(it->second)) return std::nullopt;
  return it->second;
}

// True when `name` is non-zero in at least one of `lines` (the "measured" rule: eval metrics
// write 0 when not measured).
bool NonZeroSomewhere(const std::map<int64_t, Fields>& lines, const std::string& name) {
  for (const auto& [step, f] : lines) {
    const auto it = f.find(name);
    if (it != f.end() && it->second != 0) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Charts

// The series of field `name` over `lines` (x = step); lines without it are gaps (NaN).
std::vector<Point> Points(const std::map<int64_t, Fields>& lines, const std::string& name,
                          bool zero_is_missing = false) {
  std::vector<Point> out;
  for (const auto& [step, f] : lines) {
    std::optional<double> v = Field(f, name);
    if (zero_is_missing && v && *v == 0) v.reset();
    out.push_back({static_cast<double>(step), v.value_or(std::nan(""))});
  }
  return out;
}

// Whether the evaluation field `field` was measured in the run (a measured 0 counts):
// generative scores where answers were generated, accuracy for classification data (a data
// line says so) or where it is non-zero, perplexity where it is non-zero, others always.
bool EvalMeasured(const RunData& run, absl::string_view field) {
  if (field == "exact_match" || field == "f1" || field == "precision" || field == "recall") {
    return NonZeroSomewhere(run.evals, "generated_examples");
  }
  if (field == "accuracy") {
    for (const DataLine& d : run.data) {
      if (d.format == "classification") return true;
    }
  }
  if (field == "accuracy" || field == "perplexity") {
    return NonZeroSomewhere(run.evals, std::string(field));
  }
  return true;
}

// Eval lines of a generative evaluation (exact match, F1 mean something): those with
// generated_examples > 0, or without the field.
std::map<int64_t, Fields> GenerativeEvals(const std::map<int64_t, Fields>& evals) {
  std::map<int64_t, Fields> out;
  for (const auto& [step, f] : evals) {
    const auto it = f.find("generated_examples");
    if (it == f.end() || it->second != 0) out[step] = f;
  }
  return out;
}

std::vector<Chart> Charts(const RunData& run) {
  std::vector<Chart> charts;
  double x_lo = std::nan(""), x_hi = std::nan("");
  for (const auto* lines : {&run.steps, &run.evals, &run.fits}) {
    if (lines->empty()) continue;
    const double lo = static_cast<double>(lines->begin()->first);
    const double hi = static_cast<double>(lines->rbegin()->first);
    x_lo = std::isnan(x_lo) ? lo : std::min(x_lo, lo);
    x_hi = std::isnan(x_hi) ? hi : std::max(x_hi, hi);
  }
  const std::string kStep = "optimizer step";

  Chart loss{"Loss", kStep, "loss (nats per token)", {}, false};
  loss.series.push_back({"train loss", kPalette[0], Mark::kLine, Points(run.steps, "loss")});
  loss.series.push_back({"eval loss", kPalette[1], Mark::kLineMarkers, Points(run.evals, "loss")});
  charts.push_back(std::move(loss));

  Chart metrics{"Evaluation metrics", kStep, "score (fraction, 0 to 1)", {}, true};
  const std::map<int64_t, Fields> generative = GenerativeEvals(run.evals);
  const struct {
    const char* field;
    const char* label;
    const std::map<int64_t, Fields>* lines;
  } kMetrics[] = {{"accuracy", "accuracy", &run.evals},
                  {"exact_match", "exact match", &generative},
                  {"f1", "F1 (tag set)", &generative}};
  int color = 2;
  for (const auto& m : kMetrics) {
    if (!EvalMeasured(run, m.field)) continue;
    metrics.series.push_back(
        {m.label, kPalette[color++], Mark::kLineMarkers, Points(*m.lines, m.field)});
  }
  charts.push_back(std::move(metrics));

  Chart ppl{"Perplexity", kStep, "perplexity (exp of mean token loss)", {}, false};
  ppl.series.push_back({"perplexity", kPalette[4], Mark::kLineMarkers,
                        Points(run.evals, "perplexity", /*zero_is_missing=*/true)});
  charts.push_back(std::move(ppl));

  Chart lr{"Learning rate", kStep, "learning rate", {}, true};
  lr.series.push_back({"learning rate", kPalette[0], Mark::kLine, Points(run.steps, "lr")});
  charts.push_back(std::move(lr));

  Chart time{"Step time by phase", kStep, "time per step (s)", {}, true};
  const struct {
    const char* field;
    const char* label;
  } kPhases[] = {{"forward_seconds", "forward"}, {"backward_seconds", "backward"},
                 {"update_seconds", "update"},   {"apply_seconds", "apply"},
                 {"wait_seconds", "wait"},       {"offload_seconds", "offload"}};
  color = 0;
  for (const auto& p : kPhases) {
    const int c = color++;  // A phase keeps its colour whichever others are present.
    if (!NonZeroSomewhere(run.steps, p.field)) continue;
    time.series.push_back({p.label, kPalette[c], Mark::kStacked, Points(run.steps, p.field)});
  }
  if (!time.series.empty() && NonZeroSomewhere(run.steps, "step_seconds")) {
    time.series.push_back(
        {"whole step (step_seconds)", "#222222", Mark::kLine, Points(run.steps, "step_seconds")});
  }
  charts.push_back(std::move(time));

  Chart bias{"Projector estimation bias", kStep, "mean relative bias (unitless)", {}, true};
  bias.series.push_back(
      {"before fit", kPalette[3], Mark::kMarkers, Points(run.fits, "mean_initial_relative_bias")});
  bias.series.push_back(
      {"after fit", kPalette[2], Mark::kMarkers, Points(run.fits, "mean_final_relative_bias")});
  charts.push_back(std::move(bias));
  for (Chart& c : charts) c.x_lo = x_lo, c.x_hi = x_hi;
  return charts;
}

// ---------------------------------------------------------------------------------------------
// The header tables

// Mean of the finite values of field `name` over `lines`, and how many there were.
std::pair<double, int> Mean(const std::map<int64_t, Fields>& lines, const std::string& name) {
  double sum = 0;
  int n = 0;
  for (const auto& [step, f] : lines) {
    if (const auto v = Field(f, name)) sum += *v, ++n;
  }
  return {n > 0 ? sum / n : 0, n};
}

std::string Row(absl::string_view name, absl::string_view value_html) {
  return absl::StrCat("<tr><th>", Escape(name), "</th><td>", value_html, "</td></tr>\n");
}

std::string SummaryTable(const RunData& run) {
  std::string rows;
  if (run.steps.empty()) {
    rows += Row("steps", "none logged");
  } else {
    const int64_t first = run.steps.begin()->first, last = run.steps.rbegin()->first;
    rows += Row("steps", absl::StrCat(run.steps.size(), " (step ", first,
                                      first == last ? "" : absl::StrCat(" to ", last), ")"));
    if (const auto l = Field(run.steps.rbegin()->second, "loss")) {
      rows += Row("final train loss", absl::StrCat(Value(*l), " (step ", last, ")"));
    }
    if (const auto [mean, n] = Mean(run.steps, "tokens_per_second"); n > 0) {
      rows += Row("tokens/s (mean)", absl::StrFormat("%.1f", mean));
    }
    if (const auto [input, n] = Mean(run.steps, "input_tokens"); n > 0 && input > 0) {
      // Sums: a step without padding has no padding_tokens field (proto JSON omits zeros).
      const auto [padding, n_padded] = Mean(run.steps, "padding_tokens");
      rows += Row("padding (share of input tokens)",
                  absl::StrFormat("%.1f%%", 100 * padding * n_padded / (input * n)));
    }
    if (const auto [bytes, n] = Mean(run.steps, "all_reduce_bytes"); n > 0 && bytes > 0) {
      const auto [seconds, n_timed] = Mean(run.steps, "all_reduce_seconds");
      // Proto JSON omits a zero: a mean over the steps that have the field.
      const auto [exposed, n_exposed] = Mean(run.steps, "all_reduce_exposed_seconds");
      rows += Row("all-reduced per step (data parallel, mean)",
                  absl::StrFormat("%.4g MB in %.3g s (%.3g s of it exposed)", bytes / 1e6,
                                  n_timed > 0 ? seconds : 0.0, n_exposed > 0 ? exposed : 0.0));
    }
    if (const auto [mean, n] = Mean(run.steps, "step_seconds"); n > 0) {
      rows += Row("step time (mean, total)", absl::StrFormat("%.3g s, %.1f s", mean, mean * n));
    }
    if (const auto [mean, n] = Mean(run.steps, "tokens"); n > 0) {
      rows += Row("loss tokens (total)", Value(mean * n));
    }
  }
  if (run.evals.empty()) {
    rows += Row("evaluations", "none logged");
  } else {
    const auto& [step, f] = *run.evals.rbegin();
    std::vector<std::string> parts;
    const struct {
      const char* field;
      const char* label;
    } kEval[] = {{"loss", "loss"},
                 {"accuracy", "accuracy"},
                 {"exact_match", "exact match"},
                 {"f1", "F1"},
                 {"precision", "precision"},
                 {"recall", "recall"},
                 {"perplexity", "perplexity"},
                 {"examples", "examples"}};
    for (const auto& e : kEval) {
      const auto v = Field(f, e.field);
      if (!v || !EvalMeasured(run, e.field)) continue;
      parts.push_back(absl::StrCat(e.label, " ", Value(*v)));
    }
    rows += Row("evaluations", absl::StrCat(run.evals.size()));
    rows +=
        Row(absl::StrCat("last evaluation (step ", step, ")"), Escape(absl::StrJoin(parts, ", ")));
  }
  if (!run.fits.empty()) {
    const auto& [step, f] = *run.fits.rbegin();
    std::string v = absl::StrCat(run.fits.size());
    const auto before = Field(f, "mean_initial_relative_bias");
    const auto after = Field(f, "mean_final_relative_bias");
    if (before && after) {
      absl::StrAppend(&v, " (last, step ", step, ": bias ", Value(*before), " before, ",
                      Value(*after), " after)");
    }
    rows += Row("projector fits", v);
  }
  return absl::StrCat("<table class=\"summary\">\n", rows, "</table>\n");
}

std::string DataTable(const std::vector<DataLine>& data) {
  if (data.empty()) return "";
  const char* kNumbers[] = {"examples", "tokens", "loss_tokens", "truncated", "skipped", "longest"};
  std::string out =
      "<h2>Data</h2>\n<table class=\"data\">\n<tr><th>split</th><th>path</th><th>format</th>"
      "<th>examples</th><th>tokens</th><th>loss tokens</th><th>truncated</th>"
      "<th>skipped</th><th>longest</th></tr>\n";
  for (const DataLine& d : data) {
    absl::StrAppend(&out, "<tr><td>", Escape(d.split), "</td><td>", Escape(d.path), "</td><td>",
                    Escape(d.format), "</td>");
    for (const char* n : kNumbers) {
      const auto it = d.numbers.find(n);
      absl::StrAppend(&out, "<td class=\"n\">", it == d.numbers.end() ? "" : Value(it->second),
                      "</td>");
    }
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

}  // namespace

std::vector<double> NiceTicks(double lo, double hi, int max_ticks) {
  return chart::Ticks(lo, hi, max_ticks, /*integral=*/false, nullptr);
}

std::string RunReportHtml(absl::string_view metrics_jsonl, absl::string_view title,
                          absl::string_view outcome) {
  const RunData run = Parse(metrics_jsonl);
  std::string html = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>Run report: ",
      Escape(title),
      "</title>\n<style>\n"
      "body{font-family:Helvetica,Arial,sans-serif;color:#222;margin:24px auto;"
      "max-width:940px;padding:0 12px}\n"
      "h1{font-size:22px;margin:0 0 12px}h2{font-size:17px;margin:22px 0 6px}\n"
      "table{border-collapse:collapse;margin:0 0 12px;font-size:14px}\n"
      "th,td{border:1px solid #d0d0d0;padding:3px 10px;text-align:left}\n"
      "th{background:#f4f4f4;font-weight:600}td.n{text-align:right}\n"
      "svg{display:block;margin:18px 0;max-width:100%;height:auto}\n"
      "p.none{color:#777;margin:6px 0}p.outcome{font-weight:600;margin:0 0 12px}\n"
      "</style>\n</head>\n<body>\n<h1>Run report: ",
      Escape(title), "</h1>\n",
      outcome.empty() ? std::string()
                      : absl::StrCat("<p class=\"outcome\">Job: ", Escape(outcome), "</p>\n"),
      SummaryTable(run), DataTable(run.data), "<h2>Charts</h2>\n");
  for (const Chart& c : Charts(run)) {
    if (chart::HasData(c)) {
      absl::StrAppend(&html, chart::RenderChart(c));
    } else {
      absl::StrAppend(&html, "<p class=\"none\">", Escape(c.title), ": not measured.</p>\n");
    }
  }
  absl::StrAppend(&html, "</body>\n</html>\n");
  return html;
}

absl::Status WriteRunReport(const std::string& out_dir, absl::string_view outcome) {
  std::string dir = out_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string metrics_path = absl::StrCat(dir, "/metrics.jsonl");
  absl::StatusOr<std::string> metrics = runtime::ReadFileToString(metrics_path, "metrics.jsonl");
  if (!metrics.ok()) return metrics.status();
  std::string title = std::filesystem::path(dir).filename().string();
  if (title.empty()) title = dir;
  return runtime::WriteFileAtomically(absl::StrCat(dir, "/report.html"),
                                      RunReportHtml(*metrics, title, outcome));
}

}  // namespace lspo::scheduler
