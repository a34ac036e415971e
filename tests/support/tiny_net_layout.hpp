// The flat layout the engine builds for the tiny net, rebuilt independently of the engine so
// tests can predict bucket and shard sizes.
#pragma once

#include <cstdint>

#include "zero/params/shard_info.hpp"

namespace zero::testing {

// Trainable parameters in reverse registration order, 64-element alignment, as initialize().
FlatLayout tiny_net_layout(int shards, int64_t bucket);

}  // namespace zero::testing
