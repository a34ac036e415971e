#include "zero/step/loss_scaler.hpp"

#include <ATen/ATen.h>

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

DeviceLossScaler::DeviceLossScaler(const Fp16Config& cfg, at::Device device)
    : dynamic_(cfg.loss_scale == 0),
      min_scale_(cfg.min_loss_scale),
      window_(cfg.loss_scale_window),
      hysteresis_(std::max(1, cfg.hysteresis)) {
  const LossScaler host(cfg);
  state_ = at::empty({4}, at::TensorOptions().dtype(at::kDouble).device(device));
  set_state(host.state());
}

at::Tensor DeviceLossScaler::scale_tensor() const { return state_.narrow(0, 0, 1).to(at::kFloat); }

at::Tensor DeviceLossScaler::hysteresis_left() const { return state_.narrow(0, 3, 1).clone(); }

// LossScaler::update as branch-free tensor arithmetic: every term is a 0/1 mask, so the new
// state is a blend of the candidates and nothing is read back.
void DeviceLossScaler::update(const at::Tensor& found_inf) {
  if (!active()) return;
  at::Tensor scale = state_[0], iter = state_[1], last = state_[2], left = state_[3];
  if (dynamic_) {
    const at::Tensor o = found_inf.reshape({}).to(at::kDouble);
    const at::Tensor halve = o * left.le(1);
    const at::Tensor wait = o * left.gt(1);
    const at::Tensor grow = (1 - o) * at::fmod(iter - last, static_cast<double>(window_)).eq(0);
    const at::Tensor new_scale =
        at::where(halve.to(at::kBool), at::clamp_min(scale / 2, min_scale_),
                  at::where(grow.to(at::kBool), scale * 2, scale));
    const at::Tensor new_left =
        at::where(wait.to(at::kBool), left - 1,
                  at::where(grow.to(at::kBool), at::full_like(left, hysteresis_), left));
    const at::Tensor new_last = at::where(o.to(at::kBool), iter, last);
    scale.copy_(new_scale);
    left.copy_(new_left);
    last.copy_(new_last);
  }
  iter.add_(1);
}

double DeviceLossScaler::scale() const { return active() ? state_[0].item<double>() : 1.0; }

LossScaler::State DeviceLossScaler::state() const {
  if (!active()) return {};
  const at::Tensor h = state_.cpu();
  const double* v = h.data_ptr<double>();
  return {v[0], static_cast<int64_t>(v[1]), static_cast<int64_t>(v[2]), static_cast<int>(v[3])};
}

void DeviceLossScaler::set_state(const LossScaler::State& s) {
  if (!active()) return;
  const at::Tensor h =
      at::tensor({s.scale, static_cast<double>(s.iter), static_cast<double>(s.last_overflow_iter),
                  static_cast<double>(s.hysteresis_left)},
                 at::kDouble);
  state_.copy_(h);
}

}  // namespace zero
