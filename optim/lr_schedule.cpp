#include "optim/lr_schedule.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <numbers>

namespace zero::optim {
namespace {

// The scalar arithmetic mirrors deepspeed/runtime/lr_schedules.py expression by expression so
// the values agree to the last bit with a DeepSpeed run of the same config.

void check_iteration(int64_t it) {
  TORCH_CHECK(it >= 0, "zero: scheduler iteration ", it, " must be >= 0");
}

void check_lr(const char* what, double lr) {
  TORCH_CHECK(std::isfinite(lr) && lr >= 0, "zero: scheduler ", what,
              " must be finite and >= 0, got ", lr);
}

// The warmup ramp from 0 to 1 shared by all three schedules.
class Ramp {
 public:
  Ramp(int64_t warmup_num_steps, const std::string& warmup_type) {
    TORCH_CHECK(warmup_num_steps >= 1,
                "zero: scheduler warmup_num_steps must be a positive integer, got ",
                warmup_num_steps);
    TORCH_CHECK(warmup_type == "log" || warmup_type == "linear",
                "zero: scheduler warmup_type must be \"log\" or \"linear\", got \"", warmup_type,
                "\"");
    // DeepSpeed clamps to 2 so that the log ramp never divides by log(1) == 0.
    steps_ = std::max<int64_t>(2, warmup_num_steps);
    log_ = warmup_type == "log";
    inverse_log_ = 1.0 / std::log(static_cast<double>(steps_));
  }
  int64_t steps() const { return steps_; }
  bool warming(int64_t step) const { return step < steps_; }
  // Only for warming(step).
  double gamma(int64_t step) const {
    if (log_) return inverse_log_ * std::log(static_cast<double>(step + 1));
    return static_cast<double>(step) / static_cast<double>(steps_);
  }

 private:
  int64_t steps_ = 2;
  bool log_ = true;
  double inverse_log_ = 0;
};

// DeepSpeed only warns when total_num_steps is below the warmup (the config loader does too);
// the formulas stay defined because their denominators are clamped to >= 1.
void check_total(int64_t total_num_steps) {
  TORCH_CHECK(total_num_steps > 0, "zero: scheduler total_num_steps (", total_num_steps,
              ") must be positive; set scheduler.params.total_num_steps to the run's number of "
              "optimizer steps");
}

class Constant final : public LrSchedule {
 public:
  explicit Constant(double lr) : lr_(lr) { check_lr("lr", lr); }
  double at_iteration(int64_t it) const override {
    check_iteration(it);
    return lr_;
  }
  double initial_lr() const override { return lr_; }

 private:
  double lr_;
};

class Warmup : public LrSchedule {
 public:
  explicit Warmup(const WarmupOptions& o)
      : ramp_(o.warmup_num_steps, o.warmup_type),
        min_lr_(o.warmup_min_lr),
        delta_lr_(o.warmup_max_lr - o.warmup_min_lr) {
    check_lr("warmup_min_lr", o.warmup_min_lr);
    check_lr("warmup_max_lr", o.warmup_max_lr);
    TORCH_CHECK(o.warmup_min_lr <= o.warmup_max_lr, "zero: scheduler warmup_min_lr (",
                o.warmup_min_lr, ") exceeds warmup_max_lr (", o.warmup_max_lr,
                "); the warmup must not lower the lr");
  }
  double at_iteration(int64_t it) const override {
    check_iteration(it);
    return min_lr_ + delta_lr_ * gamma(it);
  }
  // WarmupLR.get_lr() before the first step() returns min_lrs.
  double initial_lr() const override { return min_lr_; }

 protected:
  virtual double gamma(int64_t step) const { return ramp_.warming(step) ? ramp_.gamma(step) : 1.0; }
  const Ramp& ramp() const { return ramp_; }

 private:
  Ramp ramp_;
  double min_lr_;
  double delta_lr_;
};

class WarmupDecay final : public Warmup {
 public:
  WarmupDecay(const WarmupOptions& o, int64_t total_num_steps)
      : Warmup(o), total_(total_num_steps) {
    check_total(total_num_steps);
  }

 protected:
  double gamma(int64_t step) const override {
    if (ramp().warming(step)) return ramp().gamma(step);
    return std::max(0.0, static_cast<double>(total_ - step) /
                             std::max(1.0, static_cast<double>(total_ - ramp().steps())));
  }

 private:
  int64_t total_;
};

class WarmupCosine final : public LrSchedule {
 public:
  explicit WarmupCosine(const WarmupCosineOptions& o)
      : o_(o), ramp_(o.warmup_num_steps, o.warmup_type) {
    check_lr("base_lr (optimizer.lr)", o.base_lr);
    check_total(o.total_num_steps);
    TORCH_CHECK(o.warmup_min_ratio >= 0 && o.warmup_min_ratio <= 1,
                "zero: scheduler warmup_min_ratio must be in [0, 1], got ", o.warmup_min_ratio);
    TORCH_CHECK(o.cos_min_ratio >= 0 && o.cos_min_ratio <= 1,
                "zero: scheduler cos_min_ratio must be in [0, 1], got ", o.cos_min_ratio);
  }
  double at_iteration(int64_t it) const override {
    check_iteration(it);
    return o_.base_lr * ratio(it);
  }
  // WarmupCosineLR.get_lr() before the first step() returns 0 for every group.
  double initial_lr() const override { return 0.0; }

 private:
  double ratio(int64_t step) const {
    if (ramp_.warming(step)) {
      return o_.warmup_min_ratio + ramp_.gamma(step) * (1. - o_.warmup_min_ratio);
    }
    // The decay counts its first step as 1, so the lr already drops on the step after warmup.
    const int64_t real_last_step = step - ramp_.steps() + 1;
    const int64_t real_total_steps = std::max<int64_t>(1, o_.total_num_steps - ramp_.steps());
    // Clamped so the lr stays at the floor past total_num_steps instead of rising again.
    const double progress =
        std::min(1.0, static_cast<double>(real_last_step) / static_cast<double>(real_total_steps));
    const double cosine = (1 + std::cos(std::numbers::pi * progress)) / 2;
    return std::max(0.0, o_.cos_min_ratio + (1. - o_.cos_min_ratio) * cosine);
  }

  WarmupCosineOptions o_;
  Ramp ramp_;
};

}  // namespace

double LrSchedule::lr_at(int64_t step) const {
  TORCH_CHECK(step >= 0, "zero: lr_at(", step, "): the step count must be >= 0");
  return step == 0 ? initial_lr() : at_iteration(step - 1);
}

std::unique_ptr<LrSchedule> make_constant(double lr) { return std::make_unique<Constant>(lr); }

std::unique_ptr<LrSchedule> make_warmup(const WarmupOptions& options) {
  return std::make_unique<Warmup>(options);
}

std::unique_ptr<LrSchedule> make_warmup_decay(const WarmupOptions& options,
                                              int64_t total_num_steps) {
  return std::make_unique<WarmupDecay>(options, total_num_steps);
}

std::unique_ptr<LrSchedule> make_warmup_cosine(const WarmupCosineOptions& options) {
  return std::make_unique<WarmupCosine>(options);
}

}  // namespace zero::optim
