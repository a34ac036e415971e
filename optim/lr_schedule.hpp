// Learning-rate schedules: DeepSpeed's WarmupLR, WarmupDecayLR and WarmupCosineLR as pure
// functions of the step count, so resuming a run needs only the optimizer's steps().
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace zero::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // `step`: optimizer steps already taken; the first step uses lr_at(0). This is DeepSpeed's
  // `last_batch_iteration` in its get_lr() formulas.
  virtual double lr_at(int64_t step) const = 0;
};

struct WarmupOptions {
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 1e-3;
  int64_t warmup_num_steps = 1000;  // values below 2 act as 2, as in DeepSpeed
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
// As make_warmup, then falls linearly to 0 at total_num_steps.
std::unique_ptr<LrSchedule> make_warmup_decay(const WarmupOptions& options,
                                              int64_t total_num_steps);
// Warmup in ratio from warmup_min_ratio to 1, then a half cosine down to cos_min_ratio at
// total_num_steps, held there afterwards.
std::unique_ptr<LrSchedule> make_warmup_cosine(const WarmupCosineOptions& options);

}  // namespace zero::optim
