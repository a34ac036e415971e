#include "zero/tensor_parallel/groups.hpp"

#include <stdexcept>

#include "zero/parallel_dims.hpp"

namespace zero::tensor_parallel {

std::string Groups::describe() const {
  return "tp " + std::to_string(tp->size()) + " x dp " + std::to_string(dp->size());
}

Groups Groups::of(const Mesh& mesh) { return Groups{mesh.world, mesh.tp, mesh.dp, mesh.pp}; }

Mesh Groups::mesh(bool sequence_parallel) const {
  Mesh m;
  m.dims = ParallelDims{dp->size(), tp->size(), 1, sequence_parallel};
  m.world = world;
  m.dp = dp;
  m.tp = tp;
  m.pp = pp;  // make_groups's group of one; null in a Groups a program put together (no pipeline)
  return m;
}

Groups make_groups(std::shared_ptr<zero::Group> world, int tp) {
  if (!world) throw std::invalid_argument("zero: tensor_parallel::make_groups needs a world group");
  const int size = world->size();
  if (tp < 1 || size % tp != 0) {
    throw std::invalid_argument(
        "zero: tensor_parallel.autotp_size = " + std::to_string(tp) +
        " does not divide the world size " + std::to_string(size) +
        " (world size = tensor-parallel size x data-parallel size); choose a tensor-parallel "
        "size that divides " +
        std::to_string(size) + " or launch a multiple of " + std::to_string(tp) + " ranks");
  }
  return Groups::of(ParallelDims{0, tp, 1, false}.build_mesh(std::move(world)));
}

}  // namespace zero::tensor_parallel
