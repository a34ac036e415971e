// What the accelerator says about itself: its name (for the peak-FLOP/s table behind MFU) and
// the caching allocator's memory counters. One implementation per device family, picked by
// CMake (device/cuda/memory.cpp or device/none/memory.cpp), so callers need no #ifdef. Any other
// device type (a backend registered as PrivateUse1) is read through the allocator registered
// for it, when that is a c10::DeviceAllocator (device/registered_allocator.hpp).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace zero {

struct DeviceMemory {
  bool available = false;  // false on CPU: the host allocator keeps no such counters
  int64_t allocated = 0;   // bytes in live tensors now
  int64_t reserved = 0;    // bytes the caching allocator holds from the driver
  int64_t peak_allocated = 0;
  int64_t free = 0;   // the driver's free bytes on the device (all processes' use counted)
  int64_t total = 0;  // the device's capacity
  // Allocations the caching allocator served only after freeing its cached blocks and asking
  // the driver again (CUDA's num_alloc_retries; each one synchronizes the device), since the
  // process started.
  int64_t alloc_retries = 0;
};

// "NVIDIA H200", or "cpu".
std::string device_name(c10::Device device);
DeviceMemory device_memory(c10::Device device);
// Makes `device` the current CUDA device of this thread (no-op on CPU): NCCL and the caching
// allocator use it for work that names no device.
void set_current_device(c10::Device device);
// Starts a new peak_allocated window (no-op on CPU).
void reset_peak_memory(c10::Device device);
// Bytes the allocator behind `device` has handed out and not taken back, as the allocator itself
// counts them: on CUDA the caching allocator's allocated bytes (on another registered device
// type, its c10::DeviceAllocator's); on CPU glibc's mallinfo2 (heap
// chunks in use plus mmapped chunks, over all arenas, so process-wide). The engine's memory
// report and tests compare its deltas with the ZeRO formula: an independent measurement, not
// the engine's own list of tensors.
int64_t allocated_bytes(c10::Device device);
int64_t host_allocated_bytes();
// DeviceMemory::alloc_retries alone (no driver call: cheap enough for every step); 0 on CPU.
int64_t alloc_retries(c10::Device device);
// Dense bf16 peak FLOP/s of known accelerators (A100 312 T, H100/H200 989 T); 0 if unknown.
double known_peak_flops(const std::string& name);

}  // namespace zero
