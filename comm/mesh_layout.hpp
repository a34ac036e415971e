// Where each rank sits in a mesh of named parallel dimensions: pure rank arithmetic, no torch,
// no communication (comm/mesh.hpp makes the process groups from it).
//
// Dimensions are listed outermost first; the last one varies fastest between consecutive ranks.
// Megatron-LM's order (parallel_state.initialize_model_parallel, order "tp-cp-ep-dp-pp" with
// cp = ep = 1) is pp, dp, tp: tensor parallelism innermost, so a tensor-parallel group is
// consecutive ranks (one node's GPUs, the fastest links), then data, then pipeline:
//
//   rank = tp_rank + dp_rank * tp + pp_rank * tp * dp
//
// For 8 ranks = pp 2 x dp 2 x tp 2: tp groups {0,1} {2,3} {4,5} {6,7}; dp groups {0,2} {1,3}
// {4,6} {5,7}; pp groups {0,4} {1,5} {2,6} {3,7}.
#pragma once

#include <string>
#include <vector>

namespace zero::comm {

struct MeshDim {
  std::string name;
  int size = 1;
};

class MeshLayout {
 public:
  // `dims` outermost first; their sizes must multiply to `world`. Throws std::invalid_argument
  // naming the sizes otherwise, or for an empty or repeated name or a size below 1.
  MeshLayout(int world, std::vector<MeshDim> dims);
  // Megatron's layout "pp", "dp", "tp". dp = 0: whatever tp and pp leave (world / (tp * pp)),
  // which must be whole: the error names world, tp and pp.
  static MeshLayout megatron(int world, int tp, int pp, int dp = 0);

  int world() const { return world_; }
  const std::vector<MeshDim>& dims() const { return dims_; }
  bool has(const std::string& dim) const;
  int size(const std::string& dim) const;

  // Coordinates of `rank`, one per dimension in dims() order, and back.
  std::vector<int> coords(int rank) const;
  int rank_of(const std::vector<int>& coords) const;
  int coord(int rank, const std::string& dim) const;

  // The ranks that share every coordinate with `rank` but the one along `dim`, ordered by that
  // one: the group of `rank` along `dim` (position i holds coordinate i).
  std::vector<int> group_of(int rank, const std::string& dim) const;
  // Every group along `dim`, ordered by their first rank (Megatron's enumeration order).
  std::vector<std::vector<int>> groups(const std::string& dim) const;

  // "pp 2 x dp 2 x tp 2".
  std::string describe() const;

 private:
  int index(const std::string& dim) const;  // throws naming the dimensions there are
  void check_rank(int rank) const;

  int world_;
  std::vector<MeshDim> dims_;
  std::vector<int> strides_;  // ranks between neighbours along each dimension
};

}  // namespace zero::comm
