#include "scheduler/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
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
#include "runtime/file_io.h"

namespace lspo::scheduler {
namespace {

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
// HTML and number text

std::string Escape(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A value for a table: integers whole, others with 4 significant digits.
std::string Value(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf");
  if (v == std::floor(v) && std::abs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.4g", v);
}

// An SVG coordinate.
std::string C(double v) { return absl::StrFormat("%.1f", v); }

// ---------------------------------------------------------------------------------------------
// Axes

double Pow10(int k) { return std::pow(10.0, k); }

// NiceTicks; `integral` keeps the step >= 1 (step numbers); `step_out` receives the step.
std::vector<double> Ticks(double lo, double hi, int max_ticks, bool integral, double* step_out) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) return {};
  if (lo > hi) std::swap(lo, hi);
  if (lo == hi) {
    if (lo == 0) {
      hi = 1;
    } else {
      double d = std::abs(lo) * 0.1;
      if (integral) d = std::max(d, 1.0);
      lo -= d;
      hi += d;
    }
  }
  max_ticks = std::max(max_ticks, 3);
  const double span = hi - lo;
  if (!std::isfinite(span) || span <= 0) return {};
  int k = static_cast<int>(std::floor(std::log10(span / max_ticks))) - 1;
  for (int guard = 0; guard < 64; ++guard, ++k) {
    for (const int m : {1, 2, 5}) {
      // m x 10^k, computed so that i * step is the double nearest the decimal value.
      const double step = k >= 0 ? m * Pow10(k) : m / Pow10(-k);
      if (integral && step < 1) continue;
      const double first = std::floor(lo / step + 1e-9);
      const double last = std::ceil(hi / step - 1e-9);
      if (last - first + 1 > max_ticks) continue;
      std::vector<double> ticks;
      for (double i = first; i <= last; ++i) {
        const double t = k >= 0 ? i * m * Pow10(k) : i * m / Pow10(-k);
        ticks.push_back(t == 0 ? 0.0 : t);  // No -0.
      }
      if (step_out != nullptr) *step_out = step;
      return ticks;
    }
  }
  return {};
}

struct Axis {
  std::vector<double> ticks;
  double lo = 0, hi = 1;  // The plotted range.
  double step = 1;
  int exponent = 0;  // Labels show value / 10^exponent (the axis title says x10^exponent).

  // `v` mapped linearly from [lo, hi] onto [a, b].
  double Map(double v, double a, double b) const { return a + (v - lo) / (hi - lo) * (b - a); }

  std::string Label(double v) const {
    const double scale = Pow10(exponent);
    const double s = step / scale;
    double x = v / scale;
    if (std::abs(x) < s * 1e-6) x = 0;
    const int decimals = std::max(0, -static_cast<int>(std::floor(std::log10(s) + 1e-9)));
    return absl::StrFormat("%.*f", decimals, x);
  }
};

// The axis of data in [lo, hi]: the plotted range is that of the ticks, or with `tight` the
// data's (the ticks outside it dropped) when lo < hi.
Axis MakeAxis(double lo, double hi, int max_ticks, bool integral, bool tight) {
  Axis a;
  a.ticks = Ticks(lo, hi, max_ticks, integral, &a.step);
  if (a.ticks.size() < 2) {  // No finite data.
    a.ticks = {0, 1};
    a.step = 1;
  }
  a.lo = a.ticks.front();
  a.hi = a.ticks.back();
  if (tight && lo < hi) {
    a.lo = lo;
    a.hi = hi;
    const double eps = (hi - lo) * 1e-9;
    a.ticks.erase(std::remove_if(a.ticks.begin(), a.ticks.end(),
                                 [&](double t) { return t < lo - eps || t > hi + eps; }),
                  a.ticks.end());
  }
  const double m = std::max(std::abs(a.lo), std::abs(a.hi));
  if (!integral && m > 0 && (m < 1e-2 || m >= 1e6)) {
    a.exponent = static_cast<int>(std::floor(std::log10(m)));
  }
  return a;
}

// ---------------------------------------------------------------------------------------------
// Charts

struct Point {
  double x, y;
};

enum class Mark {
  kLine,         // A polyline, broken where a value is missing or not finite.
  kMarkers,      // A circle per point (with a tooltip).
  kLineMarkers,  // Both.
  kStacked,      // Stacked onto the kStacked series before it: bars per x (areas when many).
};

struct Series {
  std::string label;
  std::string color;
  Mark mark;
  std::vector<Point> points;  // Ascending x; y may be NaN (a gap).
};

struct Chart {
  std::string title;  // Also the "not measured" line's subject.
  std::string x_title;
  std::string y_title;  // With units.
  std::vector<Series> series;
  bool y_from_zero = false;  // The y range includes 0.
  // Steps the x axis covers whatever the data (the run's, so that the charts line up).
  double x_lo = std::nan(""), x_hi = std::nan("");
};

// Tableau 10.
constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

constexpr double kWidth = 920;
constexpr double kLeft = 84;  // Y tick labels and the y title.
constexpr double kRight = 24;
constexpr double kTitleHeight = 34;  // The chart title's band.
constexpr double kLegendRow = 20;
constexpr double kPlotHeight = 250;
constexpr double kBottom = 52;  // X tick labels and the x title.
constexpr double kPadX = 10;    // Between the axes and the plotted range.
constexpr double kPadY = 6;
constexpr double kCharWidth = 6.4;  // Of 12px sans-serif, for layout estimates.
constexpr size_t kMaxBars = 300;    // More x values than this: stacked areas.

bool HasData(const Chart& c) {
  for (const Series& s : c.series) {
    for (const Point& p : s.points) {
      if (std::isfinite(p.x) && std::isfinite(p.y)) return true;
    }
  }
  return false;
}

// The axis title, with the axis' scale as " ×10^e" in Unicode superscripts (a tspan with dy
// misplaces it in rotated text in some renderers).
std::string AxisTitle(const std::string& title, const Axis& a) {
  std::string out = Escape(title);
  if (a.exponent != 0) {
    static const char* const kSuperscript[] = {"⁰", "¹", "²", "³", "⁴", "⁵", "⁶", "⁷", "⁸", "⁹"};
    absl::StrAppend(&out, " ×10", a.exponent < 0 ? "⁻" : "");
    for (const char d : absl::StrCat(std::abs(a.exponent))) {
      absl::StrAppend(&out, kSuperscript[d - '0']);
    }
  }
  return out;
}

// The <svg> of `c` (one with data): title, legend rows above the plot, grid lines at the
// ticks, tick labels, axis titles; y spans the data (and 0 with y_from_zero) out to the ticks
// around it, x the data's steps.
std::string RenderChart(const Chart& c) {
  // Stack the kStacked series (missing, negative and non-finite values count 0).
  struct Band {
    double x, lower, upper;
  };
  std::vector<std::vector<Band>> bands(c.series.size());
  std::set<double> stack_xs;
  for (const Series& s : c.series) {
    if (s.mark != Mark::kStacked) continue;
    for (const Point& p : s.points) {
      if (std::isfinite(p.x)) stack_xs.insert(p.x);
    }
  }
  std::map<double, double> cumulative;
  for (double x : stack_xs) cumulative[x] = 0;
  for (size_t i = 0; i < c.series.size(); ++i) {
    if (c.series[i].mark != Mark::kStacked) continue;
    std::map<double, double> v;
    for (const Point& p : c.series[i].points) {
      if (std::isfinite(p.x) && std::isfinite(p.y) && p.y > 0) v[p.x] = p.y;
    }
    for (auto& [x, cum] : cumulative) {
      const auto it = v.find(x);
      const double add = it == v.end() ? 0 : it->second;
      bands[i].push_back({x, cum, cum + add});
      cum += add;
    }
  }

  // Data ranges.
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  auto include = [&](double x, double y) {
    if (!std::isfinite(x) || !std::isfinite(y)) return;
    xlo = std::min(xlo, x), xhi = std::max(xhi, x);
    ylo = std::min(ylo, y), yhi = std::max(yhi, y);
  };
  for (size_t i = 0; i < c.series.size(); ++i) {
    if (c.series[i].mark == Mark::kStacked) {
      for (const Band& b : bands[i]) include(b.x, b.lower), include(b.x, b.upper);
    } else {
      for (const Point& p : c.series[i].points) include(p.x, p.y);
    }
  }
  if (c.y_from_zero) ylo = std::min(ylo, 0.0), yhi = std::max(yhi, 0.0);
  if (std::isfinite(c.x_lo) && std::isfinite(c.x_hi)) {
    xlo = std::min(xlo, c.x_lo), xhi = std::max(xhi, c.x_hi);
  }
  const Axis xa = MakeAxis(xlo, xhi, 11, /*integral=*/true, /*tight=*/true);
  const Axis ya = MakeAxis(ylo, yhi, 6, /*integral=*/false, /*tight=*/false);

  // Legend rows above the plot, so that no entry covers data.
  struct Entry {
    const Series* s;
    double x, y;
  };
  std::vector<Entry> entries;
  const double right = kWidth - kRight;
  double lx = kLeft, ly = kTitleHeight + 10;
  for (const Series& s : c.series) {
    const double w = 28 + kCharWidth * static_cast<double>(s.label.size()) + 16;
    if (lx + w > right && lx > kLeft) lx = kLeft, ly += kLegendRow;
    entries.push_back({&s, lx, ly});
    lx += w;
  }
  const double top = ly + 16;
  const double bottom = top + kPlotHeight;
  const double height = bottom + kBottom;
  // Data keeps clear of the axes, except stacked bars, which stand on the x axis.
  bool stacked = false;
  for (const Series& s : c.series) stacked = stacked || s.mark == Mark::kStacked;
  auto px = [&](double x) { return xa.Map(x, kLeft + kPadX, right - kPadX); };
  auto py = [&](double y) { return ya.Map(y, stacked ? bottom : bottom - kPadY, top + kPadY); };

  std::string svg = absl::StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", C(kWidth), "\" height=\"", C(height),
      "\" viewBox=\"0 0 ", C(kWidth), " ", C(height),
      "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\" role=\"img\" "
      "aria-label=\"",
      Escape(c.title), "\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
      "<text x=\"", C(kLeft),
      "\" y=\"22\" font-size=\"15\" font-weight=\"bold\" "
      "fill=\"#222\">",
      Escape(c.title), "</text>\n");

  // Legend.
  for (const Entry& e : entries) {
    const std::string& col = e.s->color;
    const double mid = e.y - 4;
    if (e.s->mark == Mark::kStacked) {
      absl::StrAppend(&svg, "<rect x=\"", C(e.x + 4), "\" y=\"", C(mid - 6),
                      "\" width=\"14\" height=\"12\" fill=\"", col, "\"/>");
    } else {
      if (e.s->mark != Mark::kMarkers) {
        absl::StrAppend(&svg, "<line x1=\"", C(e.x), "\" y1=\"", C(mid), "\" x2=\"", C(e.x + 22),
                        "\" y2=\"", C(mid), "\" stroke=\"", col, "\" stroke-width=\"2\"/>");
      }
      if (e.s->mark != Mark::kLine) {
        absl::StrAppend(&svg, "<circle cx=\"", C(e.x + 11), "\" cy=\"", C(mid),
                        "\" r=\"3.5\" fill=\"", col, "\" stroke=\"#fff\"/>");
      }
    }
    absl::StrAppend(&svg, "<text x=\"", C(e.x + 28), "\" y=\"", C(e.y), "\" fill=\"#222\">",
                    Escape(e.s->label), "</text>\n");
  }

  // Grid and tick labels.
  absl::StrAppend(&svg, "<g stroke=\"#e4e4e4\" stroke-width=\"1\">");
  for (double t : ya.ticks) {
    absl::StrAppend(&svg, "<line x1=\"", C(kLeft), "\" y1=\"", C(py(t)), "\" x2=\"", C(right),
                    "\" y2=\"", C(py(t)), "\"/>");
  }
  for (double t : xa.ticks) {
    absl::StrAppend(&svg, "<line x1=\"", C(px(t)), "\" y1=\"", C(top), "\" x2=\"", C(px(t)),
                    "\" y2=\"", C(bottom), "\"/>");
  }
  absl::StrAppend(&svg, "</g>\n<g fill=\"#444\" font-size=\"11\" text-anchor=\"end\">");
  for (double t : ya.ticks) {
    absl::StrAppend(&svg, "<text x=\"", C(kLeft - 6), "\" y=\"", C(py(t) + 4), "\">", ya.Label(t),
                    "</text>");
  }
  absl::StrAppend(&svg, "</g>\n<g fill=\"#444\" font-size=\"11\" text-anchor=\"middle\">");
  for (double t : xa.ticks) {
    absl::StrAppend(&svg, "<text x=\"", C(px(t)), "\" y=\"", C(bottom + 16), "\">", xa.Label(t),
                    "</text>");
  }
  absl::StrAppend(&svg, "</g>\n");

  // Stacked series: bars of 80% of the closest x spacing (at most 24 px), or areas.
  double min_gap = 1;
  for (auto it = stack_xs.begin(); it != stack_xs.end() && std::next(it) != stack_xs.end(); ++it) {
    min_gap = std::min(min_gap, *std::next(it) - *it);
  }
  const double half_bar =
      std::clamp(0.4 * min_gap * (right - kLeft - 2 * kPadX) / (xa.hi - xa.lo), 0.5, 12.0);
  for (size_t i = 0; i < c.series.size(); ++i) {
    if (c.series[i].mark != Mark::kStacked) continue;
    if (stack_xs.size() <= kMaxBars) {
      absl::StrAppend(&svg, "<g fill=\"", c.series[i].color, "\">");
      for (const Band& b : bands[i]) {
        if (b.upper <= b.lower) continue;
        absl::StrAppend(&svg, "<rect x=\"", C(px(b.x) - half_bar), "\" y=\"", C(py(b.upper)),
                        "\" width=\"", C(2 * half_bar), "\" height=\"",
                        C(py(b.lower) - py(b.upper)), "\"/>");
      }
      absl::StrAppend(&svg, "</g>\n");
    } else {
      std::vector<std::string> pts;
      for (const Band& b : bands[i]) pts.push_back(absl::StrCat(C(px(b.x)), ",", C(py(b.upper))));
      for (auto b = bands[i].rbegin(); b != bands[i].rend(); ++b) {
        pts.push_back(absl::StrCat(C(px(b->x)), ",", C(py(b->lower))));
      }
      absl::StrAppend(&svg, "<polygon fill=\"", c.series[i].color, "\" points=\"",
                      absl::StrJoin(pts, " "), "\"/>\n");
    }
  }

  // Lines and markers.
  for (const Series& s : c.series) {
    if (s.mark == Mark::kStacked) continue;
    if (s.mark != Mark::kMarkers) {
      // Segments between gaps; a lone point of a line is a dot.
      std::vector<std::vector<Point>> segments(1);
      for (const Point& p : s.points) {
        if (std::isfinite(p.x) && std::isfinite(p.y)) {
          segments.back().push_back(p);
        } else if (!segments.back().empty()) {
          segments.emplace_back();
        }
      }
      for (const auto& seg : segments) {
        if (seg.size() == 1 && s.mark == Mark::kLine) {
          absl::StrAppend(&svg, "<circle cx=\"", C(px(seg[0].x)), "\" cy=\"", C(py(seg[0].y)),
                          "\" r=\"2\" fill=\"", s.color, "\"/>\n");
        } else if (seg.size() > 1) {
          std::vector<std::string> pts;
          for (const Point& p : seg) pts.push_back(absl::StrCat(C(px(p.x)), ",", C(py(p.y))));
          absl::StrAppend(&svg, "<polyline fill=\"none\" stroke=\"", s.color,
                          "\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"",
                          absl::StrJoin(pts, " "), "\"/>\n");
        }
      }
    }
    if (s.mark != Mark::kLine) {
      absl::StrAppend(&svg, "<g fill=\"", s.color, "\" stroke=\"#fff\" stroke-width=\"1\">");
      for (const Point& p : s.points) {
        if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
        absl::StrAppend(&svg, "<circle cx=\"", C(px(p.x)), "\" cy=\"", C(py(p.y)),
                        "\" r=\"4\"><title>", Escape(s.label), ", step ", Value(p.x), ": ",
                        Value(p.y), "</title></circle>");
      }
      absl::StrAppend(&svg, "</g>\n");
    }
  }

  // Axes and their titles.
  absl::StrAppend(&svg, "<path d=\"M", C(kLeft), ",", C(top), " V", C(bottom), " H", C(right),
                  "\" fill=\"none\" stroke=\"#333\" stroke-width=\"1\"/>\n");
  absl::StrAppend(&svg, "<text x=\"", C((kLeft + right) / 2), "\" y=\"", C(bottom + 40),
                  "\" text-anchor=\"middle\" fill=\"#222\">", AxisTitle(c.x_title, xa),
                  "</text>\n");
  const double ymid = (top + bottom) / 2;
  absl::StrAppend(&svg, "<text x=\"18\" y=\"", C(ymid), "\" transform=\"rotate(-90 18 ", C(ymid),
                  ")\" text-anchor=\"middle\" fill=\"#222\">", AxisTitle(c.y_title, ya),
                  "</text>\n</svg>\n");
  return svg;
}

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

// Eval lines of a generative evaluation (exact match, F1 mean something): those with
// generated_examples > 0, or without the field.
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
    } kEval[] = {{"loss", "loss"},           {"accuracy", "accuracy"},
                 {"exact_match", "exact match"}, {"f1", "F1"},
                 {"precision", "precision"}, {"recall", "recall"},
                 {"perplexity", "perplexity"}, {"examples", "examples"}};
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
  return Ticks(lo, hi, max_ticks, /*integral=*/false, nullptr);
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
    if (HasData(c)) {
      absl::StrAppend(&html, RenderChart(c));
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
