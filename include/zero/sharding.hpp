// ZeRO-3's units as the model sees them: which modules are gathered and released as one, and
// the call that runs a unit (design docs/design/sharded-units.md §3.1).
//
// LibTorch has no module hooks, so a unit is run the way a checkpointed block is: the model's
// forward calls `run_unit(module, fn, inputs)` where it would call `fn(inputs)`. At stage 3, for
// a module marked with `shard`, the unit's parameters are all-gathered before `fn`, released
// after it, and all-gathered again when backward reaches the unit's outputs; nothing is
// recomputed (autograd's saved tensors see the re-gathered bytes). Everywhere else - stages 0-2,
// no engine over the model, an unmarked module - `run_unit` is exactly `fn(inputs)`.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

#include "zero/activation_checkpointing.hpp"

namespace torch::nn {
class Module;
}

namespace zero {

// Makes `module` a unit of its own at stage 3 (FSDP2's fully_shard, one module at a time): its
// parameters are gathered together, and released together. Call it before zero::initialize;
// marks made later take effect at the next initialize. A parameter that no marked module owns,
// that two units share, or that is small (stage3_param_persistence_threshold) stays in the
// root unit, gathered all the time. Nested marks: a parameter belongs to its innermost marked
// module. The mark lives as long as the module; it changes nothing below stage 3.
void shard(torch::nn::Module& module);
bool is_sharded(const torch::nn::Module& module);

// `fn(inputs)` as `module`'s forward. `fn` must return every tensor the rest of the model uses
// (as a zero::checkpoint block must), since backward re-gathers the unit when gradients reach
// those outputs; a marked module called outside run_unit at stage 3 fails in its first op
// (its parameters are empty between uses). Composes with zero::checkpoint either way round.
std::vector<at::Tensor> run_unit(torch::nn::Module& module, const Block& fn,
                                 const std::vector<at::Tensor>& inputs);
at::Tensor run_unit(torch::nn::Module& module,
                    const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x);

}  // namespace zero
