// How each parameter of a tensor-parallel model lies across the tensor-parallel ranks, so that
// whoever reduces gradients, clips by the global norm or saves a checkpoint can treat it right:
//   - sharded: each rank holds a different part (partition_dim); its gradient is complete on its
//     rank. Counted once per rank in a norm (sum the squares over the tensor-parallel group).
//   - replicated: every rank holds the same tensor. Counted once in a norm (not summed over the
//     group). Its gradient is the same on every rank, except under sequence parallelism when the
//     parameter acts on this rank's part of the sequence only (a norm's weight, a row-parallel
//     layer's bias): then each rank holds a partial sum and the gradients must be all-reduced over
//     the tensor-parallel group before the step (Megatron's sequence_parallel parameters).
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "zero/group.hpp"
#include "zero/groups.hpp"

namespace zero::tensor_parallel {

struct Placement {
  bool sharded = false;
  int64_t partition_dim = -1;          // sharded only
  bool grad_needs_all_reduce = false;  // replicated only: see above
};

// The layers of this folder describe their own parameters.
class TensorParallelLayer {
 public:
  virtual ~TensorParallelLayer() = default;
  // Placement of each of the layer's own parameters, by the name it registered it under.
  virtual Placement placement(const std::string& param_name) const = 0;
};

// Under sequence parallelism a replicated parameter outside this folder's layers acts either on
// this rank's part of the sequence (a norm between the parallel regions: its gradient is a
// partial sum, all-reduced over the group) or on the whole sequence, or on none (a parameter
// applied after a gather: its gradient is whole on every rank already; summing it would
// multiply it by the group's size). The module cannot tell which, so the model says, as
// Megatron-LM marks its layers' parameters `sequence_parallel`: the module holding the parameter,
// or any module enclosing it, implements SequenceParallelModule. placements() refuses an unmarked
// one under sequence parallelism, naming it; without sequence parallelism none is asked.
enum class SequenceShare {
  kUnsaid,   // not this module's to say; an enclosing module may
  kPartial,  // acts on this rank's part of the sequence: gradient all-reduced over the group
  kWhole,    // acts on the whole sequence (or none): gradient left as it is
};

class SequenceParallelModule {
 public:
  virtual ~SequenceParallelModule() = default;
  // For a parameter below this module, by its name relative to this module
  // ("attn_norm.weight"). Asked innermost module first; the first answer other than kUnsaid wins.
  virtual SequenceShare sequence_share(const std::string& param_name) const = 0;
};

struct NamedPlacement {
  std::string name;  // as in module.named_parameters()
  at::Tensor param;
  Placement placement;
};

// Every parameter of `model`: the layers of this folder say theirs; any other parameter (a norm,
// a replicated head) is replicated, and when `sequence_parallel` needs its gradient all-reduced
// if the SequenceParallelModule around it says kPartial. Throws std::invalid_argument naming
// every replicated parameter that no enclosing module marks, under sequence parallelism (the
// same on every rank: no communication).
std::vector<NamedPlacement> placements(const torch::nn::Module& model, bool sequence_parallel);

// All-reduces (sums), over the tensor-parallel `group`, the gradients of the parameters whose
// placement says grad_needs_all_reduce, in one collective; a parameter without a gradient counts
// as zero. Every rank of the group calls it after backward and before the optimizer step.
void all_reduce_partial_grads(const std::vector<NamedPlacement>& params, zero::Group& group);

// The squared L2 norm of the whole (unsplit) model's gradient, the same on every rank: the
// sharded parameters' squares summed over the tensor-parallel group, each replicated parameter
// counted once (not once per rank). Call after all_reduce_partial_grads. A collective. With data
// parallelism too, this is the tensor-parallel half: sum the data-parallel shards first.
double grad_norm_sq(const std::vector<NamedPlacement>& params, zero::Group& group);

// Every parameter at its full (unsplit) shape, by name, in `params` order: the sharded ones
// all-gathered over the tensor-parallel `group` along their partition_dim, the replicated ones
// copied. A collective (every rank of the group calls it); for export, checkpoint consolidation
// and tests.
std::vector<std::pair<std::string, at::Tensor>> gather_full(
    const std::vector<NamedPlacement>& params, zero::Group& group);

// The inverse: copies into each parameter this rank's part of the full tensor `full(name)`
// returns (the same full tensors on every rank), keeping the parameter's device and dtype. Throws
// std::invalid_argument naming the parameter when `full` returns an undefined tensor or one of
// the wrong shape. No communication.
void load_full(const std::vector<NamedPlacement>& params,
               const std::function<at::Tensor(const std::string& name)>& full,
               const zero::Group& group);

// Where this rank's block of each sharded parameter lies in the whole tensor, for the engine's
// checkpoints (Groups::parts): the tensor-parallel size times its size along partition_dim,
// starting at the group rank's multiple of it. Replicated parameters are whole and not listed.
// With them a checkpoint loads under another tensor-parallel size and consolidates (
// Engine::load_checkpoint(dirs), read_consolidated(dirs)). No communication.
std::vector<TensorPart> checkpoint_parts(const std::vector<NamedPlacement>& params,
                                         const zero::Group& group);

}  // namespace zero::tensor_parallel
