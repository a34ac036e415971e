// Which unit each parameter belongs to at stage 3 (design sharded-units.md §2.1): a pure
// function of names and sizes, so every rank computes the same plan and tests can enumerate it.
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace zero::units {

struct PlanParam {
  std::string name;  // as in the root module's named_parameters(): "blocks.3.wq.weight"
  int64_t numel = 0;
};

struct PlanInput {
  // Every named parameter, in named_parameters() order (registration order, depth first).
  std::vector<PlanParam> params;
  // Names of the modules marked with zero::shard (unit_registry.hpp marked_names). "" is the
  // model itself: the root unit, whatever it holds.
  std::vector<std::string> marked;
  // Groups of indices into `params` naming one tensor (tied weights). A group counts as one
  // parameter, at its first member's position.
  std::vector<std::vector<int>> ties;
  // DeepSpeed's stage3_param_persistence_threshold / stage3_model_persistence_threshold.
  int64_t param_persistence_threshold = 100000;
  int64_t model_persistence_threshold = std::numeric_limits<int64_t>::max();
};

struct UnitPlan {
  static constexpr int kRoot = 0;
  std::vector<int> unit_of;        // per PlanInput::params entry; kRoot or 1..units()-1
  std::vector<std::string> names;  // names[0] = "<root>", names[u] = the marked module's name
  std::vector<bool> persistent;    // per parameter: in the root because it is small
  int64_t persistent_numel = 0;    // counted once per tied group
  int units() const { return static_cast<int>(names.size()); }
};

// A parameter belongs to the innermost marked module whose name is a prefix of its own (at a
// '.' boundary), except that it stays in the root when
//  - no marked module owns it;
//  - it is tied to a parameter of another unit (or of the root);
//  - it is persistent: DeepSpeed's rule (DeepSpeedZeRoOffload.mark_persistent_parameters), in
//    parameter order: numel <= param threshold, skipped when it would take the persistent total
//    past the model threshold.
// Units are numbered by their modules' order in `marked`, counting only those left with a
// parameter. Throws std::invalid_argument on a tie index out of range or a parameter in two
// groups.
UnitPlan plan_units(const PlanInput& in);

}  // namespace zero::units
