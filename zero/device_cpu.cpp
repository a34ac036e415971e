// CPU-only builds: no device allocator counters to read.
#include "zero/device.hpp"

namespace zero {

std::string device_name(c10::Device device) { return device.str(); }
DeviceMemory device_memory(c10::Device) { return {}; }
int64_t allocated_bytes(c10::Device) { return host_allocated_bytes(); }
void reset_peak_memory(c10::Device) {}
void set_current_device(c10::Device) {}

}  // namespace zero
