#include "zero/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

namespace zero {

LossScaler::LossScaler(const Fp16Config& cfg)
    : dynamic_(cfg.loss_scale == 0),
      scale_(cfg.loss_scale == 0 ? std::ldexp(1.0, cfg.initial_scale_power) : cfg.loss_scale),
      min_scale_(cfg.min_loss_scale),
      window_(cfg.loss_scale_window),
      hysteresis_(std::max(1, cfg.hysteresis)),
      hysteresis_left_(std::max(1, cfg.hysteresis)) {}

double LossScaler::update(bool overflow) {
  const double before = scale_;
  if (dynamic_) {
    if (overflow) {
      // Hysteresis tolerates isolated spikes: only the last allowed overflow lowers the scale.
      if (hysteresis_left_ <= 1) {
        scale_ = std::max(scale_ / 2, min_scale_);
      } else {
        --hysteresis_left_;
      }
      last_overflow_iter_ = iter_;
    } else if ((iter_ - last_overflow_iter_) % window_ == 0) {
      hysteresis_left_ = hysteresis_;
      scale_ *= 2;
    }
  }
  ++iter_;
  return before;
}

void LossScaler::set_state(const State& s) {
  scale_ = s.scale;
  iter_ = s.iter;
  last_overflow_iter_ = s.last_overflow_iter;
  hysteresis_left_ = s.hysteresis_left;
}

}  // namespace zero
