// Where this process sits in the job, read from whichever launcher started it.
#pragma once

#include <functional>
#include <string>

namespace zero::comm {

struct LaunchInfo {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr;  // empty when world_size == 1
  int master_port = 29500;
  // torchrun's agent already serves a TCPStore on MASTER_PORT; then every rank is a client.
  bool agent_store = false;
  int restart_count = 0;  // torchrun restarts reuse the agent store: keys get a fresh prefix
  std::string launcher = "none";  // "torchrun", "openmpi", "slurm" or "none"
};

using GetEnv = std::function<const char*(const char*)>;

// torchrun variables win over Open MPI's, which win over Slurm's. Throws zero::LaunchError with
// the variable to set when the environment is incomplete or inconsistent.
LaunchInfo read_launch_env(const GetEnv& getenv);
LaunchInfo read_launch_env();

// TORCH_NCCL_BLOCKING_WAIT (or the older NCCL_BLOCKING_WAIT) set to a true value makes every
// WorkNCCL::wait() spin the host until the GPU finished the collective: each bucket's wait in
// backward would stall kernel queuing, and the overlap of communication with backward is gone.
// zero bounds collectives with the watchdog (comm_timeout_s) instead, so this unsets both and
// returns the warning to print ("" when neither was set). Call before making an NCCL group.
std::string drop_nccl_blocking_wait();

}  // namespace zero::comm
