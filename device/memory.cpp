#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <malloc.h>

#include <string>

#include "device/registered_allocator.hpp"
#include "zero/device.hpp"

namespace zero {

namespace detail {
namespace {

// The device type's allocator if it keeps statistics (a c10::DeviceAllocator), else null.
c10::DeviceAllocator* stats_allocator(c10::DeviceType type) {
  return dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(type));
}

c10::DeviceIndex index_of(c10::Device device) {
  if (device.has_index()) return device.index();
  return c10::impl::VirtualGuardImpl(device.type()).getDevice().index();
}

}  // namespace

DeviceMemory registered_allocator_memory(c10::Device device) {
  c10::DeviceAllocator* a = stats_allocator(device.type());
  if (!a) return {};
  using c10::CachingAllocator::StatType;
  const auto stats = a->getDeviceStats(index_of(device));
  const auto agg = static_cast<size_t>(StatType::AGGREGATE);
  DeviceMemory m;
  m.available = true;
  m.allocated = stats.allocated_bytes[agg].current;
  m.reserved = stats.reserved_bytes[agg].current;
  m.peak_allocated = stats.allocated_bytes[agg].peak;
  m.alloc_retries = stats.num_alloc_retries;
  return m;
}

void reset_registered_allocator_peak(c10::Device device) {
  if (c10::DeviceAllocator* a = stats_allocator(device.type())) a->resetPeakStats(index_of(device));
}

}  // namespace detail

int64_t host_allocated_bytes() {
  const struct mallinfo2 mi = mallinfo2();
  return static_cast<int64_t>(mi.uordblks + mi.hblkhd);
}

double known_peak_flops(const std::string& name) {
  // Dense (not sparse) bf16 tensor-core peaks from the vendors' data sheets.
  struct Entry {
    const char* tag;
    double flops;
  };
  static const Entry table[] = {{"H200", 989e12}, {"H100", 989e12}, {"A100", 312e12},
                                {"L40S", 362e12}, {"A10", 125e12},  {"V100", 125e12}};
  for (const Entry& e : table) {
    if (name.find(e.tag) != std::string::npos) return e.flops;
  }
  return 0;
}

}  // namespace zero
