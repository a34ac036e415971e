// Learning-rate schedules: DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR as pure
// functions of the step count, so resuming a run needs only the optimizer's steps().
//
// Timing is DeepSpeed's: its engine builds the scheduler at last_batch_iteration = -1 (which
// sets the schedule's initial lr: warmup_min_lr, or 0 for WarmupCosineLR) and steps it after
// every applied optimizer step. So optimizer step k (k = 0, 1, ...) runs at the initial lr for
// k = 0 and at the formula of iteration k - 1 afterwards.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace zero::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The lr of the optimizer step taken after `step` steps: initial_lr() for step 0, else
  // DeepSpeed's get_lr() at last_batch_iteration = step - 1.
  double lr_at(int64_t step) const;
  // DeepSpeed's get_lr() at last_batch_iteration = `iteration` (>= 0).
  virtual double at_iteration(int64_t iteration) const = 0;
  // What the scheduler's constructor writes into the optimizer (last_batch_iteration = -1).
  virtual double initial_lr() const = 0;
};

struct WarmupOptions {
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;  // >= 1; values below 2 act as 2, as in DeepSpeed
  std::string warmup_type = "log";  // "log": log(step+1)/log(warmup_num_steps); "linear"
};

struct WarmupCosineOptions {
  double base_lr = 1e-3;  // the optimizer's lr; the schedule yields base_lr * ratio
  int64_t total_num_steps = 0;
  double warmup_min_ratio = 0.0;  // ratio at step 0, rising to 1 over the warmup
  int64_t warmup_num_steps = 1000;
  double cos_min_ratio = 1e-4;  // ratio at total_num_steps and after
  std::string warmup_type = "log";
};

std::unique_ptr<LrSchedule> make_constant(double lr);
// Rises from warmup_min_lr to warmup_max_lr over warmup_num_steps, then stays there.
std::unique_ptr<LrSchedule> make_warmup(const WarmupOptions& options);
// As make_warmup, then falls linearly to warmup_min_lr at total_num_steps. A total below the
// warmup is allowed, as in DeepSpeed: the lr then drops to warmup_min_lr after the warmup.
std::unique_ptr<LrSchedule> make_warmup_decay(const WarmupOptions& options,
                                              int64_t total_num_steps);
// Warmup in ratio from warmup_min_ratio to 1, then a half cosine down to cos_min_ratio at
// total_num_steps, held there afterwards.
std::unique_ptr<LrSchedule> make_warmup_cosine(const WarmupCosineOptions& options);

}  // namespace zero::optim
