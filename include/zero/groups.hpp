// The process groups an engine is handed: the data-parallel group it shards and averages over,
// and the further groups the global gradient norm spans (tensor or pipeline parallel ranks that
// hold other parts of the same model).
//
// initialize(model, cfg, mesh) makes them from a mesh and the model's placements
// (engine_groups in parallel_dims.hpp); a program with layers of its own can write them out:
//
//   zero::Mesh mesh = zero::ParallelDims{.tp = 2}.build_mesh(world);
//   zero::Groups groups{mesh.dp, {{mesh.tp, {"ln.weight", "ln.bias", "fc2.bias"}}}};
//   auto engine = zero::initialize(model, cfg, groups);
//
// initialize(model, cfg, group) is Groups{group} (dp alone, no further norm groups).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zero/group.hpp"

namespace zero {

// A group the gradient norm also sums over (beyond the data-parallel one), and the parameters
// this rank holds that every rank of that group holds too, with the same gradient (a LayerNorm
// beside tensor-parallel linears): those are counted on the group's rank 0 only, so the norm
// sees each once, not group->size() times (Megatron's param_is_not_tensor_parallel_duplicate,
// DeepSpeed's model_parallel_rank == 0 test). Every other parameter is taken to be this rank's
// own part of the model (a column of a split weight, a pipeline stage's layers).
struct NormGroup {
  std::shared_ptr<Group> group;
  // Names as the model's named_parameters() gives them (tied weights under their first name).
  // A name the model does not have is an error at initialize.
  std::vector<std::string> replicated;
  // Parameters replicated across the group whose gradient each rank holds only a part of:
  // Megatron's sequence parallelism, where a norm's weight or a row-parallel layer's bias sees
  // this rank's part of the sequence only (tensor_parallel::Placement::grad_needs_all_reduce).
  // The engine reduces them over dp like any other gradient and then, once per optimizer step,
  // sums the pieces of them in this rank's gradient shard over the group in one all-reduce
  // (Megatron's finalize_model_grads order), so they are then the same on every rank of the
  // group and counted once in the norm, as `replicated` ones are (a name here need not be
  // listed there too). Unknown names are an error at initialize.
  std::vector<std::string> partial;
};

// Where a parameter this rank holds lies in the whole model's tensor of that name: a
// tensor-parallel rank holds a block of a split weight. Checkpoints record it, so that a
// checkpoint saved under one tensor-parallel size loads under another (each rank reads the
// blocks covering its own) and consolidates into whole tensors.
struct TensorPart {
  std::string name;                   // as in named_parameters()
  std::vector<int64_t> global_shape;  // the whole tensor's shape
  std::vector<int64_t> offset;        // this rank's block's first index along each dimension
};

struct Groups {
  // The data-parallel group: parameters start from its rank 0's values (broadcast within it
  // only), gradients are averaged over it, and the master weights, gradients and optimizer
  // states are sharded over it (ZeRO stages 1, 2). Required.
  std::shared_ptr<Group> dp;
  // The groups the global gradient norm (gradient_clipping, stats().last_grad_norm) sums over
  // after dp, in this order. dp itself is not listed, and every rank of `dp` must be at the same
  // rank in each of them (a mesh's dimensions are): initialize checks both (one all_gather over
  // dp). Empty: dp alone, the one-dimension path, unchanged to the bit.
  std::vector<NormGroup> norm;
  // The parameters this rank holds a part of (tensor_parallel::checkpoint_parts makes them from
  // a model's placements); every other parameter is whole. Only checkpoints read them.
  std::vector<TensorPart> parts;
};

}  // namespace zero
