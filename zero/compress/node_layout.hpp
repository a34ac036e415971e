// Where the ranks of the data-parallel group sit, for the hierarchical compressed reduction
// (quantized_reduce.hpp): which node each rank is on, and whether the group has the shape the
// two-stage exchange needs (several nodes, the same number of ranks on each, more than one).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "comm/group.hpp"

namespace zero::compress {

// Ranks per node from the launcher: LOCAL_WORLD_SIZE (torchrun), OMPI_COMM_WORLD_LOCAL_SIZE
// (Open MPI), SLURM_NTASKS_PER_NODE (Slurm, a plain number only); 0 when none is set.
int local_world_size_from_env(const std::function<const char*(const char*)>& getenv);
int local_world_size_from_env();

// The ranks on this node as the launcher states them, and the variable that said so, for the
// host-memory check (host_room.hpp): local_world_size_from_env's variables, and where Slurm's
// nodes are uneven, this node's entry of SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE
// ("4(x2),2": 4, 4, 2 by SLURM_NODEID). count 0: none of them says.
struct NodeRanks {
  int count = 0;
  std::string source;
};
NodeRanks ranks_on_this_node(const std::function<const char*(const char*)>& getenv);
NodeRanks ranks_on_this_node();

// The node of every rank of `group`: its global rank / local_world_size. torchrun, mpirun and
// srun all number the ranks of a node consecutively (node k holds global ranks k*L .. k*L+L-1),
// so this needs no exchange. local_world_size <= 0: every rank on one node.
std::vector<int> nodes_of(const comm::Group& group, int local_world_size);

// The dp ranks of each node, ranks[node][local], both in rank order: what the two-stage
// exchange splits the group by.
struct TwoLevel {
  std::vector<std::vector<int>> ranks;
  int nodes() const { return static_cast<int>(ranks.size()); }
  int per_node() const { return ranks.empty() ? 0 : static_cast<int>(ranks[0].size()); }
};

// node_of[r]: the node of group rank r. nullopt unless there are at least two nodes, each with
// the same number of ranks, at least two: otherwise a flat exchange is all there is (one
// node: no slow link to spare; one rank per node: nothing to combine first; uneven nodes: the
// all-to-all's equal split does not hold).
std::optional<TwoLevel> two_level(const std::vector<int>& node_of);

}  // namespace zero::compress
