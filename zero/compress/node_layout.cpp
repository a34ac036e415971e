#include "zero/compress/node_layout.hpp"

#include <cstdlib>
#include <map>
#include <string>

namespace zero::compress {

int local_world_size_from_env(const std::function<const char*(const char*)>& getenv) {
  for (const char* name :
       {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') continue;
    // Slurm writes "4(x2),2" for uneven nodes: not one number, so no two-level layout.
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n > 0) return static_cast<int>(n);
    return 0;
  }
  return 0;
}

int local_world_size_from_env() {
  return local_world_size_from_env([](const char* n) { return std::getenv(n); });
}

std::vector<int> nodes_of(const comm::Group& group, int local_world_size) {
  std::vector<int> out(group.size(), 0);
  if (local_world_size <= 0) return out;
  for (int r = 0; r < group.size(); ++r) out[r] = group.global_rank(r) / local_world_size;
  return out;
}

std::optional<TwoLevel> two_level(const std::vector<int>& node_of) {
  std::map<int, std::vector<int>> by_node;
  for (int r = 0; r < static_cast<int>(node_of.size()); ++r) by_node[node_of[r]].push_back(r);
  if (by_node.size() < 2) return std::nullopt;
  const size_t per_node = by_node.begin()->second.size();
  TwoLevel t;
  for (auto& [node, ranks] : by_node) {
    if (ranks.size() < 2 || ranks.size() != per_node) return std::nullopt;
    t.ranks.push_back(std::move(ranks));
  }
  return t;
}

}  // namespace zero::compress
