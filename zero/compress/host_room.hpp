// Whether a node's host memory can take the page-locked error-feedback residuals of ZeRO stage 3
// (error_feedback.hpp, Residence::kHost): checked before they are allocated, so that a run
// that cannot hold them stops at start-up with the keys to change instead of failing inside
// cudaHostAlloc or starving the page cache (review 2026-12-07b M1). Page-locked memory cannot be
// swapped, so what counts is what the kernel can hand out now without swapping.
#pragma once

#include <cstdint>
#include <string>

namespace zero::compress {

// Host bytes this process may count on: MemAvailable from /proc/meminfo, or sysconf's
// available physical pages where that file is missing; or the figure the test seam set.
int64_t host_available_bytes();
// Test seam: host_available_bytes() returns `bytes` on the calling thread from now on (0: read
// the system again), so a test can stand for a small host without allocating a large one, and
// ranks running as threads can stand for nodes with different room.
void set_host_available_for_testing(int64_t bytes);

struct HostRoom {
  int64_t per_rank = 0;   // page-locked residual bytes one rank asks for
  int local_ranks = 1;    // ranks sharing the node's memory (LOCAL_WORLD_SIZE; 1 if unset)
  int64_t available = 0;  // host_available_bytes()
  bool fits() const { return per_rank <= 0 || per_rank * local_ranks <= available; }
};

// "" when `room` fits; otherwise the refusal naming the keys and the fixes. `store` is the
// residual's storage ("fp32", "bf16", "fp16", "int8"); `int8_bytes` the per-rank bytes that
// int8 residuals would take.
std::string host_room_error(const HostRoom& room, const std::string& store, int64_t int8_bytes);

}  // namespace zero::compress
