// What the planner's files share about a shape (internal to zero/plan).
#pragma once

#include "zero/memory_plan.hpp"

namespace zero {

// Only a shape that is the model (a preset) has a known parameter order.
bool shape_is_model(const PlanInput& in);

}  // namespace zero
