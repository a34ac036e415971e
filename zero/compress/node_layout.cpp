#include "zero/compress/node_layout.hpp"

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

namespace zero::compress {
namespace {

// The first of the launchers' ranks-per-node variables that is set, and its name; count 0 when
// none is, or when it is not one positive number (Slurm writes "4(x2),2" for uneven nodes).
NodeRanks launcher_count(const std::function<const char*(const char*)>& getenv) {
  for (const char* name :
       {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}) {
    const char* v = getenv(name);
    if (v == nullptr || *v == '\0') continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end == '\0' && n > 0) return {static_cast<int>(n), name};
    return {};
  }
  return {};
}

// Entry `node` of Slurm's per-node task list ("4(x2),2": nodes 0 and 1 run 4, node 2 runs 2);
// 0 when the list is malformed or shorter.
int slurm_tasks_on(const std::string& list, long node) {
  std::istringstream in(list);
  for (std::string entry; std::getline(in, entry, ',');) {
    char* end = nullptr;
    const long tasks = std::strtol(entry.c_str(), &end, 10);
    long repeat = 1;
    if (*end == '(') {
      if (end[1] != 'x') return 0;
      repeat = std::strtol(end + 2, &end, 10);
      if (*end != ')') return 0;
      ++end;
    }
    if (*end != '\0' || tasks <= 0 || repeat <= 0) return 0;
    if (node < repeat) return static_cast<int>(tasks);
    node -= repeat;
  }
  return 0;
}

}  // namespace

int local_world_size_from_env(const std::function<const char*(const char*)>& getenv) {
  return launcher_count(getenv).count;
}

int local_world_size_from_env() {
  return local_world_size_from_env([](const char* n) { return std::getenv(n); });
}

NodeRanks ranks_on_this_node(const std::function<const char*(const char*)>& getenv) {
  if (NodeRanks n = launcher_count(getenv); n.count > 0) return n;
  const char* node = getenv("SLURM_NODEID");
  if (node == nullptr || *node == '\0') return {};
  char* end = nullptr;
  const long id = std::strtol(node, &end, 10);
  if (*end != '\0' || id < 0) return {};
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const char* v = getenv(name);
    if (v == nullptr) continue;
    const int n = slurm_tasks_on(v, id);
    if (n > 0) return {n, std::string(name) + " at SLURM_NODEID " + std::to_string(id)};
  }
  return {};
}

NodeRanks ranks_on_this_node() {
  return ranks_on_this_node([](const char* n) { return std::getenv(n); });
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
