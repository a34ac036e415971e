#include "launcher_check.hpp"

#include <algorithm>
#include <cmath>

namespace zero::examples {

LauncherCheck::LauncherCheck(double budget_s, int64_t max_interval)
    : budget_s_(budget_s), max_interval_(std::max<int64_t>(1, max_interval)) {}

void LauncherCheck::checked(int64_t step, double mean_step_s) {
  last_ = step;
  if (!(mean_step_s > 0) || !std::isfinite(mean_step_s)) return;
  const double fit = std::floor(budget_s_ / mean_step_s);
  interval_ = fit >= static_cast<double>(max_interval_)
                  ? max_interval_
                  : std::max<int64_t>(1, static_cast<int64_t>(fit));
}

}  // namespace zero::examples
