// A column-parallel product under sequence parallelism that keeps only this rank's part of the
// sequence for backward, as Megatron's LinearWithGradAccumulationAndAsyncCommunication does:
//
//   forward   Y = all_gather(X_r) A^T + b             (the gathered input is a temporary)
//   backward  dX_r = reduce_scatter(dY A)             dA = dY^T all_gather(X_r)   db = sum dY
//
// gather_from_sequence_region followed by at::linear computes the same, but autograd then keeps
// the gathered input, T times the shard, once per layer that reads it (q, k and v three copies):
// sequence parallelism cost activation memory instead of saving it. Re-gathering in backward
// costs one more all-gather per layer. Backward overlaps as Megatron's does: the input's
// all-gather runs while dX's products are computed, dX's reduce-scatter while dA's are
// (overlap = false waits for each at once: the same values).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "zero/group.hpp"

namespace zero::tensor_parallel {

// `x`: this rank's part of the sequence along `sequence_dim`; `weight` [out / T, in]; `bias`
// [out / T] or undefined. Returns this rank's output features for the whole sequence.
at::Tensor sequence_parallel_linear(const at::Tensor& x, const at::Tensor& weight,
                                    const at::Tensor& bias,
                                    const std::shared_ptr<zero::Group>& group,
                                    int64_t sequence_dim);

// Several products of one input (Megatron's fused linear_qkv, linear_fc1): the input gathered
// once forward and once again in backward for all of them, its gradient the sum of theirs
// reduce-scattered once. `biases`: empty, or one per weight (undefined for none).
std::vector<at::Tensor> sequence_parallel_linears(const std::vector<at::Tensor>& weights,
                                                  const std::vector<at::Tensor>& biases,
                                                  const at::Tensor& x,
                                                  const std::shared_ptr<zero::Group>& group,
                                                  int64_t sequence_dim, bool overlap = true);

}  // namespace zero::tensor_parallel
