// AdamW over a flat fp32 shard: torch::optim::AdamW's update, in one fused pass.
#pragma once

#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "optim/shard_optimizer.hpp"

namespace zero::optim {

struct AdamWOptions {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // decoupled; applied only inside the decay ranges
  // torch.optim.AdamW's op-by-op arithmetic (DeepSpeed's `torch_adam: true`), bit for bit
  // torch's, in ~9 passes (adamw_op_by_op.cpp); otherwise ATen's fused kernel in one pass, which
  // rounds differently by an ulp here and there.
  bool op_by_op = false;
};

// State: "exp_avg" and "exp_avg_sq" (numel fp32 each); no scratch. `opts`: fp32 on the shard's
// device.
std::unique_ptr<ShardOptimizer> make_adamw(const AdamWOptions& options, int64_t numel,
                                           std::vector<Range> decay_ranges,
                                           const at::TensorOptions& opts);
// The same over parameter groups (lr scale, weight decay), which must cover [0, numel).
std::unique_ptr<ShardOptimizer> make_grouped_adamw(const AdamWOptions& options, int64_t numel,
                                                   std::vector<ParamGroup> groups,
                                                   const at::TensorOptions& opts);

namespace detail {
// make_grouped_adamw's choice for options.op_by_op, unchecked.
std::unique_ptr<ShardOptimizer> make_op_by_op_adamw(const AdamWOptions& options, int64_t numel,
                                                    std::vector<ParamGroup> groups,
                                                    const at::TensorOptions& opts);
}  // namespace detail

}  // namespace zero::optim
