// make_pipeline_grid (include/zero/pipeline_engine.hpp): comm::Mesh's Megatron order, which the
// public API does not expose.
#include <stdexcept>

#include "comm/mesh.hpp"
#include "zero/pipeline_engine.hpp"

namespace zero::pipeline {

PipelineGrid make_pipeline_grid(std::shared_ptr<Group> world, int stages) {
  if (!world) throw std::invalid_argument("pipeline: no world group");
  if (stages < 1 || world->size() % stages != 0)
    throw std::invalid_argument("pipeline.stages = " + std::to_string(stages) +
                                " does not divide the world size " + std::to_string(world->size()) +
                                "; launch a multiple of pipeline.stages processes");
  comm::Mesh mesh = comm::Mesh::megatron(comm::of(world), /*tp=*/1, stages);
  return {mesh["pp"], mesh["dp"], mesh.coord("pp"), mesh.coord("dp")};
}

std::string PipelineGrid::describe() const {
  return "pp " + std::to_string(pp->size()) + " x dp " + std::to_string(dp->size()) + " x tp 1";
}

}  // namespace zero::pipeline
