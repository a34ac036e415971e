// "auto" for the ZeRO stage, the micro-batch and activation checkpointing: the memory planner
// (memory_plan.hpp) picks the cheapest setting that fits a per-rank memory budget, by its own
// rule (least recompute, then the largest micro-batch, then the lowest stage). Stage 3 is the
// last resort: "auto" picks it only when no setting at stages 0-2 fits (its model states plus
// its gathered units, memory_plan.hpp's stage3_transient_bytes), as DeepSpeed users reach for
// ZeRO-3 when ZeRO-2 runs out of memory. A value the user gave is kept; only the "auto" ones
// are chosen.
//
// The budget is zero_optimization.auto_device_memory when set, else the device's free memory
// (CUDA) plus what the model already holds there; every rank plans for the smallest budget of
// all ranks, so all pick the same. On CPU there is no free memory to read: "auto" without a
// budget is an error naming the key.
//
// Optimizer offload is never chosen here (the user turns it on: zero-memory says when only it
// fits); when it is on, the budget counts only what stays on the device and stage 0 is out (the
// config refuses a stage "auto" with offload; an application may call this with one).
// Parameter offload is not in this engine. Activation
// offload (activation_checkpointing.cpu_checkpointing) is, when the user enabled it, the form
// checkpointing takes.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "zero/config.hpp"
#include "zero/group.hpp"
#include "zero/memory_plan.hpp"

namespace zero {

// What is fixed and what is "auto" (nullopt).
struct AutoRequest {
  std::optional<int> stage;
  std::optional<int64_t> micro_batch;
  std::optional<bool> checkpointing;
  bool cpu_offload = false;    // checkpointing keeps its inputs in host memory
  int64_t per_rank_batch = 0;  // train_batch_size / N when fixed: the micro-batch must divide it
  // Whether "auto" may pick stage 3 when nothing at stages 0-2 fits (false while a stage-3 key
  // the engine needs, such as a persistence threshold "auto", is still unresolved).
  bool stage3_allowed = true;
};

struct AutoChoice {
  int stage = 0;
  int64_t micro_batch = 1;
  Recompute recompute = Recompute::kNone;
  int64_t bytes = 0;  // predicted per-rank peak
  std::string line;   // "zero: auto: stage 1, ... : why"
};

// Torch-free: the choice for a model (in.shape and in.num_params; in.micro_batch is ignored
// when the micro-batch is "auto") under `lim`. Throws ConfigError when nothing fits, with the
// planner's reasons.
AutoChoice choose_strategy(const PlanInput& in, const PlanLimits& lim, const AutoRequest& req);

// The planner's input for a config: dtypes, optimizer states and buckets as the engine will
// use them, for `world_size` ranks.
PlanInput plan_input_for(const Config& cfg, int64_t num_params, int world_size);

// What an application knows about its model, for resolve_auto.
struct AutoTarget {
  ModelShape shape;        // unknown (layers = 0): activations are not counted, micro-batch stays
  int64_t num_params = 0;  // the whole model's, also under tensor parallelism
  // Megatron-style tensor parallelism over `tensor_parallel` ranks (the group resolve_auto is
  // given is then the data-parallel one): each rank plans for its shard of the parameters and
  // its share of the activations (parallel_plan.hpp; sequence parallelism splits the rest).
  int tensor_parallel = 1;
  // Its group: the budget from the devices is then the smallest over it too (after the
  // data-parallel group's), so every rank of the layout plans with one budget and the
  // tensor-parallel ranks of one model choose the same micro-batch, stage and checkpointing.
  std::shared_ptr<Group> tensor_parallel_group;
  bool sequence_parallel = false;
  // Print the choice on rank 0 of the group; false on the ranks whose data-parallel group is not
  // the first (under tensor parallelism every tensor-parallel rank has its own, and each would
  // print the same line).
  bool announce = true;
  int64_t seq_len = 0;
  std::optional<bool> checkpointing = false;  // nullopt: "auto"
  bool cpu_offload = false;
  c10::Device device = c10::Device(c10::kCPU);
  int64_t held_bytes = 0;  // already on the device (the model's parameters): counted by the plan
};

// Resolves the "auto" values of `cfg` and `target.checkpointing` and prints the one-line
// reason on rank 0. Collective when the budget comes from the devices. Returns nothing when no
// value is "auto". Throws ConfigError (no budget on CPU, nothing fits).
std::optional<AutoChoice> resolve_auto(Config& cfg, AutoTarget& target, Group& group);

}  // namespace zero
