// When the trainer's ranks check that their launcher is still there, and how they agree on it.
//
// A rank notices its own launcher's death locally (zero::launcher_exited()), each at its own
// moment, but the ranks must stop at the same step, after a last checkpoint, so they agree on
// it with an all-reduce over the whole world (every data-parallel, tensor-parallel and pipeline
// rank: ranks that agreed within their data-parallel group only would stop while their
// tensor-parallel peers train on into a collective nobody joins). The all-reduce costs a host
// sync the hot path avoids: they check at print steps, and between them often enough to stop
// within comm_timeout_s of the launcher's death however large steps_per_print is: every
// `interval` steps, where the interval is derived from the world's mean step time as the
// all-reduce returns it, so every rank derives the same one and checks at the same steps.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "zero/group.hpp"

namespace zero::examples {

class LauncherCheck {
 public:
  // Whether this rank's launcher has exited (zero::launcher_exited; tests inject their own).
  using Probe = std::function<bool()>;

  // `budget_s`: the time a death may go unnoticed (a quarter of comm_timeout_s leaves the rest
  // for the last checkpoint); `max_interval`: steps_per_print, the checks' longest spacing.
  LauncherCheck(double budget_s, int64_t max_interval);
  // The same, agreeing over `world` (every process of the job) on `device`, from step
  // `start_step` (a resumed run's).
  LauncherCheck(double budget_s, int64_t max_interval, std::shared_ptr<Group> world,
                c10::Device device, Probe exited, int64_t start_step = 0);

  // Called after completing step `step` (1-based) on every rank: when a check is due, one
  // all-reduce over the world of whether each rank's launcher has exited and of its time per
  // step since the last check. True on every rank alike when any rank's launcher is gone.
  bool launcher_gone(int64_t step, bool print_step);

  // Whether the ranks check after completing step `step`: at every print step, and
  // `interval()` steps after the last check. A lone rank (a world of one, with a probe) agrees
  // with nobody and checks by the clock instead, every half budget: an interval fitted to past
  // step times stretches when the steps slow down (a loaded machine made 2 s 30).
  bool due(int64_t step, bool print_step) const;
  // Records a check after step `step`; `mean_step_s`: the world's mean time per step since the
  // previous check (identical on every rank: it comes out of the all-reduce).
  void checked(int64_t step, double mean_step_s);
  int64_t interval() const { return interval_; }

 private:
  double budget_s_;
  int64_t max_interval_;
  int64_t interval_ = 1;  // the first steps check every step until a step time is known
  int64_t last_ = 0;
  std::shared_ptr<Group> world_;
  c10::Device device_ = c10::Device(c10::kCPU);
  Probe exited_;
  std::chrono::steady_clock::time_point last_time_ = std::chrono::steady_clock::now();
};

}  // namespace zero::examples
