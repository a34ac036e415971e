// Devices other than the CPU and CUDA (an out-of-tree backend registered as PrivateUse1, such as
// the tests' fake accelerator): their memory figures come from the allocator PyTorch registered
// for the device type, read through c10's generic interface (c10::DeviceAllocator, what
// torch.accelerator.memory_allocated reads), so the engine needs no knowledge of the backend.
#pragma once

#include "zero/device.hpp"

namespace zero::detail {

// {} (available = false) when the device type's allocator keeps no statistics.
DeviceMemory registered_allocator_memory(c10::Device device);
void reset_registered_allocator_peak(c10::Device device);

}  // namespace zero::detail
