#include "comm/mesh_layout.hpp"

#include <stdexcept>

namespace zero::comm {

MeshLayout::MeshLayout(int world, std::vector<MeshDim> dims)
    : world_(world), dims_(std::move(dims)) {
  if (world < 1) {
    throw std::invalid_argument("zero: a mesh needs at least one rank, got world size " +
                                std::to_string(world));
  }
  if (dims_.empty()) throw std::invalid_argument("zero: a mesh needs at least one dimension");
  long long product = 1;
  for (size_t i = 0; i < dims_.size(); ++i) {
    const MeshDim& d = dims_[i];
    if (d.name.empty())
      throw std::invalid_argument("zero: mesh dimension " + std::to_string(i) + " has no name");
    for (size_t j = 0; j < i; ++j) {
      if (dims_[j].name == d.name) {
        throw std::invalid_argument("zero: mesh dimension \"" + d.name + "\" appears twice");
      }
    }
    if (d.size < 1) {
      throw std::invalid_argument("zero: mesh dimension \"" + d.name + "\" has size " +
                                  std::to_string(d.size) + "; sizes are 1 or more");
    }
    product *= d.size;
  }
  if (product != world) {
    throw std::invalid_argument("zero: the mesh " + describe() + " has " + std::to_string(product) +
                                " ranks, but the world has " + std::to_string(world) +
                                ": the sizes must multiply to the world size");
  }
  strides_.assign(dims_.size(), 1);
  for (int i = static_cast<int>(dims_.size()) - 2; i >= 0; --i) {
    strides_[i] = strides_[i + 1] * dims_[i + 1].size;
  }
}

MeshLayout MeshLayout::megatron(int world, int tp, int pp, int dp) {
  if (tp < 1 || pp < 1 || dp < 0) {
    throw std::invalid_argument("zero: parallel sizes must be 1 or more (dp 0: the rest), got tp " +
                                std::to_string(tp) + ", pp " + std::to_string(pp) + ", dp " +
                                std::to_string(dp));
  }
  const long long model = static_cast<long long>(tp) * pp;
  if (dp == 0) {
    if (world % model != 0) {
      throw std::invalid_argument(
          "zero: world size " + std::to_string(world) + " is not divisible by tensor-parallel " +
          "size " + std::to_string(tp) + " x pipeline-parallel size " + std::to_string(pp) + " = " +
          std::to_string(model) + ": launch a multiple of " + std::to_string(model) +
          " ranks, or choose tp and pp whose product divides " + std::to_string(world));
    }
    dp = static_cast<int>(world / model);
  } else if (model * dp != world) {
    throw std::invalid_argument("zero: tensor-parallel size " + std::to_string(tp) +
                                " x data-parallel size " + std::to_string(dp) +
                                " x pipeline-parallel size " + std::to_string(pp) + " = " +
                                std::to_string(model * dp) + " ranks, but the world size is " +
                                std::to_string(world) + ": the product must equal it");
  }
  return MeshLayout(world, {{"pp", pp}, {"dp", dp}, {"tp", tp}});
}

int MeshLayout::index(const std::string& dim) const {
  std::string names;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == dim) return static_cast<int>(i);
    names += (i ? ", " : "") + dims_[i].name;
  }
  throw std::invalid_argument("zero: the mesh has no dimension \"" + dim + "\" (it has " + names +
                              ")");
}

void MeshLayout::check_rank(int rank) const {
  if (rank < 0 || rank >= world_) {
    throw std::invalid_argument("zero: rank " + std::to_string(rank) + " is not in [0, " +
                                std::to_string(world_) + ")");
  }
}

bool MeshLayout::has(const std::string& dim) const {
  for (const auto& d : dims_) {
    if (d.name == dim) return true;
  }
  return false;
}

int MeshLayout::size(const std::string& dim) const { return dims_[index(dim)].size; }

std::vector<int> MeshLayout::coords(int rank) const {
  check_rank(rank);
  std::vector<int> c(dims_.size());
  for (size_t i = 0; i < dims_.size(); ++i) c[i] = rank / strides_[i] % dims_[i].size;
  return c;
}

int MeshLayout::rank_of(const std::vector<int>& coords) const {
  if (coords.size() != dims_.size()) {
    throw std::invalid_argument("zero: " + std::to_string(coords.size()) +
                                " coordinates for the mesh " + describe());
  }
  int rank = 0;
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (coords[i] < 0 || coords[i] >= dims_[i].size) {
      throw std::invalid_argument("zero: coordinate " + std::to_string(coords[i]) + " along " +
                                  dims_[i].name + " is not in [0, " +
                                  std::to_string(dims_[i].size) + ")");
    }
    rank += coords[i] * strides_[i];
  }
  return rank;
}

int MeshLayout::coord(int rank, const std::string& dim) const { return coords(rank)[index(dim)]; }

std::vector<int> MeshLayout::group_of(int rank, const std::string& dim) const {
  const int i = index(dim);
  std::vector<int> c = coords(rank);
  std::vector<int> ranks;
  for (int k = 0; k < dims_[i].size; ++k) {
    c[i] = k;
    ranks.push_back(rank_of(c));
  }
  return ranks;
}

std::vector<std::vector<int>> MeshLayout::groups(const std::string& dim) const {
  const int i = index(dim);
  std::vector<std::vector<int>> out;
  // A rank with coordinate 0 along `dim` starts a group; ascending ranks give ascending starts.
  for (int r = 0; r < world_; ++r) {
    if (coords(r)[i] == 0) out.push_back(group_of(r, dim));
  }
  return out;
}

std::string MeshLayout::describe() const {
  std::string s;
  for (size_t i = 0; i < dims_.size(); ++i) {
    s += (i ? " x " : "") + dims_[i].name + " " + std::to_string(dims_[i].size);
  }
  return s;
}

}  // namespace zero::comm
