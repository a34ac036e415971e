// zero-memory's report at T = P = 1: the per-rank memory table and the recommendation
// (zero_memory_report.cpp), the predicted step times (zero_memory_time.cpp), the same as JSON
// (zero_memory_json.cpp) and the two SVG charts. zero_memory.cpp parses the command line.
#pragma once

#include <string>

#include "zero/memory_plan.hpp"
#include "zero/time_plan.hpp"

namespace zero::tools {

inline constexpr Recompute kModes[] = {Recompute::kNone, Recompute::kCheckpoint,
                                       Recompute::kCheckpointOffload};
inline constexpr const char* kModeIds[] = {"none", "checkpoint", "offload"};  // JSON keys

// What --gpu/--link and the rate overrides describe, and how the time table is run.
struct TimeSetup {
  Hardware hw;
  StepShape step;  // stage set per column
};

// The predicted step of `stage` with ts's hardware and step shape.
TimeEstimate time_of(const PlanInput& in, const TimeSetup& ts, int stage);

// The per-rank memory of stages 0-3 and the recommendation, as text.
void print_report(const PlanInput& in, const std::string& name, const std::string& device_arg,
                  const MemoryPlan& plan);
// The predicted step time of each stage, and of the recommendation.
void print_time(const PlanInput& in, const TimeSetup& ts, const MemoryPlan& plan);
// Memory and time of each stage and the recommendation as JSON for scripts.
void print_json(const PlanInput& in, const MemoryPlan& plan, const TimeSetup& ts);
// --svg: stacked bars of stages 0-2; --time-svg: where each stage's step time goes.
void write_svg(const std::string& path, const PlanInput& in, const std::string& name,
               const MemoryPlan& plan);
void write_time_svg(const std::string& path, const PlanInput& in, const std::string& name,
                    const TimeSetup& ts);

}  // namespace zero::tools
