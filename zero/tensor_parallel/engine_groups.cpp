// engine_groups (include/zero/parallel_dims.hpp): a model's placements over a mesh, translated
// once into what the engine is handed. zero-train's tensor-parallel path, the pipeline's stages
// and initialize(model, cfg, mesh) all come here.
#include <torch/nn/module.h>

#include <set>
#include <utility>

#include "zero/parallel_dims.hpp"
#include "zero/tensor_parallel/placement.hpp"
#include "zero/tensor_parallel/sequence_parallel_check.hpp"

namespace zero {

Groups engine_groups(const std::vector<tensor_parallel::NamedPlacement>& placements,
                     const Mesh& mesh) {
  Groups groups{mesh.dp, {}, {}};
  if (mesh.tp && mesh.tp->size() > 1) {
    // Each tensor once, under its first name: a weight two layers tie (an embedding's sharded
    // placement before a head's plain reference to it) is the engine's under that name only.
    std::vector<tensor_parallel::NamedPlacement> params;
    std::set<const void*> seen;
    for (const auto& p : placements)
      if (seen.insert(p.param.unsafeGetTensorImpl()).second) params.push_back(p);
    NormGroup tp_norm{mesh.tp, {}, {}};
    for (const auto& p : params) {
      if (p.placement.sharded) continue;
      // Sequence parallelism: a norm's weight saw this rank's part of the sequence only; the
      // engine sums its gradient over tp once per step, after its dp reduction, in one
      // all-reduce (Megatron's _allreduce_layernorm_grads). Either way it counts once in the
      // norm.
      auto& list = p.placement.grad_needs_all_reduce ? tp_norm.partial : tp_norm.replicated;
      list.push_back(p.name);
    }
    groups.norm.push_back(std::move(tp_norm));
    groups.parts = tensor_parallel::checkpoint_parts(params, *mesh.tp);
  }
  // Nothing is replicated across the stages: each holds its own layers, and a tied weight's
  // copies on later stages are not in their engines.
  if (mesh.pp && mesh.pp->size() > 1) groups.norm.push_back({mesh.pp, {}, {}});
  return groups;
}

Groups engine_groups(const torch::nn::Module& model, const Mesh& mesh) {
  // Before the marks: a model that does not split the sequence would pass them.
  tensor_parallel::check_sequence_parallel(model, mesh.dims.sp);
  return engine_groups(tensor_parallel::placements(model, mesh.dims.sp), mesh);
}

}  // namespace zero
