#include "zero/pipeline/engine/stage_groups.hpp"

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "zero/tensor_parallel/placement.hpp"

namespace zero::pipeline {

Groups stage_groups(const torch::nn::Module& stage, const Config& cfg, std::shared_ptr<Group> dp,
                    std::shared_ptr<Group> tp, std::shared_ptr<Group> pp) {
  Groups groups{std::move(dp), {}, {}};
  if (tp && tp->size() > 1) {
    if (cfg.tensor_parallel.sequence_parallel)
      throw std::invalid_argument(
          "tensor_parallel.sequence_parallel with pipeline.stages > 1: the norms' gradients "
          "would be partial sums over the tensor-parallel group, to be all-reduced inside "
          "backward, which the engine does not do yet; set tensor_parallel.sequence_parallel: "
          "false");
    // Each tensor once, under its first name (a weight two layers of the stage tie: the
    // embedding's sharded placement comes before the head's plain reference to it).
    std::vector<tensor_parallel::NamedPlacement> params;
    std::set<const void*> seen;
    for (auto& p : tensor_parallel::placements(stage, /*sequence_parallel=*/false))
      if (seen.insert(p.param.unsafeGetTensorImpl()).second) params.push_back(std::move(p));
    NormGroup tp_norm{tp, {}};
    for (const auto& p : params)
      if (!p.placement.sharded) tp_norm.replicated.push_back(p.name);
    groups.norm.push_back(std::move(tp_norm));
    groups.parts = tensor_parallel::checkpoint_parts(params, *tp);
  }
  // Nothing is replicated across the stages: each holds its own layers, and a tied weight's
  // copies on later stages are not in their engines (StageLayers::module()).
  if (pp && pp->size() > 1) groups.norm.push_back({std::move(pp), {}});
  return groups;
}

}  // namespace zero::pipeline
