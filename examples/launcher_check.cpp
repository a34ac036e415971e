#include "launcher_check.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "zero/tensor_parallel.hpp"

namespace zero::examples {

LauncherCheck::LauncherCheck(double budget_s, int64_t max_interval)
    : budget_s_(budget_s), max_interval_(std::max<int64_t>(1, max_interval)) {}

LauncherCheck::LauncherCheck(double budget_s, int64_t max_interval, std::shared_ptr<Group> world,
                             c10::Device device, Probe exited, int64_t start_step)
    : LauncherCheck(budget_s, max_interval) {
  world_ = std::move(world);
  device_ = device;
  exited_ = std::move(exited);
  last_ = start_step;
}

bool LauncherCheck::launcher_gone(int64_t step, bool print_step) {
  if (!due(step, print_step)) return false;
  const auto now = std::chrono::steady_clock::now();
  const double per_step = std::chrono::duration<double>(now - last_time_).count() /
                          static_cast<double>(std::max<int64_t>(1, step - last_));
  at::NoGradGuard no_grad;
  // A sum over the world: the count of ranks whose launcher is gone, and the ranks' step times
  // (reduce_from_region is an all-reduce over any group; a group of one returns its input).
  const at::Tensor mine =
      at::tensor({exited_ && exited_() ? 1.0 : 0.0, per_step}, at::kDouble).to(device_);
  const at::Tensor sum = (world_ ? tensor_parallel::reduce_from_region(mine, world_) : mine).cpu();
  const int ranks = world_ ? world_->size() : 1;
  checked(step, sum[1].item<double>() / ranks);
  last_time_ = std::chrono::steady_clock::now();
  return sum[0].item<double>() > 0;
}

bool LauncherCheck::due(int64_t step, bool print_step) const {
  if (print_step) return true;
  if (exited_ && (!world_ || world_->size() == 1))
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - last_time_).count() >=
           budget_s_ / 2;
  return step - last_ >= interval_;
}

void LauncherCheck::checked(int64_t step, double mean_step_s) {
  last_ = step;
  if (!(mean_step_s > 0) || !std::isfinite(mean_step_s)) return;
  const double fit = std::floor(budget_s_ / mean_step_s);
  interval_ = fit >= static_cast<double>(max_interval_)
                  ? max_interval_
                  : std::max<int64_t>(1, static_cast<int64_t>(fit));
}

}  // namespace zero::examples
