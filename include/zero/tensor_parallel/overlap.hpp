// Switches the backward overlap (ColumnParallelLinearOptions::overlap_comm) of every
// column-parallel layer in a model: what zero-train does with tensor_parallel.overlap_comm
// (zero/comm_overlap.hpp). The values are the same either way.
#pragma once

#include <torch/nn/module.h>

namespace zero::tensor_parallel {

// Returns how many layers it set. Call it before a step, on every rank alike (the fused q/k/v
// products require their layers to agree).
int set_overlap_comm(torch::nn::Module& model, bool on);

}  // namespace zero::tensor_parallel
