// The tests' name for the host's counting allocator (zero/host_counting.hpp).
#pragma once

#include "zero/host_counting.hpp"

namespace zero::testing {

using PeakCpuAllocator = zero::HostCountingAllocator;

}  // namespace zero::testing
