// The groups an engine runs over (docs/design/sharded-units.md §1.1): what it shards and
// averages over (dp), and the groups the gradient norm is summed over after it.
#pragma once

#include <memory>
#include <vector>

#include "comm/group.hpp"
#include "zero/groups.hpp"

namespace zero {

struct Topology {
  Groups groups;                       // as handed to initialize
  std::shared_ptr<comm::Group> group;  // groups.dp: what the engine shards and averages over
  // groups.norm's groups (zero/engine/grad_norm.cpp); empty without norm groups: the one-group
  // norm, as it always was.
  std::vector<std::shared_ptr<comm::Group>> norm_groups;
};

}  // namespace zero
