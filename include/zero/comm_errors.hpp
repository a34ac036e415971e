// Errors of the communication layer (comm/), which throws them and sits below everything else:
// this header depends on nothing of zero's, so comm/ includes it without reaching up into the
// engine (zero/errors.hpp, which includes it, is the engine's part).
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

// A start-up step (rendezvous, process-group creation, first barrier) did not finish within
// comm_timeout_s, or the launcher exited meanwhile. A helper thread is still blocked inside c10d
// and cannot be joined, so the process must not run its normal exit: run_main reports the
// message and ends the process with _exit(1).
class StartupTimeout : public LaunchError {
 public:
  using LaunchError::LaunchError;
};

}  // namespace zero
