#include "comm/mesh.hpp"

#include <c10/util/Exception.h>

namespace zero::comm {

Mesh::Mesh(std::shared_ptr<Group> world, MeshLayout layout)
    : world_(std::move(world)), layout_(std::move(layout)) {
  TORCH_CHECK(world_, "zero: a mesh needs a world group");
  TORCH_CHECK(layout_.world() == world_->size(), "zero: the mesh ", layout_.describe(), " has ",
              layout_.world(), " ranks but group ", world_->name(), " has ", world_->size());
  const int me = world_->rank();
  for (const MeshDim& d : layout_.dims()) {
    // color: the group's first rank (unique per group); key: the coordinate along d, so the
    // group's rank i has coordinate i.
    const std::vector<int> members = layout_.group_of(me, d.name);
    groups_[d.name] = world_->split(members.front(), layout_.coord(me, d.name), d.name);
  }
}

Mesh Mesh::megatron(std::shared_ptr<Group> world, int tp, int pp, int dp) {
  TORCH_CHECK(world, "zero: a mesh needs a world group");
  const int size = world->size();
  return Mesh(std::move(world), MeshLayout::megatron(size, tp, pp, dp));
}

const std::shared_ptr<Group>& Mesh::group(const std::string& dim) const {
  auto it = groups_.find(dim);
  if (it == groups_.end()) {
    layout_.size(dim);  // throws naming the dimensions there are
    TORCH_CHECK(false, "zero: the mesh ", layout_.describe(), " made no group ", dim);
  }
  return it->second;
}

}  // namespace zero::comm
