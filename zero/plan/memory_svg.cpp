// Stacked bar charts as plain SVG text: no plotting library, so the planner and the trainer can
// both write one wherever they run. The memory chart is one; time_svg.cpp draws the other.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "zero/memory_plan.hpp"
#include "zero/plan/stacked_svg.hpp"

namespace zero::detail {
namespace {

// Colour-blind-safe (Okabe-Ito), in ZeRO Figure 1's order: parameters, gradients, optimizer...
const char* const kColours[] = {"#0072B2", "#E69F00", "#009E73", "#CC79A7",
                                "#56B4E9", "#D55E00", "#F0E442", "#999999"};

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
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
      default:
        out += c;
    }
  }
  return out;
}

// A round step for the axis: 1, 2 or 5 times a power of ten, at most eight ticks to the top.
double tick_step(double top) {
  const double p = std::pow(10.0, std::floor(std::log10(top)));
  for (double m : {0.1, 0.2, 0.5, 1.0, 2.0, 5.0}) {
    if (top / (m * p) <= 8) return m * p;
  }
  return 10 * p;
}

}  // namespace

double stacked_top(const StackedChart& chart) {
  double top = chart.limit;
  for (const StackedBar& bar : chart.bars) {
    double sum = 0;
    for (const StackedSegment& s : bar.segments) sum += std::max(0.0, s.value);
    top = std::max(top, sum);
  }
  return top;
}

std::string stacked_chart_svg(const StackedChart& chart) {
  std::vector<std::string> categories;  // first appearance decides the colour
  for (const StackedBar& bar : chart.bars) {
    for (const StackedSegment& s : bar.segments) {
      if (s.value > 0 &&
          std::find(categories.begin(), categories.end(), s.category) == categories.end()) {
        categories.push_back(s.category);
      }
    }
  }
  const double unit = chart.unit;
  const double top = std::max(stacked_top(chart) * 1.1, unit * 1e-3);

  const int left = 80, plot_top = 70, plot_h = 360, bar_w = 90, gap = 50;
  const int plot_w = gap + static_cast<int>(chart.bars.size()) * (bar_w + gap);
  const int legend_x = left + plot_w + 30;
  const int width = legend_x + 190, height = plot_top + plot_h + 60;
  auto y_of = [&](double v) { return plot_top + plot_h - v / top * plot_h; };

  std::ostringstream o;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
                "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n",
                width, height, width, height);
  o << buf;
  o << "<text x=\"" << left << "\" y=\"24\" font-size=\"16\" font-weight=\"bold\">"
    << escape(chart.title) << "</text>\n";
  o << "<text x=\"" << left << "\" y=\"44\" fill=\"#444\">" << escape(chart.subtitle)
    << "</text>\n";
  // Axis and grid.
  const double step = tick_step(top / unit) * unit;
  for (double v = 0; v <= top; v += step) {
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n"
                  "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n",
                  left, y_of(v), left + plot_w, y_of(v), left - 6, y_of(v) + 4, v / unit);
    o << buf;
  }
  std::snprintf(buf, sizeof buf,
                "<text x=\"20\" y=\"%d\" transform=\"rotate(-90 20 %d)\" text-anchor=\"middle\">"
                "%s</text>\n",
                plot_top + plot_h / 2, plot_top + plot_h / 2, escape(chart.axis_label).c_str());
  o << buf;
  // Bars: one rect per nonzero segment, bottom up, each with its exact value as a tooltip.
  for (size_t i = 0; i < chart.bars.size(); ++i) {
    const StackedBar& bar = chart.bars[i];
    const int x = left + gap + static_cast<int>(i) * (bar_w + gap);
    double base = 0;
    for (const StackedSegment& s : bar.segments) {
      if (s.value <= 0) continue;
      const double v = s.value;
      const size_t c =
          std::find(categories.begin(), categories.end(), s.category) - categories.begin();
      std::snprintf(buf, sizeof buf,
                    "<rect x=\"%d\" y=\"%.2f\" width=\"%d\" height=\"%.2f\" fill=\"%s\">"
                    "<title>%s %s: %s</title></rect>\n",
                    x, y_of(base + v), bar_w, v / top * plot_h, kColours[c % 8],
                    escape(bar.label).c_str(), escape(s.category).c_str(), chart.format(v).c_str());
      o << buf;
      base += v;
    }
    std::snprintf(buf, sizeof buf,
                  "<text x=\"%d\" y=\"%.1f\" text-anchor=\"middle\">%.4g</text>\n"
                  "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                  x + bar_w / 2, y_of(base) - 5, base / unit, x + bar_w / 2, plot_top + plot_h + 18,
                  escape(bar.label).c_str());
    o << buf;
  }
  if (chart.limit > 0) {
    const double y = y_of(chart.limit);
    std::snprintf(buf, sizeof buf,
                  "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#c00\" "
                  "stroke-width=\"2\" stroke-dasharray=\"6 4\"/>\n"
                  "<text x=\"%d\" y=\"%.1f\" fill=\"#c00\" text-anchor=\"end\">%s</text>\n",
                  left, y, left + plot_w, y, left + plot_w, y - 5,
                  escape(chart.limit_label).c_str());
    o << buf;
  }
  std::snprintf(buf, sizeof buf,
                "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/>\n", left,
                plot_top + plot_h, left + plot_w, plot_top + plot_h);
  o << buf;
  // Legend, top first as the stack reads; circles keep <rect> for the data alone.
  for (size_t c = 0; c < categories.size(); ++c) {
    const int y = plot_top + 10 + static_cast<int>(categories.size() - 1 - c) * 22;
    std::snprintf(buf, sizeof buf,
                  "<circle cx=\"%d\" cy=\"%d\" r=\"7\" fill=\"%s\"/>"
                  "<text x=\"%d\" y=\"%d\">%s</text>\n",
                  legend_x, y, kColours[c % 8], legend_x + 14, y + 4,
                  escape(categories[c]).c_str());
    o << buf;
  }
  o << "</svg>\n";
  return o.str();
}

}  // namespace zero::detail

namespace zero {

std::string memory_chart_svg(const MemoryChart& chart) {
  using namespace detail;
  StackedChart c;
  c.title = chart.title;
  c.subtitle = chart.subtitle;
  c.limit = static_cast<double>(chart.limit_bytes);
  c.limit_label = chart.limit_label;
  for (const ChartBar& bar : chart.bars) {
    StackedBar b{bar.label, {}};
    for (const ChartSegment& s : bar.segments) {
      b.segments.push_back({s.category, static_cast<double>(s.bytes)});
    }
    c.bars.push_back(std::move(b));
  }
  const bool gb = stacked_top(c) * 1.1 >= 1e9;  // GB for real models, MB for the small demo
  c.unit = gb ? 1e9 : 1e6;
  c.axis_label = gb ? "per-rank memory (GB)" : "per-rank memory (MB)";
  c.format = [](double v) { return format_gb(static_cast<int64_t>(v)); };
  return stacked_chart_svg(c);
}

}  // namespace zero
