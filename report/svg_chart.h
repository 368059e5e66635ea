// The charts of the run report (report/run_report.h): a chart's data (series of points against
// the optimizer step) and its rendering as one inline <svg> (title, legend rows above the plot,
// grid lines at "nice" ticks, tick labels, axis titles; lines, markers and stacked bars or
// areas), plus the HTML text helpers the report's tables share. Internal to report/.
//
// Thread-safety: pure functions.
#ifndef LSPO_REPORT_SVG_CHART_H_
#define LSPO_REPORT_SVG_CHART_H_

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace lspo::scheduler::chart {

// One point of a series: x is the optimizer step, y the value (NaN or infinite: a gap).
struct Point {
  double x, y;
};

// How a series is drawn.
enum class Mark {
  kLine,         // A polyline, broken where a value is missing or not finite.
  kMarkers,      // A circle per point (with a tooltip).
  kLineMarkers,  // Both.
  kStacked,      // Stacked onto the kStacked series before it: bars per x (areas when many).
};

// A named series of a chart, drawn in `color` (an SVG colour, e.g. "#1f77b4").
struct Series {
  std::string label;
  std::string color;
  Mark mark;
  std::vector<Point> points;  // Ascending x; y may be NaN (a gap).
};

// One chart: its titles, series and the y range's rule.
struct Chart {
  std::string title;  // Also the "not measured" line's subject.
  std::string x_title;
  std::string y_title;  // With units.
  std::vector<Series> series;
  bool y_from_zero = false;  // The y range includes 0.
  // Steps the x axis covers whatever the data (the run's, so that the charts line up).
  double x_lo = std::nan(""), x_hi = std::nan("");
};

// The series colours (Tableau 10).
inline constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

// `s` escaped for HTML text and attribute values (& < > " ').
std::string Escape(absl::string_view s);

// A value for a table or a tooltip: integers whole (|v| < 1e15), others with 4 significant
// digits (%.4g); "NaN", "inf", "-inf" for the non-finite.
std::string Value(double v);

// The ticks of a linear axis covering [lo, hi] (run_report.h NiceTicks, whose contract this
// is); `integral` keeps the step >= 1 (step numbers; a constant series then widens by at least
// 1); `step_out` (may be null) receives the tick step. Empty when lo or hi is not finite.
std::vector<double> Ticks(double lo, double hi, int max_ticks, bool integral, double* step_out);

// True when some series of `c` has a point with finite x and y.
bool HasData(const Chart& c);

// The <svg> element of `c` (one with data, HasData), ending in a newline: title, legend rows
// above the plot, grid lines at the ticks, tick labels, axis titles; y spans the data (and 0
// with y_from_zero) out to the ticks around it, x the data's steps (and [x_lo, x_hi]).
// kStacked series: missing, negative and non-finite values count 0; bars of 80% of the closest
// x spacing (at most 24 px), or areas beyond 300 x values.
std::string RenderChart(const Chart& c);

}  // namespace lspo::scheduler::chart

#endif  // LSPO_REPORT_SVG_CHART_H_
