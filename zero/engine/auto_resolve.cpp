// Applying "auto": the budget (config, or the devices' free memory agreed across ranks), the
// choice (auto_strategy.cpp), and writing it back into the config.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>

#include "comm/group.hpp"
#include "zero/auto_strategy.hpp"
#include "zero/device.hpp"

namespace zero {
namespace {

// The smallest of the ranks' values: every rank must choose the same stage and micro-batch.
int64_t min_over_ranks(int64_t mine, comm::Group& group, c10::Device device) {
  if (group.size() == 1) return mine;
  at::Tensor local = at::tensor(std::vector<int64_t>{mine}, at::kLong).to(device);
  at::Tensor all = at::empty({group.size()}, local.options());
  group.all_gather(all, local, "all_gather of the auto memory budget").wait();
  return all.min().item<int64_t>();
}

}  // namespace

std::optional<AutoChoice> resolve_auto(Config& cfg, AutoTarget& target, Group& public_group) {
  comm::Group& group = comm::of(public_group);
  const int world = group.size();
  ZeroOptimizationConfig& z = cfg.zero_optimization;
  // A micro-batch the batch triple fixes is DeepSpeed's "auto": derived, not planned.
  const bool fixed_by_triple = cfg.train_batch_size > 0 && cfg.gradient_accumulation_steps > 0;
  const bool micro_auto = cfg.micro_batch_auto && !fixed_by_triple && target.shape.known();
  const bool checkpointing_auto = !target.checkpointing.has_value();
  // Stage 3's "auto" keys, from the hidden size as transformers fills them.
  auto& z3 = z.stage3;
  if ((z3.prefetch_bucket_size_auto || z3.param_persistence_threshold_auto) &&
      target.shape.hidden > 0) {
    z3.resolve_auto(target.shape.hidden);
  }
  if (!z.stage_auto && !checkpointing_auto && !micro_auto) return std::nullopt;

  PlanLimits lim;
  const char* from = "zero_optimization.auto_device_memory";
  if (z.auto_device_memory > 0) {
    lim.device_bytes = z.auto_device_memory;
  } else {
    const DeviceMemory m = device_memory(target.device);
    if (!m.available || m.total <= 0) {
      if (!z.stage_auto && !checkpointing_auto) {
        // Only the micro-batch is "auto": without a budget it keeps DeepSpeed's meaning
        // (derived from the other batch keys, 1 by default), as DeepSpeed JSONs expect.
        return std::nullopt;
      }
      throw ConfigError(
          "zero: " + cfg.source + ": " +
          (z.stage_auto ? std::string("zero_optimization.stage") : "activation checkpointing") +
          " is \"auto\" but there is no device memory to read on " + target.device.str() +
          ": set zero_optimization.auto_device_memory (e.g. 16GB; zero-train: --device-memory "
          "16GB) or give the value itself");
    }
    lim.device_bytes = min_over_ranks(m.free + target.held_bytes, group, target.device);
    if (target.tensor_parallel_group) {
      lim.device_bytes =
          min_over_ranks(lim.device_bytes, comm::of(*target.tensor_parallel_group), target.device);
    }
    from = "free device memory";
  }

  // The planner's world is every rank of the layout: T tensor-parallel ranks per data-parallel
  // one (`group` is the data-parallel group).
  const int tp = std::max(1, target.tensor_parallel);
  PlanInput in = plan_input_for(cfg, target.num_params, world * tp);
  in.tensor_parallel = tp;
  in.sequence_parallel = target.sequence_parallel && tp > 1;
  in.shape = target.shape;
  if (target.seq_len > 0) in.seq_len = target.seq_len;
  if (!micro_auto && cfg.train_micro_batch_size_per_gpu == 0) {
    Config derived = cfg;  // what resolve_batch will give
    derived.resolve_batch(world);
    in.micro_batch = derived.train_micro_batch_size_per_gpu;
  }
  AutoRequest req;
  if (!z.stage_auto) req.stage = z.stage;
  if (!micro_auto) req.micro_batch = in.micro_batch;
  req.checkpointing = target.checkpointing;
  req.cpu_offload = target.cpu_offload;
  req.stage3_allowed = !z3.param_persistence_threshold_auto && !z3.prefetch_bucket_size_auto;
  if (micro_auto && cfg.train_batch_size > 0) {
    if (cfg.train_batch_size % world != 0) {
      throw ConfigError("zero: " + cfg.source + ": train_batch_size " +
                        std::to_string(cfg.train_batch_size) + " is not divisible by " +
                        std::to_string(world) + " ranks");
    }
    req.per_rank_batch = cfg.train_batch_size / world;
  }
  AutoChoice c = choose_strategy(in, lim, req);
  c.line += std::string(" [budget: ") + from + "]";

  z.stage = c.stage;
  z.stage_auto = false;
  if (micro_auto) {
    cfg.train_micro_batch_size_per_gpu = c.micro_batch;
    cfg.micro_batch_auto = false;
  }
  target.checkpointing = c.recompute != Recompute::kNone;
  if (group.rank() == 0 && target.announce) {
    std::printf("%s\n", c.line.c_str());
    std::fflush(stdout);
  }
  return c;
}

}  // namespace zero
