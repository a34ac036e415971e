// Deprecated: zero::ParallelDims{.tp = 2}.build_mesh(world) (zero/parallel_dims.hpp) makes the same
// groups and the pipeline's too; this is a view of its mesh, kept for the programs written
// against it.
//
// The process groups of tensor parallelism composed with data parallelism (2D), laid out as
// Megatron-LM's initialize_model_parallel does: tensor-parallel ranks adjacent (one node's GPUs,
// the fastest links), data-parallel groups across them:
//
//   world rank = tp_rank + dp_rank * tp        (4 ranks, tp 2: tp {0,1} {2,3}; dp {0,2} {1,3})
//
//   auto world = zero::process_group_from_env(cfg, device.type());
//   auto groups = zero::tensor_parallel::make_groups(world, /*tp=*/2);
//   // the model's layers get groups.tp; the engine the whole mesh, not groups.dp alone (which
//   // would clip by the norm over dp only, missing the other tensor-parallel ranks' shards):
//   auto engine = zero::initialize(model, cfg, groups.mesh());
#pragma once

#include <memory>
#include <string>

#include "zero/group.hpp"
#include "zero/parallel_dims.hpp"

namespace zero::tensor_parallel {

struct Groups {
  std::shared_ptr<zero::Group> world, tp, dp;
  std::shared_ptr<zero::Group> pp;  // the mesh's pipeline group, of one rank (may be null)
  int tp_rank() const { return tp->rank(); }
  int dp_rank() const { return dp->rank(); }
  // "tp 2 x dp 2".
  std::string describe() const;
  // The view of a mesh's world, tp and dp groups.
  static Groups of(const Mesh& mesh);
  // The mesh these groups are a view of (pp of one rank; sp as given).
  Mesh mesh(bool sequence_parallel = false) const;
};

// ParallelDims{.tp = tp}.build_mesh(world), viewed. A collective over `world`: every rank calls it with the same `tp`. Throws
// std::invalid_argument naming the world size and tp when tp does not divide it (or is < 1).
Groups make_groups(std::shared_ptr<zero::Group> world, int tp);

}  // namespace zero::tensor_parallel
