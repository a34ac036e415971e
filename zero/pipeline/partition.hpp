// Which layers each pipeline stage holds: DeepSpeed's PipelineModule partition methods.
//   "uniform":    the same number of layers per stage (the first stages take one more when the
//                 count does not divide), ds_utils.partition_uniform.
//   "parameters": contiguous runs of layers whose largest parameter count is as small as it can
//                 be, ds_utils.partition_balanced over each layer's parameter count.
//   "compute":    the same over each layer's training FLOPs per token (include/zero/
//                 pipeline_flops.hpp; Layer::flops_per_token), so that the embedding (many
//                 parameters, a lookup) and the head with the loss weigh what they cost.
// Pure arithmetic, torch-free: the runtime and the planner use the same bounds.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace zero::pipeline {

enum class PartitionMethod { Uniform, Parameters, Compute };

std::string_view partition_method_name(PartitionMethod m);
// "uniform", "parameters" or "compute"; std::invalid_argument naming pipeline.partition and the
// choices.
PartitionMethod parse_partition_method(std::string_view name);

// bounds[s] .. bounds[s + 1] are stage s's layers; bounds.size() == parts + 1, bounds[0] == 0,
// bounds[parts] == items. Throws std::invalid_argument when parts < 1, or when there are fewer
// items than parts (a stage would hold no layer: DeepSpeed allows it, the runtime does not).
std::vector<int> partition_uniform(int items, int parts);
std::vector<int> partition_balanced(const std::vector<int64_t>& weights, int parts);

// The bounds `method` gives for layers of these weights: their parameter counts for Parameters,
// their FLOPs per token for Compute (both cut by partition_balanced), unused but for their number
// by Uniform. A pure function of its arguments: every rank computes the same bounds.
std::vector<int> partition_layers(PartitionMethod method, const std::vector<int64_t>& weights,
                                  int parts);

}  // namespace zero::pipeline
