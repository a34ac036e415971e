// zero-memory's tensor- and pipeline-parallel part: the per-rank table of one (T, P) layout and
// the search over layouts (include/zero/parallel_plan.hpp).
#pragma once

#include <string>

#include "zero/parallel_plan.hpp"

namespace zero::tools {

// The layout in.tensor_parallel x in.pipeline_stages: per-rank bytes for each ZeRO stage and
// recompute, and the predicted step time with `recompute`.
void print_parallel_report(const PlanInput& in, const std::string& name, const PlanLimits& limits,
                           const LayoutHardware& hardware, Recompute recompute);

// The same layout as JSON for scripts (bench/pipeline_plan.py): per ZeRO stage, the worst rank's
// bytes and the predicted step time with `recompute`, every term of ParallelTime.
void print_parallel_json(const PlanInput& in, const LayoutHardware& hardware, Recompute recompute);

// The search: the best `top` layouts that fit, and the recommendation.
void print_parallel_search(const PlanInput& in, const std::string& name, const PlanLimits& limits,
                           const LayoutHardware& hardware, int top);

}  // namespace zero::tools
