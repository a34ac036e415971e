#include "zero/pipeline/engine/stage_groups.hpp"

#include <stdexcept>
#include <string>

#include "zero/parallel_dims.hpp"

namespace zero::pipeline {

Groups stage_groups(const torch::nn::Module& stage, const Config& cfg, std::shared_ptr<Group> dp,
                    std::shared_ptr<Group> tp, std::shared_ptr<Group> pp) {
  const bool tensor_parallel = tp && tp->size() > 1;
  if (tensor_parallel && cfg.tensor_parallel.sequence_parallel)
    throw std::invalid_argument(
        "tensor_parallel.sequence_parallel with pipeline.stages > 1: the norms' gradients "
        "would be partial sums over the tensor-parallel group, to be all-reduced inside "
        "backward, which the engine does not do yet; set tensor_parallel.sequence_parallel: "
        "false");
  // The stage's groups as a mesh (a tp or pp left null: none); the translation is the engine's
  // (engine_groups), the same as a whole model's.
  Mesh mesh;
  mesh.dims.dp = dp ? dp->size() : 1;
  mesh.dims.tp = tensor_parallel ? tp->size() : 1;
  mesh.dims.pp = pp ? pp->size() : 1;
  mesh.dp = std::move(dp);
  mesh.tp = std::move(tp);
  mesh.pp = std::move(pp);
  return engine_groups(stage, mesh);
}

}  // namespace zero::pipeline
