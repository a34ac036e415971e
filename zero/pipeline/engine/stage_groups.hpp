// The groups a pipeline stage's engine is handed: it shards and averages over the stage's
// data-parallel group; its gradient norm sums over dp, then over the tensor-parallel group (the
// parameters every tensor-parallel rank holds whole, a norm's weight, counted on its rank 0
// only: Megatron's param_is_not_tensor_parallel_duplicate), then over the pipeline group (each
// stage holds its own layers; a tied weight is its owner's alone). Under tensor parallelism its
// checkpoints record each rank's block of the split weights, as the plain engine's do. Under
// sequence parallelism (tensor_parallel.sequence_parallel with tp > 1) the parameters the stage's
// modules mark kPartial (tensor_parallel::SequenceParallelModule: a norm's weight, a
// row-parallel bias) hold partial gradients: the engine sums them over tp before the step.
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "zero/config.hpp"
#include "zero/groups.hpp"

namespace zero::pipeline {

// `stage`: the stage's module as the engine wraps it (StageLayers::module()). `tp` may be null
// or of size 1 (no tensor parallelism). Throws std::invalid_argument (tensor_parallel::
// placements) naming every replicated parameter no module marks, under sequence parallelism.
Groups stage_groups(const torch::nn::Module& stage, const Config& cfg, std::shared_ptr<Group> dp,
                    std::shared_ptr<Group> tp, std::shared_ptr<Group> pp);

}  // namespace zero::pipeline
