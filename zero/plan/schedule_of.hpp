// The pipeline schedule a plan describes, in the runtime's terms (internal to zero/plan).
#pragma once

#include "zero/memory_plan.hpp"
#include "zero/pipeline/schedule.hpp"

namespace zero {

// The schedule the runtime would run for `in` and its chunks per stage (v; 1 unless
// interleaved), as pipeline.schedule / pipeline.virtual_stages name them.
pipeline::ScheduleKind schedule_kind(const PlanInput& in);
int chunks_per_stage(const PlanInput& in);

}  // namespace zero
