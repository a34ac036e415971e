#include "zero/tensor_parallel/groups.hpp"

#include <stdexcept>

#include "comm/mesh.hpp"

namespace zero::tensor_parallel {

std::string Groups::describe() const {
  return "tp " + std::to_string(tp->size()) + " x dp " + std::to_string(dp->size());
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
  // Megatron's order pp, dp, tp (comm/mesh_layout.hpp): tp varies fastest.
  comm::Mesh mesh = comm::Mesh::megatron(comm::of(world), tp, /*pp=*/1);
  Groups g;
  g.world = std::move(world);
  g.tp = mesh.group("tp");
  g.dp = mesh.group("dp");
  return g;
}

}  // namespace zero::tensor_parallel
