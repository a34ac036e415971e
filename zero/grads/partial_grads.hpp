// Gradients that each rank of a further group (tensor parallel) holds only a part of, summed
// over that group as they arrive, before the data-parallel reduction sees them.
//
// Under Megatron's sequence parallelism a norm's weight (and a row-parallel layer's bias) is
// replicated across the tensor-parallel ranks but acts on this rank's part of the sequence
// only, so its gradient on each rank is a partial sum: the whole gradient is their sum over the
// tensor-parallel group. Megatron sums them in finalize_model_grads (_allreduce_layernorm_grads,
// the parameters marked `sequence_parallel`). Here the sum runs in the post-accumulate hook,
// before GradSync::on_grad: under stage 2 the gradient then enters its bucket (and the
// reduce-scatter over dp) already whole, and every stage reduces the same values. Summing is
// linear, so summing each micro-step's gradient equals summing the window's.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/group.hpp"

namespace zero {

class PartialGradSum {
 public:
  // `params`: the layout's parameter count.
  explicit PartialGradSum(int params = 0) : groups_of_(params) {}

  // Parameter `param` (layout index) holds a partial gradient over `group`.
  void add(int param, const std::shared_ptr<comm::Group>& group);
  bool empty() const { return empty_; }
  bool partial(int param) const { return !groups_of_[param].empty(); }

  // From the gradient hook of `param` (`name` for the error of a failed collective): sums
  // `grad` in place over each group `param` is partial across. Every rank of such a group calls
  // it for the same parameters in the same order: the model is the same on every
  // tensor-parallel rank, so autograd delivers their gradients in the same order. The sum runs
  // in fp32 (a bf16/fp16 gradient is rounded once, after it); the wait is bounded by the
  // group's comm_timeout.
  void on_grad(int param, const std::string& name, at::Tensor& grad) const;

 private:
  std::vector<std::vector<std::shared_ptr<comm::Group>>> groups_of_;  // per layout parameter
  bool empty_ = true;
};

}  // namespace zero
