// The step-time chart: one stacked bar per configuration, where the predicted time goes.
#include <algorithm>
#include <cstdio>

#include "zero/plan/stacked_svg.hpp"
#include "zero/time_plan.hpp"

namespace zero {

std::string time_chart_svg(const std::string& title, const std::string& subtitle,
                           const std::vector<TimeChartBar>& bars) {
  detail::StackedChart c;
  c.title = title;
  c.subtitle = subtitle;
  double top = 0;
  for (const TimeChartBar& b : bars) {
    c.bars.push_back({b.label,
                      {{"forward", b.t.forward_s},
                       {"backward", b.t.backward_s},
                       {"recompute", b.t.recompute_s},
                       {"exposed gradient comm", b.t.grad_comm_exposed_s},
                       {"parameter all-gather", b.t.param_gather_s},
                       {"optimizer step", b.t.optimizer_s},
                       {"exposed offload", b.t.offload_exposed_s}}});
    top = std::max(top, b.t.step_s);
  }
  const bool ms = top < 1.0;  // milliseconds for small steps
  c.unit = ms ? 1e-3 : 1.0;
  c.axis_label = ms ? "predicted step time (ms)" : "predicted step time (s)";
  c.format = [](double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4g s", v);
    return std::string(buf);
  };
  return detail::stacked_chart_svg(c);
}

}  // namespace zero
