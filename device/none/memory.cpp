// CPU-only builds: no CUDA allocator counters to read; another registered device type's
// allocator is read the generic way (device/registered_allocator.hpp).
#include "device/registered_allocator.hpp"
#include "zero/device.hpp"

namespace zero {

std::string device_name(c10::Device device) { return device.str(); }
DeviceMemory device_memory(c10::Device device) {
  return device.is_cpu() ? DeviceMemory{} : detail::registered_allocator_memory(device);
}
int64_t allocated_bytes(c10::Device device) {
  if (device.is_cpu()) return host_allocated_bytes();
  return detail::registered_allocator_memory(device).allocated;
}
int64_t alloc_retries(c10::Device device) {
  return device.is_cpu() ? 0 : detail::registered_allocator_memory(device).alloc_retries;
}
void reset_peak_memory(c10::Device device) {
  if (!device.is_cpu()) detail::reset_registered_allocator_peak(device);
}
void set_current_device(c10::Device) {}

}  // namespace zero
