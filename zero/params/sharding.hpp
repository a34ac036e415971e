// What a ZeRO stage shards, worked out once: the engine, its checkpoints and the norm ask this
// instead of comparing stage numbers (the planner in zero/plan and the config keep their own
// view of the stage: they describe runs, this drives one).
#pragma once

#include <cstdint>

namespace zero {

struct Sharding {
  // The fp32 master weights and the optimizer states: this rank keeps its shard of each bucket
  // (stages 1, 2), or all of them (stage 0).
  bool optimizer = false;
  // Gradients must not outlive a micro-step whole: each bucket is reduce-scattered as backward
  // fills it and only this rank's shard is kept (stage 2; stage 1 does the same when it need
  // not keep an accumulator, keeps_full_gradient() in zero/memory.hpp).
  bool grads = false;
  // The compute-dtype parameters themselves (stage 3): this rank keeps its shard of each unit's
  // buckets and gathers a unit whole only while it runs. The engine refuses stage 3 until its
  // units can gather and release (docs/design/sharded-units.md §7); the flags are here first.
  bool params = false;
  // The rank whose shard of each bucket this rank's master and states are: its own rank in the
  // data-parallel group when sharded, 0 otherwise (every rank holds shard 0, the whole).
  int owner = 0;
  // Shards per bucket: the data-parallel group's size when sharded, 1 otherwise.
  int shards = 1;

  // `stage`: zero_optimization.stage (0, 1, 2, 3); `rank`, `size`: this rank in the
  // data-parallel group.
  static Sharding of_stage(int stage, int rank, int size);
  // The stage these flags are (for reports, the memory model and the checkpoint manifest).
  int stage() const { return params ? 3 : grads ? 2 : optimizer ? 1 : 0; }
  // Stage 1 under the given accumulation and overlap keeps a full gradient accumulator and
  // reduces it once per window; stage 0 always does; stages 2 and 3 never (the partitioned
  // gradient only).
  bool keeps_full_gradient(int64_t accumulation, bool overlap_comm) const;
};

}  // namespace zero
