// Errors zero throws on purpose; every message is meant to be read by the user as it is.
#pragma once

#include <stdexcept>

namespace zero {

// A collective failed or timed out: the message names this rank, the collective and the likely
// cause (a peer that died or stalled), so survivors can exit instead of hanging.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) is missing or inconsistent.
class LaunchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace zero
