// Tensor parallelism in zero-train: the tp x dp layout from tensor_parallel.autotp_size, the
// checks that name the numbers, and which groups the ZeRO engine is given.
#pragma once

#include <memory>
#include <string>

#include "gpt_config.hpp"
#include "zero/config.hpp"
#include "zero/tensor_parallel/groups.hpp"

namespace zero::examples {

// Makes the tp x dp groups over `world` (a collective) after checking, before anything is
// allocated, that the layout and the model fit: autotp_size divides the world size; heads,
// kv_heads, ffn and vocab divide by it; seq_len does under sequence parallelism. Throws
// ConfigError prefixed with `source` naming the key and the numbers. Only for autotp_size > 1.
tensor_parallel::Groups tensor_parallel_layout(const Config& cfg, std::shared_ptr<Group> world,
                                               const GptConfig& mc, int64_t seq_len,
                                               const std::string& source);

// The one place that says what the engine shards and reduces over under tensor parallelism:
// the data-parallel group. That is exact when no gradient needs a tensor-parallel all-reduce and
// no step depends on a norm over the whole model, so `engine_groups` refuses (ConfigError naming
// the key) sequence parallelism (the norms' gradients are partial sums over the tensor-parallel
// ranks), gradient clipping (the engine's norm would count this rank's shards only, each
// tensor-parallel rank would clip by another factor and the replicated norms would drift apart)
// and fp16 (the overflow check likewise). An engine that takes the tensor-parallel group too
// (its replicated parameters and its norm) is given it here, and these refusals go.
std::shared_ptr<Group> engine_groups(const Config& cfg, const tensor_parallel::Groups& groups,
                                     const std::string& source);

}  // namespace zero::examples
