// The engine's side of zero::run_unit at stage 3 (docs/design/sharded-units.md §3, §3.5, §7
// part 5): the UnitRuntime that the registry binds each marked module to. Units are numbered as
// the engine's `units` (layout order).
//
// The trace (units::UnitTrace): the first pass (forward, then backward, of a micro-step) is
// recorded; in the passes that follow it, each unit's entry in forward and in backward issues
// the gathers of the units the trace says come next (units::prefetch_after, within
// stage3_prefetch_bucket_size and stage3_max_live_parameters), asynchronously on the units'
// communicator, so that they run while the current unit computes; and a unit that recurs within
// stage3_max_reuse_distance elements of trace stays gathered after its forward (DeepSpeed's
// PartitionedParameterCoordinator). Every gather issued is recorded in a GatherOrder whose hash
// the engine compares across ranks at the end of each backward (units::OrderCheck): every rank
// follows the same trace, a pass that leaves it prefetches nothing more on every rank alike (and
// is recorded as the new trace), and anything else shows as a mismatch there.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "zero/units/order_check.hpp"
#include "zero/units/sharded_unit.hpp"
#include "zero/units/unit_runtime.hpp"
#include "zero/units/unit_trace.hpp"

namespace zero {

class EngineUnits : public units::UnitRuntime {
 public:
  // `in_backward`: the engine's flag, true while its backward runs. `on_forward(unit)` /
  // `on_backward(unit)`: the unit's forward began / its boundary was reached in backward, its
  // gather issued and not yet waited for.
  EngineUnits(std::vector<ShardedUnit*> units, const bool& in_backward,
              units::PrefetchLimits limits, std::function<void(int)> on_forward,
              std::function<void(int)> on_backward);

  void gather(int unit) override;
  void wait(int unit) override;
  void release(int unit) override { at(unit).release(); }
  bool gathered(int unit) const override { return at(unit).gathered(); }
  void entered_forward(int unit) override;
  void entered_backward(int unit) override;
  void prefetch() override;
  bool in_backward() const override { return in_backward_; }
  bool keep_after_forward(int unit) const override;
  std::string unit_name(int unit) const override { return at(unit).name(); }

  // The end of a backward (every unit released by then): a collective over `gathers`, the
  // units' communicator, comparing this pass's gather order across ranks (throws on every rank
  // when it differs), then the pass closes in the trace.
  void end_pass(comm::Group& gathers, const c10::Device& device);
  // After a failed backward: the pass, the recorded order and the trace are dropped (the next
  // pass is recorded afresh, prefetching nothing).
  void abandon_pass();
  // The last pass's device order comparison, still on its way (undefined on the CPU or when
  // read), and reading it (OrderCheck::pending_flag / settle).
  at::Tensor pending_order_flag() const { return check_.pending_flag(); }
  void settle_order(comm::Group& gathers, const c10::Device& device) {
    check_.settle(gathers, device);
  }

  // Since the last take: seconds the host waited in wait() (gloo; on NCCL the stream waits
  // instead, ~0), what neither prefetch nor the compute before it hid.
  double take_wait_seconds() { return std::exchange(wait_seconds_, 0.0); }
  struct Counters {
    int64_t gathers = 0;     // every unit gather issued
    int64_t prefetched = 0;  // of which issued ahead of the unit's entry, by prefetch()
  };
  const Counters& counters() const { return counters_; }
  const units::UnitTrace& trace() const { return trace_; }

 private:
  ShardedUnit& at(int unit) const {
    TORCH_CHECK(unit >= 0 && unit < static_cast<int>(units_.size()), "zero: unit ", unit,
                " is not one of this engine's ", units_.size());
    return *units_[unit];
  }
  // Elements of the units gathered on use that are gathered or gathering now.
  int64_t live_numel() const;

  std::vector<ShardedUnit*> units_;
  std::vector<int64_t> numel_;  // each unit's gathered buffer in elements (resident: 0)
  const bool& in_backward_;
  units::PrefetchLimits limits_;
  std::function<void(int)> on_forward_;
  std::function<void(int)> on_backward_;
  units::UnitTrace trace_;
  units::GatherOrder order_;
  units::OrderCheck check_;
  double wait_seconds_ = 0;
  Counters counters_;
};

}  // namespace zero
