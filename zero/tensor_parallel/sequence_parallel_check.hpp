// The run's tensor_parallel.sequence_parallel against how the model's tensor-parallel layers were
// built. The engine's marks (SequenceParallelModule, placement.hpp) say which replicated
// parameters would hold partial gradients under sequence parallelism, not whether the layers
// actually split the sequence: a model built without it under a config that says it (or the
// reverse) would pass them and train wrong (norm gradients summed over tp though whole, or left
// partial) or fail deep in step 1. Checked where the engine takes a model (engine_groups).
#pragma once

#include <torch/nn/module.h>

namespace zero::tensor_parallel {

// Throws std::invalid_argument naming tensor_parallel.sequence_parallel, the layers and the fix
// where a column-, row-parallel linear or vocabulary-parallel embedding of `model` split over
// more than one rank was built with another sequence_parallel than `sequence_parallel`. The same
// on every rank holding the same layers: no communication.
void check_sequence_parallel(const torch::nn::Module& model, bool sequence_parallel);

}  // namespace zero::tensor_parallel
