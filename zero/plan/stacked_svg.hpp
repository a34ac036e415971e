// A stacked bar chart as plain SVG text, in the style of Figure 1 of the ZeRO paper: one bar per
// configuration, one <rect> per positive segment, an optional dashed limit line. Shared by the
// memory chart (memory_svg.cpp) and the step-time chart (time_svg.cpp).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace zero::detail {

struct StackedSegment {
  std::string category;
  double value = 0;
};
struct StackedBar {
  std::string label;
  std::vector<StackedSegment> segments;
};
struct StackedChart {
  std::string title, subtitle;
  std::vector<StackedBar> bars;
  double limit = 0;  // 0: no line
  std::string limit_label;
  std::string axis_label;                     // "per-rank memory (GB)"
  double unit = 1;                            // axis ticks and bar totals are value / unit
  std::function<std::string(double)> format;  // a segment's tooltip value
};

// Largest bar or the limit, whichever is higher (0 for an empty chart).
double stacked_top(const StackedChart& chart);
std::string stacked_chart_svg(const StackedChart& chart);

}  // namespace zero::detail
