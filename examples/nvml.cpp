#include "nvml.hpp"

#include <dlfcn.h>

#include <cstdlib>
#include <sstream>
#include <vector>

namespace zero::examples {
namespace {

// NVML's C API, the few entry points used (nvml.h, stable since CUDA 5): every call returns 0
// on success; nvmlUtilization_t is {unsigned gpu, memory}.
constexpr int kNvmlSuccess = 0;
struct NvmlUtilization {
  unsigned int gpu, memory;
};

}  // namespace

NvmlUtilisation::NvmlUtilisation(int local_index) {
  lib_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    error_ = "libnvidia-ml.so.1 not found";
    return;
  }
  auto sym = [&](const char* name) { return ::dlsym(lib_, name); };
  auto init = reinterpret_cast<int (*)()>(sym("nvmlInit_v2"));
  auto by_index = reinterpret_cast<int (*)(unsigned, void**)>(sym("nvmlDeviceGetHandleByIndex_v2"));
  auto by_uuid = reinterpret_cast<int (*)(const char*, void**)>(sym("nvmlDeviceGetHandleByUUID"));
  get_utilization_ = reinterpret_cast<int (*)(void*, void*)>(sym("nvmlDeviceGetUtilizationRates"));
  auto shutdown = reinterpret_cast<int (*)()>(sym("nvmlShutdown"));
  if (!init || !by_index || !by_uuid || !get_utilization_ || !shutdown) {
    error_ = "libnvidia-ml.so.1 lacks the NVML entry points";
    return;
  }
  if (init() != kNvmlSuccess) {
    error_ = "nvmlInit failed";
    return;
  }
  shutdown_ = shutdown;
  std::string entry = std::to_string(local_index);
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
    std::vector<std::string> items;
    std::stringstream ss(v);
    for (std::string item; std::getline(ss, item, ',');) items.push_back(item);
    if (local_index < static_cast<int>(items.size())) entry = items[local_index];
  }
  const bool uuid = entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0;
  const int rc =
      uuid ? by_uuid(entry.c_str(), &device_)
           : by_index(static_cast<unsigned>(std::strtoul(entry.c_str(), nullptr, 10)), &device_);
  if (rc != kNvmlSuccess) {
    error_ = "NVML has no device '" + entry + "'";
    device_ = nullptr;
  }
}

NvmlUtilisation::~NvmlUtilisation() {
  if (shutdown_) shutdown_();
  if (lib_) ::dlclose(lib_);
}

double NvmlUtilisation::sample() const {
  if (!device_) return -1;
  NvmlUtilization u{};
  if (get_utilization_(device_, &u) != kNvmlSuccess) return -1;
  return u.gpu / 100.0;
}

}  // namespace zero::examples
