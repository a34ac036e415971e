// CUDA builds: names from the device properties, memory from the caching allocator, which is
// where every tensor of the engine (flat buffers, shards, bucket buffers) is allocated.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>

#include <atomic>

#include "device/registered_allocator.hpp"
#include "zero/device.hpp"

namespace zero {

std::string device_name(c10::Device device) {
  if (!device.is_cuda()) return device.str();
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  return at::cuda::getDeviceProperties(index)->name;
}

DeviceMemory device_memory(c10::Device device) {
  if (device.is_cpu()) return {};
  if (!device.is_cuda()) return detail::registered_allocator_memory(device);
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  using c10::CachingAllocator::StatType;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  const auto agg = static_cast<size_t>(StatType::AGGREGATE);
  DeviceMemory m;
  m.available = true;
  m.allocated = stats.allocated_bytes[agg].current;
  m.reserved = stats.reserved_bytes[agg].current;
  m.peak_allocated = stats.allocated_bytes[agg].peak;
  m.alloc_retries = stats.num_alloc_retries;
  const c10::cuda::CUDAGuard guard(index);  // cudaMemGetInfo reads the current device
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  m.free = static_cast<int64_t>(free);
  m.total = static_cast<int64_t>(total);
  return m;
}

int64_t allocated_bytes(c10::Device device) {
  if (device.is_cpu()) return host_allocated_bytes();
  return device_memory(device).allocated;
}

int64_t alloc_retries(c10::Device device) {
  if (device.is_cpu()) return 0;
  if (!device.is_cuda()) return detail::registered_allocator_memory(device).alloc_retries;
  // -1 = not counted: a CUDAPluggableAllocator's getDeviceStats throws, and cudaMallocAsync's
  // never counts retries (always 0, after four pool-attribute reads). Decided once, as this is
  // read after every backward and step (review 2026-12-07d L2).
  static std::atomic<int> counted{-1};  // -1 undecided, 0 no, 1 yes
  if (counted.load() == 0) return -1;
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  if (counted.load() < 0 && c10::cuda::CUDACachingAllocator::get()->name() != "native") {
    counted.store(0);
    return -1;
  }
  try {
    const int64_t n = c10::cuda::CUDACachingAllocator::getDeviceStats(index).num_alloc_retries;
    counted.store(1);
    return n;
  } catch (const std::exception&) {
    counted.store(0);
    return -1;
  }
}

void set_current_device(c10::Device device) {
  if (device.is_cuda() && device.has_index()) c10::cuda::set_device(device.index());
}

void reset_peak_memory(c10::Device device) {
  if (device.is_cpu()) return;
  if (!device.is_cuda()) return detail::reset_registered_allocator_peak(device);
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  c10::cuda::CUDACachingAllocator::resetPeakStats(index);
}

}  // namespace zero
