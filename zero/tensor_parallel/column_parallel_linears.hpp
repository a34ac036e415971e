// The column-parallel products without sequence parallelism as one autograd function, so that
// backward overlaps the input gradient's all-reduce with the weights' gradients, as Megatron's
// LinearWithGradAccumulationAndAsyncCommunication does:
//
//   forward   Y_i = X A_i^T + b_i                       (X whole on every rank)
//   backward  dX = all_reduce(sum_i dY_i A_i)  started, then  dA_i = dY_i^T X,  db_i = sum dY_i,
//             then the all-reduce waited for
//
// copy_to_region followed by at::linear computes the same values with the same products (the
// backward formulas are autograd's for at::linear), but autograd runs the all-reduce only after
// every product's backward, so it never overlaps. overlap = false waits at once (the old order),
// for benchmarks.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "zero/group.hpp"

namespace zero::tensor_parallel {

// `weights`: [out_i / T, in] each; `biases`: empty, or one per weight (undefined for none).
std::vector<at::Tensor> column_parallel_linears(const std::vector<at::Tensor>& weights,
                                                const std::vector<at::Tensor>& biases,
                                                const at::Tensor& x,
                                                const std::shared_ptr<zero::Group>& group,
                                                bool overlap = true);

}  // namespace zero::tensor_parallel
