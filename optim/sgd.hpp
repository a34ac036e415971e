// SGD (momentum, dampening, Nesterov, coupled weight decay) over a flat fp32 shard: the update
// of torch::optim::SGD in one fused pass.
#pragma once

#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "optim/shard_optimizer.hpp"

namespace zero::optim {

struct SgdOptions {
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;  // L2, added to the gradient inside the decay ranges only
  bool nesterov = false;    // needs momentum > 0 and dampening == 0
};

// State: "momentum_buffer" (numel fp32) when momentum != 0, none otherwise; no scratch.
std::unique_ptr<ShardOptimizer> make_sgd(const SgdOptions& options, int64_t numel,
                                         std::vector<Range> decay_ranges,
                                         const at::TensorOptions& opts);
// The same over parameter groups (lr scale, weight decay), which must cover [0, numel).
std::unique_ptr<ShardOptimizer> make_grouped_sgd(const SgdOptions& options, int64_t numel,
                                                 std::vector<ParamGroup> groups,
                                                 const at::TensorOptions& opts);

}  // namespace zero::optim
