// Tensor parallelism in zero-train: the tp x dp layout from tensor_parallel.autotp_size, the
// checks that name the numbers, and which groups the ZeRO engine is given.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gpt_config.hpp"
#include "zero/config.hpp"
#include "zero/groups.hpp"
#include "zero/tensor_parallel/groups.hpp"
#include "zero/tensor_parallel/placement.hpp"

namespace zero::examples {

// Makes the tp x dp groups over `world` (a collective) after checking, before anything is
// allocated, that the layout and the model fit: autotp_size divides the world size; heads,
// kv_heads, ffn and vocab divide by it; seq_len does under sequence parallelism. Throws
// ConfigError prefixed with `source` naming the key and the numbers. Only for autotp_size > 1.
tensor_parallel::Groups tensor_parallel_layout(const Config& cfg, std::shared_ptr<Group> world,
                                               const GptConfig& mc, int64_t seq_len,
                                               const std::string& source);

// The one place that says what the engine is handed under tensor parallelism: it shards and
// reduces over the data-parallel group, and its gradient norm (clipping, the progress line's
// grad_norm, fp16's overflow verdict) sums over dp and then over the tensor-parallel group, with
// the parameters that are not split (the norms) counted once. Under sequence parallelism those
// parameters' gradients are partial sums over the tensor-parallel ranks: the engine sums them
// over tp once per step, after its dp reduction, in one all-reduce (Groups::norm's `partial`).
Groups engine_groups(const tensor_parallel::Groups& groups,
                     const std::vector<tensor_parallel::NamedPlacement>& placements);

}  // namespace zero::examples
