// The engine's side of zero::run_unit at stage 3 (docs/design/sharded-units.md §3, §7 part 5):
// the UnitRuntime that the registry binds each marked module to. Units are numbered as the
// engine's `units` (layout order). No trace yet: nothing is prefetched, and every unit is
// released after its forward (DeepSpeed's stage3_max_reuse_distance is not applied).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "zero/units/sharded_unit.hpp"
#include "zero/units/unit_runtime.hpp"

namespace zero {

class EngineUnits : public units::UnitRuntime {
 public:
  // `in_backward`: the engine's flag, true while its backward runs. `on_forward(unit)` /
  // `on_backward(unit)`: the unit's forward began / its boundary was reached in backward, its
  // gather issued and not yet waited for.
  EngineUnits(std::vector<ShardedUnit*> units, const bool& in_backward,
              std::function<void(int)> on_forward, std::function<void(int)> on_backward)
      : units_(std::move(units)),
        in_backward_(in_backward),
        on_forward_(std::move(on_forward)),
        on_backward_(std::move(on_backward)) {}

  void gather(int unit) override { at(unit).gather(); }
  void wait(int unit) override { at(unit).wait(); }
  void release(int unit) override { at(unit).release(); }
  bool gathered(int unit) const override { return at(unit).gathered(); }
  void entered_forward(int unit) override {
    if (on_forward_) on_forward_(unit);
  }
  void entered_backward(int unit) override {
    if (on_backward_) on_backward_(unit);
  }
  void prefetch() override {}
  bool in_backward() const override { return in_backward_; }
  bool keep_after_forward(int) const override { return false; }
  std::string unit_name(int unit) const override { return at(unit).name(); }

 private:
  ShardedUnit& at(int unit) const {
    TORCH_CHECK(unit >= 0 && unit < static_cast<int>(units_.size()), "zero: unit ", unit,
                " is not one of this engine's ", units_.size());
    return *units_[unit];
  }
  std::vector<ShardedUnit*> units_;
  const bool& in_backward_;
  std::function<void(int)> on_forward_;
  std::function<void(int)> on_backward_;
};

}  // namespace zero
