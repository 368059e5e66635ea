// The run report's SVG charts: axes with nice ticks, the stacking of kStacked series, and the
// chart's drawing in layers (legend, grid, stacked bars or areas, lines and markers, axes).
#include "report/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace lspo::scheduler::chart {
namespace {

// An SVG coordinate.
std::string C(double v) { return absl::StrFormat("%.1f", v); }

// ---------------------------------------------------------------------------------------------
// Axes

double Pow10(int k) { return std::pow(10.0, k); }

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

// ---------------------------------------------------------------------------------------------
// Layout

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

// One stacked value: the band [lower, upper] at x.
struct Band {
  double x, lower, upper;
};

// The kStacked series stacked: the x values of any of them, and per series (index of
// Chart::series; empty for the others) its band at each of those x.
struct Stack {
  std::set<double> xs;
  std::vector<std::vector<Band>> bands;
};

// Stacks the kStacked series of `c` (missing, negative and non-finite values count 0).
Stack StackSeries(const Chart& c) {
  Stack stack;
  stack.bands.resize(c.series.size());
  for (const Series& s : c.series) {
    if (s.mark != Mark::kStacked) continue;
    for (const Point& p : s.points) {
      if (std::isfinite(p.x)) stack.xs.insert(p.x);
    }
  }
  std::map<double, double> cumulative;
  for (double x : stack.xs) cumulative[x] = 0;
  for (size_t i = 0; i < c.series.size(); ++i) {
    if (c.series[i].mark != Mark::kStacked) continue;
    std::map<double, double> v;
    for (const Point& p : c.series[i].points) {
      if (std::isfinite(p.x) && std::isfinite(p.y) && p.y > 0) v[p.x] = p.y;
    }
    for (auto& [x, cum] : cumulative) {
      const auto it = v.find(x);
      const double add = it == v.end() ? 0 : it->second;
      stack.bands[i].push_back({x, cum, cum + add});
      cum += add;
    }
  }
  return stack;
}

// The x and y axes of `c`: the finite data (stacked bands for kStacked series), y widened to 0
// with y_from_zero, x to [x_lo, x_hi] when both are finite.
std::pair<Axis, Axis> DataAxes(const Chart& c, const Stack& stack) {
  double xlo = std::numeric_limits<double>::infinity(), xhi = -xlo, ylo = xlo, yhi = -xlo;
  auto include = [&](double x, double y) {
    if (!std::isfinite(x) || !std::isfinite(y)) return;
    xlo = std::min(xlo, x), xhi = std::max(xhi, x);
    ylo = std::min(ylo, y), yhi = std::max(yhi, y);
  };
  for (size_t i = 0; i < c.series.size(); ++i) {
    if (c.series[i].mark == Mark::kStacked) {
      for (const Band& b : stack.bands[i]) include(b.x, b.lower), include(b.x, b.upper);
    } else {
      for (const Point& p : c.series[i].points) include(p.x, p.y);
    }
  }
  if (c.y_from_zero) ylo = std::min(ylo, 0.0), yhi = std::max(yhi, 0.0);
  if (std::isfinite(c.x_lo) && std::isfinite(c.x_hi)) {
    xlo = std::min(xlo, c.x_lo), xhi = std::max(xhi, c.x_hi);
  }
  return {MakeAxis(xlo, xhi, 11, /*integral=*/true, /*tight=*/true),
          MakeAxis(ylo, yhi, 6, /*integral=*/false, /*tight=*/false)};
}

// A legend entry: its series and the position of its symbol (x) and text baseline (y).
struct LegendEntry {
  const Series* s;
  double x, y;
};

// The legend rows above the plot, so that no entry covers data; `last_row` receives the
// baseline of the last row.
std::vector<LegendEntry> LayoutLegend(const Chart& c, double* last_row) {
  std::vector<LegendEntry> entries;
  const double right = kWidth - kRight;
  double lx = kLeft, ly = kTitleHeight + 10;
  for (const Series& s : c.series) {
    const double w = 28 + kCharWidth * static_cast<double>(s.label.size()) + 16;
    if (lx + w > right && lx > kLeft) lx = kLeft, ly += kLegendRow;
    entries.push_back({&s, lx, ly});
    lx += w;
  }
  *last_row = ly;
  return entries;
}

// The plot's frame: its axes, its edges in SVG coordinates and the data-to-SVG mapping.
struct Frame {
  Axis xa, ya;
  double right = kWidth - kRight;
  double top = 0, bottom = 0, height = 0;
  bool stacked = false;  // Data keeps clear of the axes, except stacked bars (on the x axis).

  double X(double x) const { return xa.Map(x, kLeft + kPadX, right - kPadX); }
  double Y(double y) const { return ya.Map(y, stacked ? bottom : bottom - kPadY, top + kPadY); }
};

// ---------------------------------------------------------------------------------------------
// Drawing, layer by layer

void AppendLegend(const std::vector<LegendEntry>& entries, std::string* svg) {
  for (const LegendEntry& e : entries) {
    const std::string& col = e.s->color;
    const double mid = e.y - 4;
    if (e.s->mark == Mark::kStacked) {
      absl::StrAppend(svg, "<rect x=\"", C(e.x + 4), "\" y=\"", C(mid - 6),
                      "\" width=\"14\" height=\"12\" fill=\"", col, "\"/>");
    } else {
      if (e.s->mark != Mark::kMarkers) {
        absl::StrAppend(svg, "<line x1=\"", C(e.x), "\" y1=\"", C(mid), "\" x2=\"", C(e.x + 22),
                        "\" y2=\"", C(mid), "\" stroke=\"", col, "\" stroke-width=\"2\"/>");
      }
      if (e.s->mark != Mark::kLine) {
        absl::StrAppend(svg, "<circle cx=\"", C(e.x + 11), "\" cy=\"", C(mid),
                        "\" r=\"3.5\" fill=\"", col, "\" stroke=\"#fff\"/>");
      }
    }
    absl::StrAppend(svg, "<text x=\"", C(e.x + 28), "\" y=\"", C(e.y), "\" fill=\"#222\">",
                    Escape(e.s->label), "</text>\n");
  }
}

// Grid lines at the ticks and the tick labels.
void AppendGrid(const Frame& f, std::string* svg) {
  absl::StrAppend(svg, "<g stroke=\"#e4e4e4\" stroke-width=\"1\">");
  for (double t : f.ya.ticks) {
    absl::StrAppend(svg, "<line x1=\"", C(kLeft), "\" y1=\"", C(f.Y(t)), "\" x2=\"", C(f.right),
                    "\" y2=\"", C(f.Y(t)), "\"/>");
  }
  for (double t : f.xa.ticks) {
    absl::StrAppend(svg, "<line x1=\"", C(f.X(t)), "\" y1=\"", C(f.top), "\" x2=\"", C(f.X(t)),
                    "\" y2=\"", C(f.bottom), "\"/>");
  }
  absl::StrAppend(svg, "</g>\n<g fill=\"#444\" font-size=\"11\" text-anchor=\"end\">");
  for (double t : f.ya.ticks) {
    absl::StrAppend(svg, "<text x=\"", C(kLeft - 6), "\" y=\"", C(f.Y(t) + 4), "\">", f.ya.Label(t),
                    "</text>");
  }
  absl::StrAppend(svg, "</g>\n<g fill=\"#444\" font-size=\"11\" text-anchor=\"middle\">");
  for (double t : f.xa.ticks) {
    absl::StrAppend(svg, "<text x=\"", C(f.X(t)), "\" y=\"", C(f.bottom + 16), "\">", f.xa.Label(t),
                    "</text>");
  }
  absl::StrAppend(svg, "</g>\n");
}

// Stacked series: bars of 80% of the closest x spacing (at most 24 px), or areas.
void AppendStacked(const Chart& c, const Stack& stack, const Frame& f, std::string* svg) {
  double min_gap = 1;
  for (auto it = stack.xs.begin(); it != stack.xs.end() && std::next(it) != stack.xs.end(); ++it) {
    min_gap = std::min(min_gap, *std::next(it) - *it);
  }
  const double half_bar =
      std::clamp(0.4 * min_gap * (f.right - kLeft - 2 * kPadX) / (f.xa.hi - f.xa.lo), 0.5, 12.0);
  for (size_t i = 0; i < c.series.size(); ++i) {
    if (c.series[i].mark != Mark::kStacked) continue;
    const std::vector<Band>& bands = stack.bands[i];
    if (stack.xs.size() <= kMaxBars) {
      absl::StrAppend(svg, "<g fill=\"", c.series[i].color, "\">");
      for (const Band& b : bands) {
        if (b.upper <= b.lower) continue;
        absl::StrAppend(svg, "<rect x=\"", C(f.X(b.x) - half_bar), "\" y=\"", C(f.Y(b.upper)),
                        "\" width=\"", C(2 * half_bar), "\" height=\"",
                        C(f.Y(b.lower) - f.Y(b.upper)), "\"/>");
      }
      absl::StrAppend(svg, "</g>\n");
    } else {
      std::vector<std::string> pts;
      for (const Band& b : bands) pts.push_back(absl::StrCat(C(f.X(b.x)), ",", C(f.Y(b.upper))));
      for (auto b = bands.rbegin(); b != bands.rend(); ++b) {
        pts.push_back(absl::StrCat(C(f.X(b->x)), ",", C(f.Y(b->lower))));
      }
      absl::StrAppend(svg, "<polygon fill=\"", c.series[i].color, "\" points=\"",
                      absl::StrJoin(pts, " "), "\"/>\n");
    }
  }
}

// The line of `s` (not kMarkers): segments between gaps; a lone point of a kLine is a dot.
void AppendLine(const Series& s, const Frame& f, std::string* svg) {
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
      absl::StrAppend(svg, "<circle cx=\"", C(f.X(seg[0].x)), "\" cy=\"", C(f.Y(seg[0].y)),
                      "\" r=\"2\" fill=\"", s.color, "\"/>\n");
    } else if (seg.size() > 1) {
      std::vector<std::string> pts;
      for (const Point& p : seg) pts.push_back(absl::StrCat(C(f.X(p.x)), ",", C(f.Y(p.y))));
      absl::StrAppend(svg, "<polyline fill=\"none\" stroke=\"", s.color,
                      "\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"",
                      absl::StrJoin(pts, " "), "\"/>\n");
    }
  }
}

// The markers of `s` (not kLine), each with a tooltip.
void AppendMarkers(const Series& s, const Frame& f, std::string* svg) {
  absl::StrAppend(svg, "<g fill=\"", s.color, "\" stroke=\"#fff\" stroke-width=\"1\">");
  for (const Point& p : s.points) {
    if (!std::isfinite(p.x) || !std::isfinite(p.y)) continue;
    absl::StrAppend(svg, "<circle cx=\"", C(f.X(p.x)), "\" cy=\"", C(f.Y(p.y)),
                    "\" r=\"4\"><title>", Escape(s.label), ", step ", Value(p.x), ": ", Value(p.y),
                    "</title></circle>");
  }
  absl::StrAppend(svg, "</g>\n");
}

// The axes and their titles, and the closing </svg>.
void AppendAxes(const Chart& c, const Frame& f, std::string* svg) {
  absl::StrAppend(svg, "<path d=\"M", C(kLeft), ",", C(f.top), " V", C(f.bottom), " H", C(f.right),
                  "\" fill=\"none\" stroke=\"#333\" stroke-width=\"1\"/>\n");
  absl::StrAppend(svg, "<text x=\"", C((kLeft + f.right) / 2), "\" y=\"", C(f.bottom + 40),
                  "\" text-anchor=\"middle\" fill=\"#222\">", AxisTitle(c.x_title, f.xa),
                  "</text>\n");
  const double ymid = (f.top + f.bottom) / 2;
  absl::StrAppend(svg, "<text x=\"18\" y=\"", C(ymid), "\" transform=\"rotate(-90 18 ", C(ymid),
                  ")\" text-anchor=\"middle\" fill=\"#222\">", AxisTitle(c.y_title, f.ya),
                  "</text>\n</svg>\n");
}

}  // namespace

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

std::string Value(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "inf" : "-inf");
  if (v == std::floor(v) && std::abs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.4g", v);
}

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

bool HasData(const Chart& c) {
  for (const Series& s : c.series) {
    for (const Point& p : s.points) {
      if (std::isfinite(p.x) && std::isfinite(p.y)) return true;
    }
  }
  return false;
}

std::string RenderChart(const Chart& c) {
  const Stack stack = StackSeries(c);
  Frame f;
  std::tie(f.xa, f.ya) = DataAxes(c, stack);
  double last_row = 0;
  const std::vector<LegendEntry> entries = LayoutLegend(c, &last_row);
  f.top = last_row + 16;
  f.bottom = f.top + kPlotHeight;
  f.height = f.bottom + kBottom;
  for (const Series& s : c.series) f.stacked = f.stacked || s.mark == Mark::kStacked;

  std::string svg = absl::StrCat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", C(kWidth), "\" height=\"", C(f.height),
      "\" viewBox=\"0 0 ", C(kWidth), " ", C(f.height),
      "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\" role=\"img\" "
      "aria-label=\"",
      Escape(c.title), "\">\n<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n",
      "<text x=\"", C(kLeft),
      "\" y=\"22\" font-size=\"15\" font-weight=\"bold\" "
      "fill=\"#222\">",
      Escape(c.title), "</text>\n");
  AppendLegend(entries, &svg);
  AppendGrid(f, &svg);
  AppendStacked(c, stack, f, &svg);
  for (const Series& s : c.series) {  // Lines and markers.
    if (s.mark == Mark::kStacked) continue;
    if (s.mark != Mark::kMarkers) AppendLine(s, f, &svg);
    if (s.mark != Mark::kLine) AppendMarkers(s, f, &svg);
  }
  AppendAxes(c, f, &svg);
  return svg;
}

}  // namespace lspo::scheduler::chart
