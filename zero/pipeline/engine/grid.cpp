// make_pipeline_grid (include/zero/pipeline_engine.hpp): a view of ParallelDims's mesh.
#include <stdexcept>

#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {

PipelineGrid make_pipeline_grid(std::shared_ptr<Group> world, int stages, int tp) {
  if (!world) throw std::invalid_argument("pipeline: no world group");
  if (tp < 1)
    throw std::invalid_argument("tensor_parallel.autotp_size = " + std::to_string(tp) +
                                " must be >= 1");
  if (stages < 1 || world->size() % (static_cast<int64_t>(stages) * tp) != 0)
    throw std::invalid_argument(
        "pipeline.stages = " + std::to_string(stages) +
        (tp > 1 ? " x tensor_parallel.autotp_size = " + std::to_string(tp) : "") +
        " does not divide the world size " + std::to_string(world->size()) +
        "; launch a multiple of " + std::to_string(static_cast<int64_t>(stages) * tp) +
        " processes");
  return PipelineGrid::of(ParallelDims{0, tp, stages, false}.build_mesh(std::move(world)));
}

PipelineGrid PipelineGrid::of(const Mesh& mesh) {
  return {mesh.pp, mesh.dp, mesh.tp, mesh.pp_rank(), mesh.dp_rank(), mesh.tp_rank()};
}

std::string PipelineGrid::describe() const {
  return "pp " + std::to_string(pp->size()) + " x dp " + std::to_string(dp->size()) + " x tp " +
         std::to_string(tp ? tp->size() : 1);
}

}  // namespace zero::pipeline
