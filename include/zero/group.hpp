// A process group as the public API sees it: which ranks a collective runs over, and where this
// process sits among them. Opaque on purpose: the collectives, the backend and the store stay in
// zero's communication layer (comm/, not installed), so this header depends on nothing.
//
//   auto world = zero::process_group_from_env(cfg, c10::DeviceType::CPU);
//   std::printf("rank %d of %d (%s)\n", world->rank(), world->size(), world->name().c_str());
//   auto engine = zero::initialize(model, cfg, world);
//
// Only zero makes groups (process_group_from_env, a mesh's dimensions, splits); a program holds
// them as std::shared_ptr<zero::Group> and hands them back to zero.
#pragma once

#include <string>

namespace zero {
namespace comm {
class Group;
}

class Group {
 public:
  virtual ~Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  // This process's rank in the group, in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "world", or the mesh dimension / split it was made as ("tp", "dp", "world/split 0 color 1").
  virtual std::string name() const = 0;
  // The rank in the world group of this group's rank `group_rank`.
  virtual int global_rank(int group_rank) const = 0;

 private:
  // The one implementation is comm::Group (the collectives' interface).
  Group() = default;
  friend class comm::Group;
};

}  // namespace zero
