// From the config's optimizer/scheduler sections to optim/ objects over this rank's shard.
#pragma once

#include <ATen/core/TensorBody.h>

#include <memory>

#include "optim/lr_schedule.hpp"
#include "optim/shard_optimizer.hpp"
#include "zero/config.hpp"
#include "zero/params/shard_info.hpp"

namespace zero {

struct OptimizerBundle {
  std::unique_ptr<optim::ShardOptimizer> optimizer;
  std::unique_ptr<optim::LrSchedule> schedule;
  // The step unscales and clips as DeepSpeed's unscale_and_clip_grads does (its norm, its
  // coefficient, a separate multiply), for the op-by-op AdamW that torch_adam selects.
  bool deepspeed_clip = false;
};

// `owner`: whose shard of `layout` the optimizer updates. Weight decay skips parameters whose
// name contains one of cfg.no_weight_decay; cfg.optimizer.param_groups set the lr scale and
// weight decay of the parameters they match (a ConfigError when a parameter matches two
// groups or a group matches none, on every rank alike).

OptimizerBundle make_optimizer(const Config& cfg, const FlatLayout& layout, int owner,
                               const at::TensorOptions& opts);

// The fp32 state tensors of a shard's size the optimizer keeps (AdamW 2, SGD with momentum 1,
// else 0), known before it is made: what the error-feedback host-memory check counts under
// optimizer offload. Unknown types are make_optimizer's to refuse: 0.
int optimizer_state_count(const Config& cfg);

// Per parameter of `layout`, the index of its optimizer.param_groups entry, -1 for none.
std::vector<int> param_group_of(const Config& cfg, const FlatLayout& layout);

}  // namespace zero
