#include "comm/launcher_env.hpp"

#include <cstdlib>
#include <string>

#include "zero/errors.hpp"

namespace zero::comm {
namespace {

int parse_int(const char* name, const char* value) {
  try {
    size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used == std::string(value).size()) return v;
  } catch (const std::exception&) {
  }
  throw LaunchError(std::string("environment variable ") + name + "='" + value +
                    "' is not an integer; set it to a whole number");
}

const char* nonempty(const GetEnv& getenv, const char* name) {
  const char* v = getenv(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

}  // namespace

LaunchInfo read_launch_env(const GetEnv& getenv) {
  LaunchInfo info;
  struct Names {
    const char* launcher;
    const char* rank;
    const char* size;
    const char* local_rank;
  };
  // Several launchers may leave variables behind (torchrun inside a Slurm allocation, say): the
  // most specific one wins.
  const Names candidates[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
  };
  for (const auto& n : candidates) {
    const char* rank = nonempty(getenv, n.rank);
    const char* size = nonempty(getenv, n.size);
    if (rank == nullptr && size == nullptr) continue;
    if (rank == nullptr || size == nullptr) {
      throw LaunchError(std::string(rank ? n.size : n.rank) + " is not set but " +
                        (rank ? n.rank : n.size) + " is; set both (or launch with torchrun)");
    }
    info.launcher = n.launcher;
    info.rank = parse_int(n.rank, rank);
    info.world_size = parse_int(n.size, size);
    if (const char* lr = nonempty(getenv, n.local_rank))
      info.local_rank = parse_int(n.local_rank, lr);
    if (info.world_size < 1) {
      throw LaunchError(std::string(n.size) + "=" + size + " must be at least 1");
    }
    if (info.rank < 0 || info.rank >= info.world_size) {
      throw LaunchError(std::string(n.rank) + "=" + rank + " must be in [0, " + n.size + "=" +
                        size + "); check the launcher's arguments");
    }
    break;
  }
  if (const char* p = nonempty(getenv, "MASTER_PORT")) {
    info.master_port = parse_int("MASTER_PORT", p);
    if (info.master_port <= 0 || info.master_port > 65535) {
      throw LaunchError(std::string("MASTER_PORT=") + p + " is not a TCP port (1..65535)");
    }
  }
  if (info.world_size > 1) {
    const char* addr = nonempty(getenv, "MASTER_ADDR");
    if (addr == nullptr) {
      throw LaunchError(
          "MASTER_ADDR is not set: with " + std::to_string(info.world_size) +
          " ranks every rank must know where rank 0 listens. Launch with `torchrun --no-python` "
          "or export MASTER_ADDR=<rank 0's host> (under Slurm: "
          "$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)) and MASTER_PORT");
    }
    info.master_addr = addr;
  }
  if (const char* agent = nonempty(getenv, "TORCHELASTIC_USE_AGENT_STORE")) {
    info.agent_store = std::string(agent) == "True" || std::string(agent) == "1";
  }
  if (const char* rc = nonempty(getenv, "TORCHELASTIC_RESTART_COUNT")) {
    info.restart_count = parse_int("TORCHELASTIC_RESTART_COUNT", rc);
  }
  return info;
}

LaunchInfo read_launch_env() {
  return read_launch_env([](const char* name) { return std::getenv(name); });
}

std::string drop_nccl_blocking_wait() {
  std::string dropped;
  for (const char* name : {"TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"}) {
    const char* v = std::getenv(name);
    if (v == nullptr) continue;
    const std::string value = v;
    // c10d reads these as booleans: anything but empty, 0 or false turns blocking wait on.
    const bool on = !value.empty() && value != "0" && value != "false" && value != "FALSE";
    if (on) dropped += (dropped.empty() ? "" : ", ") + std::string(name) + "=" + value;
    ::unsetenv(name);
  }
  if (dropped.empty()) return "";
  return "zero: ignoring " + dropped +
         " (unset): a blocking wait spins the host on every gradient bucket's collective, "
         "which stalls backward and removes the overlap of communication with compute; "
         "collectives are bounded by comm_timeout_s through the NCCL watchdog instead";
}

}  // namespace zero::comm
