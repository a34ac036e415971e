// Process-wide allocator figures (mallinfo2 on CPU) around a 2-rank run: before initialize,
// after it, after two warm-up steps and after eight more. The memory tests compare these with
// the engine's report, so the measuring loop lives once, here.
#pragma once

#include <cstdint>
#include <vector>

#include "zero/config.hpp"
#include "zero/memory.hpp"

namespace zero::testing {

struct AllocatorRun {
  std::vector<MemoryReport> reports;  // one per rank, after the last step
  int64_t before = 0, after_init = 0, after_warm = 0, after_steps = 0;  // rank 0's readings
};

// Trains a ~1.05 M-parameter MLP (4 x Linear(512, 512); far above allocator noise) for ten
// steps on `world` thread ranks. Readings are taken by rank 0 between barriers, so no rank is
// allocating while they are made, once gloo's threads have let go of finished collectives.
AllocatorRun run_with_allocator_readings(const Config& cfg, int world);

// The process's allocated host bytes once they hold still (three equal readings 2 ms apart,
// within two seconds): other threads' transient buffers may be in flight at any one reading.
int64_t settled_host_allocated_bytes();

}  // namespace zero::testing
