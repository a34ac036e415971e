// What drives micro-steps and steps, apart from the state they update (docs/design/
// sharded-units.md §1.1): accumulation, the loss scale, the verdict of the last step on its way
// to the host, and the flags that order backward() and step() calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "device/host_readback.hpp"
#include "optim/lr_schedule.hpp"
#include "zero/engine.hpp"
#include "zero/step/loss_scaler.hpp"

namespace zero {

struct StepProtocol {
  int64_t accumulation = 1;
  // gradient_predivide_factor as resolved for this run (Config says how).
  double predivide = 1;
  std::unique_ptr<optim::LrSchedule> schedule;
  // The step unscales and clips as DeepSpeed's unscale_and_clip_grads does (its norm, its
  // coefficient, a separate multiply), for the op-by-op AdamW that torch_adam selects.
  bool deepspeed_clip = false;
  EngineStats stats;
  DeviceLossScaler scaler;  // active under fp16 only
  bool in_backward = false;
  // The last step's {grad norm, skipped, loss scale before, after, hysteresis before, after}
  // (plus, at stage 3 on a device, whether the skip was the gather order's), on its way to the
  // host.
  HostReadback verdict;
  bool awaiting_step = false;  // a backward ran and its step() has not
  bool taken_over = false;     // a later zero::initialize on the same model owns the hooks now
  std::string deferred_error;  // a non-finite norm seen by settle(), thrown by the next step()
};

}  // namespace zero
