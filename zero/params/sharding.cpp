#include "zero/params/sharding.hpp"

#include <c10/util/Exception.h>

namespace zero {

Sharding Sharding::of_stage(int stage, int rank, int size) {
  TORCH_CHECK(stage >= 0 && stage <= 3, "zero: zero_optimization.stage ", stage,
              " is not a ZeRO stage; set 0, 1, 2 or 3");
  Sharding s;
  s.optimizer = stage >= 1;
  s.grads = stage >= 2;
  s.params = stage >= 3;
  s.owner = s.optimizer ? rank : 0;
  s.shards = s.optimizer ? size : 1;
  return s;
}

bool Sharding::keeps_full_gradient(int64_t accumulation, bool overlap_comm) const {
  // Stage 1 reduce-scatters during backward as stage 2 does unless it must hold the window's
  // sum across micro-steps, or reduce after backward (overlap_comm off, as DeepSpeed's ZeRO-1).
  return !optimizer || (!grads && (accumulation > 1 || !overlap_comm));
}

}  // namespace zero
