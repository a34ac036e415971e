// The tests' name for the host's counting allocator (zero/host_counting.hpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

#include "zero/host_counting.hpp"

namespace zero::testing {

using PeakCpuAllocator = zero::HostCountingAllocator;

// The allocator's figure once gloo's threads let go of finished collectives' tensors (see
// support/allocator_run.cpp): three equal readings 2 ms apart, within two seconds.
inline int64_t settled_in_use() {
  const PeakCpuAllocator& a = PeakCpuAllocator::get();
  int64_t last = a.in_use();
  int same = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (same < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const int64_t now = a.in_use();
    same = now == last ? same + 1 : 0;
    last = now;
  }
  return last;
}

}  // namespace zero::testing
