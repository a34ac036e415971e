// Tensor parallelism in zero-train: the tp x dp layout from tensor_parallel.autotp_size, the
// checks that name the numbers, and which groups the ZeRO engine is given.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "zero/config.hpp"
#include "zero/groups.hpp"
#include "zero/models/gpt_config.hpp"
#include "zero/tensor_parallel/groups.hpp"
#include "zero/tensor_parallel/placement.hpp"

namespace zero::examples {

// Makes the tp x dp groups over `world` (a collective) after checking, before anything is
// allocated, that the layout and the model fit: autotp_size divides the world size; heads,
// kv_heads, ffn and vocab divide by it; seq_len does under sequence parallelism. Throws
// ConfigError prefixed with `source` naming the key and the numbers. Only for autotp_size > 1.
tensor_parallel::Groups tensor_parallel_layout(const Config& cfg, std::shared_ptr<Group> world,
                                               const models::GptConfig& mc, int64_t seq_len,
                                               const std::string& source);

// What the engine is handed under tensor parallelism: zero::engine_groups
// (zero/parallel_dims.hpp) over the layout's mesh.
Groups engine_groups(const tensor_parallel::Groups& groups,
                     const std::vector<tensor_parallel::NamedPlacement>& placements);

}  // namespace zero::examples
