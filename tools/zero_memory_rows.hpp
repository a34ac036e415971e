// What zero-memory's per-rank table prints for model states: the device part and, with
// optimizer offload, the split between device and host. Header-only so that a test checks the
// same functions the tool prints with (tests/test_memory_plan_stage3.cpp, ZeroMemoryRows).
#pragma once

#include <cstdint>

#include "zero/memory_plan.hpp"

namespace zero::tools {

// The model states a rank holds on the device between steps: plan_model_states less what lives
// in host memory (plan_host_states: the offloaded optimizer part, and at stage 3 the
// error-feedback residuals, which are page-locked host memory there). The device totals count
// this, as PlanCandidate::total does.
inline int64_t device_model_states(const PlanInput& in, int stage) {
  return plan_model_states(in, stage).total() - plan_host_states(in, stage);
}

struct OffloadSplit {
  int64_t device = 0;  // model states left on the device
  int64_t host = 0;    // in host memory (plan_host_states)
};

// `in` with optimizer offload on. The engine offloads at stages 1 to 3 (at stage 3 the device
// keeps each unit's compute shard, the host the fp32 master, the states and the gradient shard)
// and refuses it at stage 0: zeros there.
inline OffloadSplit optimizer_offload_split(PlanInput in, int stage) {
  if (stage == 0) return {};
  in.offload_optimizer = true;
  const int64_t host = plan_host_states(in, stage);
  return {plan_model_states(in, stage).total() - host, host};
}

}  // namespace zero::tools
