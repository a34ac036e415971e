#include "zero/launcher.hpp"

#include "comm/liveness.hpp"

namespace zero {

bool launcher_exited() { return comm::launcher_gone(); }
int launcher_pid() { return comm::launcher_pid(); }

}  // namespace zero
