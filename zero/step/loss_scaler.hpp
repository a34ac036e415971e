// fp16 loss scaling with DeepSpeed's DynamicLossScaler rules, as a pure state machine so the
// engine, its checkpoint and the tests share one definition.
//
// fp16 gradients underflow below 2^-24: the loss is multiplied by `scale()` before backward and
// the gradients divided by it before the step. An overflow (inf/NaN anywhere in the reduced
// gradients) skips the step; `hysteresis` overflows in a row halve the scale, and every
// `window` clean steps since the last overflow double it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "zero/config.hpp"

namespace zero {

class LossScaler {
 public:
  // `cfg.loss_scale` > 0 fixes the scale; 0 means dynamic, from 2^initial_scale_power.
  explicit LossScaler(const Fp16Config& cfg);
  // An inactive scaler (bf16/fp32) has scale 1 and never skips.
  LossScaler() = default;

  double scale() const { return scale_; }
  bool dynamic() const { return dynamic_; }
  // Records the outcome of one optimizer step; returns the scale before the update.
  double update(bool overflow);

  // Checkpointed state, so a resumed run continues with the same scale and counters.
  struct State {
    double scale = 1.0;
    int64_t iter = 0;
    int64_t last_overflow_iter = -1;
    int hysteresis_left = 1;
  };
  State state() const { return {scale_, iter_, last_overflow_iter_, hysteresis_left_}; }
  void set_state(const State& s);

 private:
  bool dynamic_ = false;
  double scale_ = 1.0;
  double min_scale_ = 1.0;
  int64_t window_ = 1000;
  int hysteresis_ = 1;
  int hysteresis_left_ = 1;
  int64_t iter_ = 0;
  int64_t last_overflow_iter_ = -1;
};

// The same rules with the state in a small device tensor, so the engine's step never reads the
// overflow verdict on the host: update() takes the verdict as a device tensor, and the scale
// that multiplies the loss is a device tensor too. Reading scale()/state() syncs (checkpoints,
// logging); the step does not.
class DeviceLossScaler {
 public:
  DeviceLossScaler() = default;  // inactive: scale 1, update() does nothing
  DeviceLossScaler(const Fp16Config& cfg, at::Device device);

  bool active() const { return state_.defined(); }
  // fp32 one-element tensor on the device (only when active()).
  at::Tensor scale_tensor() const;
  // A copy of the overflows the scale still tolerates before it drops (fp16.hysteresis), on the
  // device: a one-element fp64 tensor.
  at::Tensor hysteresis_left() const;
  // found_inf: one-element tensor on the device, 1 where the step overflowed.
  void update(const at::Tensor& found_inf);
  double scale() const;
  LossScaler::State state() const;
  void set_state(const LossScaler::State& s);

 private:
  bool dynamic_ = false;
  double min_scale_ = 1;
  int64_t window_ = 1000;
  int hysteresis_ = 1;
  at::Tensor state_;  // fp64 {scale, iter, last_overflow_iter, hysteresis_left}
};

}  // namespace zero
