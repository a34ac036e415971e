// Gradients that each rank of a further group (tensor parallel) holds only a part of, summed
// over that group once per optimizer step, after the data-parallel reduction.
//
// Under Megatron's sequence parallelism a norm's weight (and a row-parallel layer's bias) is
// replicated across the tensor-parallel ranks but acts on this rank's part of the sequence
// only, so its gradient on each rank is a partial sum: the whole gradient is their sum over the
// tensor-parallel group. Megatron sums them in finalize_model_grads (_allreduce_layernorm_grads,
// the parameters marked `sequence_parallel`), after the data-parallel gradient sync and in one
// coalesced all-reduce. So does this: the data-parallel path (every stage, accumulation,
// compression) reduces the partial gradients like any other, and at the step the pieces of them
// in this rank's gradient shard go over the group in one flat all-reduce per group. Sums are
// linear, so summing over dp then tp equals summing over tp then dp, and summing the window's
// sum equals summing each micro-step's. The tensor-parallel peers of a data-parallel rank hold
// the same layout (the same model, each rank's shards of equal size) and the same owner rank,
// so their pieces line up element for element.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "comm/group.hpp"
#include "zero/grads/grad_sink.hpp"
#include "zero/params/shard_info.hpp"

namespace zero {

class PartialGradSum {
 public:
  // `params`: the layout's parameter count.
  explicit PartialGradSum(int params = 0) : groups_of_(params) {}

  // Parameter `param` (layout index) holds a partial gradient over `group`.
  void add(int param, const std::shared_ptr<comm::Group>& group);
  bool empty() const { return empty_; }
  bool partial(int param) const { return !groups_of_[param].empty(); }

  // At the optimizer step, once the data-parallel reduction completed: sums, over each group,
  // the pieces of the partial parameters that `shard` (this rank's gradient shard, laid out as
  // `layout`'s shard of `owner`) holds, in place. One all-reduce per group, of those pieces
  // gathered into one fp32 buffer (a 16-bit shard is rounded once, after the sum) on the
  // group's bound device (an offloaded host shard's pieces travel there and back). Every rank
  // of such a group calls it at the same step; the wait is bounded by the group's comm_timeout.
  void sum_shard(GradSink& shard, const FlatLayout& layout, int owner) const;

 private:
  std::vector<std::vector<std::shared_ptr<comm::Group>>> groups_of_;  // per layout parameter
  std::vector<std::shared_ptr<comm::Group>> groups_;                  // each once, first seen first
  bool empty_ = true;
};

}  // namespace zero
