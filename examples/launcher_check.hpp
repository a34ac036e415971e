// When the trainer's ranks check that their launcher is still there.
//
// A rank notices its own launcher's death locally (zero::launcher_exited(): the parent process
// changed), but the ranks must stop at the same step, after a last checkpoint, so they agree
// on it with an all-reduce, which costs a host sync the hot path avoids. They check at print
// steps, and between them often enough to stop within comm_timeout_s of the launcher's death
// however large steps_per_print is: every `interval` steps, where the interval is derived from
// the ranks' mean step time as the all-reduce returns it, so every rank derives the same one.
#pragma once

#include <cstdint>

namespace zero::examples {

class LauncherCheck {
 public:
  // `budget_s`: the time a death may go unnoticed (a quarter of comm_timeout_s leaves the rest
  // for the last checkpoint); `max_interval`: steps_per_print, the checks' longest spacing.
  LauncherCheck(double budget_s, int64_t max_interval);

  // Whether the ranks check after completing step `step` (1-based): at every print step, and
  // `interval()` steps after the last check.
  bool due(int64_t step, bool print_step) const { return print_step || step - last_ >= interval_; }
  // Records a check after step `step`; `mean_step_s`: the ranks' mean time per step since the
  // previous check (identical on every rank: it comes out of the all-reduce).
  void checked(int64_t step, double mean_step_s);
  int64_t interval() const { return interval_; }

 private:
  double budget_s_;
  int64_t max_interval_;
  int64_t interval_ = 1;  // the first steps check every step until a step time is known
  int64_t last_ = 0;
};

}  // namespace zero::examples
