// Whether a node's host memory can take the page-locked error-feedback residuals of ZeRO stage 3
// (error_feedback.hpp, Residence::kHost): checked before they are allocated, so that a run
// that cannot hold them stops at start-up with the keys to change instead of failing inside
// cudaHostAlloc or starving the page cache (review 2026-12-07b M1). Page-locked memory cannot be
// swapped, so what counts is what the kernel can hand out now without swapping: the machine's
// MemAvailable, or less where this process's cgroup (a Kubernetes pod, a Slurm job) is limited,
// since page-locked pages are charged to the cgroup and its OOM killer ends a rank rather than
// anything throwing (review 2026-12-07c L3).
//
// What the check counts: the residuals and the host bytes the engine allocates after them
// (optimizer offload's states, host gradient shard and landing ring: HostRoom::later), times
// the node's ranks. What it does not: memory already held when the room is read (the offload
// master and compute-dtype copy, allocated earlier, are gone from the room already), page-locked
// buffers freed before it (deferred start-up's StagingRing, 2 x 16 MiB), what a peer on the node
// allocates between its start and this rank's reading, the caching host allocator's rounding of
// blocks below 1 MiB, and any headroom for the page cache, activations or data loaders.
#pragma once

#include <cstdint>
#include <string>

namespace zero::compress {

// Where the room is read; the defaults are this machine's (tests point them at fake files).
struct HostMemoryFiles {
  std::string meminfo = "/proc/meminfo";
  std::string self_cgroup = "/proc/self/cgroup";  // "0::/path" (v2), "N:memory:/path" (v1)
  std::string cgroup_root = "/sys/fs/cgroup";     // v2 mount; v1's memory controller below it
};

struct HostMemory {
  int64_t available = 0;  // bytes this process may still take without swapping
  std::string source;     // where that figure comes from, for errors
};

// The smaller of MemAvailable (sysconf's free pages where /proc/meminfo lacks it) and, for the
// cgroup of this process and each cgroup above it that sets a limit, the limit less its working
// set (usage less inactive file pages, which the kernel reclaims before it fails a charge: the
// working set Kubernetes evicts on). v2: memory.max ("max": no limit), memory.current,
// memory.stat's inactive_file; v1: memory.limit_in_bytes, memory.usage_in_bytes, memory.stat's
// total_inactive_file.
HostMemory read_host_memory(const HostMemoryFiles& files = {});
// read_host_memory(), or the figure the test seam set on this thread.
HostMemory host_memory();
// Test seam: host_memory() returns `bytes` on the calling thread from now on (0: read the system
// again), so a test can stand for a small host without allocating a large one, and ranks running
// as threads can stand for nodes with different room.
void set_host_available_for_testing(int64_t bytes);

struct HostRoom {
  int64_t per_rank = 0;  // page-locked residual bytes one rank asks for
  // Host bytes one rank allocates after the check besides the residuals (optimizer offload's
  // states, host gradient shard and its landing ring), and what they are, for the error.
  int64_t later = 0;
  std::string later_what;
  int local_ranks = 1;     // ranks sharing the node's memory
  std::string local_from;  // how local_ranks was found ("LOCAL_WORLD_SIZE", ...)
  HostMemory host;
  int64_t node_bytes() const { return (per_rank + later) * local_ranks; }
  bool fits() const { return per_rank <= 0 || node_bytes() <= host.available; }
};

// "" when `room` fits; otherwise the refusal naming the figures, the keys and the fixes (without
// the "zero: " prefix: it is one rank's part of the agreed error, quantized_reduce.cpp). `store` is
// the residual's storage ("fp32", "bf16", "fp16", "int8"); `int8_bytes` the per-rank bytes that
// int8 residuals would take.
std::string host_room_error(const HostRoom& room, const std::string& store, int64_t int8_bytes);

}  // namespace zero::compress
