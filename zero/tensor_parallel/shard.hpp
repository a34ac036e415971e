// Which slice of a full tensor a tensor-parallel rank holds: contiguous equal parts along one
// dimension, rank r the r-th, as Megatron splits its weights. Unequal parts are refused with the
// numbers, since every rank's shard must have the same shape for the collectives.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace zero::tensor_parallel {

// `total` / `parts`; throws std::invalid_argument naming `what` (e.g. "ColumnParallelLinear
// out_features"), both numbers and the fix when it does not divide.
int64_t divide(int64_t total, int64_t parts, const std::string& what);

// Rank `rank`'s part of `full` along `dim` (a view; `dim` must divide by `parts`).
at::Tensor shard_of(const at::Tensor& full, int64_t dim, int rank, int parts,
                    const std::string& what);

}  // namespace zero::tensor_parallel
