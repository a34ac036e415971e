// A mesh of process groups: the world split once per named dimension (comm/mesh_layout.hpp says
// which ranks share a group), so tensor, data and pipeline parallelism each get their group.
//
//   auto world = comm::Group::from_env(opts);
//   comm::Mesh mesh = comm::Mesh::megatron(world, /*tp=*/2, /*pp=*/2);  // dp: the rest
//   mesh.group("tp")->all_reduce_sum(partial, "row-parallel output").wait();
//   mesh.group("dp");  // the data-parallel group an engine shards over
//
// Making a mesh is a collective over the world group: every rank builds the same layout.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "comm/group.hpp"
#include "comm/mesh_layout.hpp"

namespace zero::comm {

class Mesh {
 public:
  // layout.world() must be world->size(). Splits `world` once per dimension, in dims() order;
  // each group is named after its dimension ("tp").
  Mesh(std::shared_ptr<Group> world, MeshLayout layout);
  // Megatron's pp x dp x tp over `world` (dp = 0: world size / (tp * pp)); the error for sizes
  // that do not divide the world size names the numbers.
  static Mesh megatron(std::shared_ptr<Group> world, int tp, int pp, int dp = 0);

  const MeshLayout& layout() const { return layout_; }
  const std::shared_ptr<Group>& world() const { return world_; }
  // This rank's group along `dim`; throws naming the dimensions there are.
  const std::shared_ptr<Group>& group(const std::string& dim) const;
  const std::shared_ptr<Group>& operator[](const std::string& dim) const { return group(dim); }
  // This rank's coordinate along `dim` (its rank in group(dim)).
  int coord(const std::string& dim) const { return layout_.coord(world_->rank(), dim); }

 private:
  std::shared_ptr<Group> world_;
  MeshLayout layout_;
  std::map<std::string, std::shared_ptr<Group>> groups_;
};

}  // namespace zero::comm
