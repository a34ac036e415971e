// The per-rank state every unit of an engine shares (docs/design/sharded-units.md §2.2): the
// flat parameters with this rank's master shard, the gradient path, the optimizer over the whole
// shard and optimizer offload. One per engine; a unit (sharded_unit.hpp) is a window of it.
// Stages 0-2 are one unit over every bucket, so the store holds exactly what the engine held.
#pragma once

#include <memory>

#include "optim/shard_optimizer.hpp"
#include "zero/grads/grad_sync.hpp"
#include "zero/params/flat_params.hpp"
#include "zero/step/optimizer_offload.hpp"

namespace zero {

struct ShardStore {
  FlatParams fp;
  // One collector, one bucket pool, for every unit.
  std::unique_ptr<GradSync> grads;
  // The whole shard's optimizer, stepped by windows.
  std::unique_ptr<optim::ShardOptimizer> optimizer;
  // Null without optimizer offload (zero/step/optimizer_offload.hpp).
  std::unique_ptr<OptimizerOffload> offload;
};

}  // namespace zero
