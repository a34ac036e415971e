#include "zero/pipeline/engine/stage_groups.hpp"

#include "zero/parallel_dims.hpp"

namespace zero::pipeline {

Groups stage_groups(const torch::nn::Module& stage, const Config& cfg, std::shared_ptr<Group> dp,
                    std::shared_ptr<Group> tp, std::shared_ptr<Group> pp) {
  const bool tensor_parallel = tp && tp->size() > 1;
  // The stage's groups as a mesh (a tp or pp left null: none); the translation is the engine's
  // (engine_groups), the same as a whole model's.
  Mesh mesh;
  mesh.dims.dp = dp ? dp->size() : 1;
  mesh.dims.tp = tensor_parallel ? tp->size() : 1;
  mesh.dims.pp = pp ? pp->size() : 1;
  // Sequence parallelism: the stage's norms (and row-parallel biases) saw this rank's part of
  // the sequence only; the engine sums their gradients over tp once per step, after its dp
  // reduction (Megatron's finalize_model_grads: _allreduce_layernorm_grads before the step).
  mesh.dims.sp = tensor_parallel && cfg.tensor_parallel.sequence_parallel;
  mesh.dp = std::move(dp);
  mesh.tp = std::move(tp);
  mesh.pp = std::move(pp);
  return engine_groups(stage, mesh);
}

}  // namespace zero::pipeline
