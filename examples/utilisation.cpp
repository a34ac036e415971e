#include "utilisation.hpp"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <vector>

namespace zero::examples {
namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// NVML's C API, the few entry points used (nvml.h, stable since CUDA 5).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
constexpr nvmlReturn_t kNvmlSuccess = 0;

}  // namespace

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
  return s(u.ru_utime) + s(u.ru_stime);
}

struct UtilisationMeter::Nvml {
  void* lib = nullptr;
  nvmlDevice_t device = nullptr;
  nvmlReturn_t (*get_utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  std::string error;

  explicit Nvml(int local_index) {
    lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      error = "libnvidia-ml.so.1 not found";
      return;
    }
    auto sym = [&](const char* name) { return ::dlsym(lib, name); };
    auto init = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlInit_v2"));
    auto by_index = reinterpret_cast<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(
        sym("nvmlDeviceGetHandleByIndex_v2"));
    auto by_uuid = reinterpret_cast<nvmlReturn_t (*)(const char*, nvmlDevice_t*)>(
        sym("nvmlDeviceGetHandleByUUID"));
    get_utilization = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*)>(
        sym("nvmlDeviceGetUtilizationRates"));
    shutdown = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlShutdown"));
    if (!init || !by_index || !by_uuid || !get_utilization || !shutdown) {
      error = "libnvidia-ml lacks the NVML entry points";
      return;
    }
    if (init() != kNvmlSuccess) {
      error = "nvmlInit failed";
      shutdown = nullptr;
      return;
    }
    // CUDA device `local_index` is the local_index-th entry of CUDA_VISIBLE_DEVICES when set.
    std::string entry = std::to_string(local_index);
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
      std::vector<std::string> items;
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) items.push_back(item);
      if (local_index < static_cast<int>(items.size())) entry = items[local_index];
    }
    const nvmlReturn_t rc =
        entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0
            ? by_uuid(entry.c_str(), &device)
            : by_index(static_cast<unsigned>(std::strtoul(entry.c_str(), nullptr, 10)), &device);
    if (rc != kNvmlSuccess) {
      error = "NVML has no device '" + entry + "'";
      device = nullptr;
    }
  }
  ~Nvml() {
    if (shutdown) shutdown();
    if (lib) ::dlclose(lib);
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;
};

UtilisationMeter::UtilisationMeter(c10::Device device) {
  if (device.is_cuda()) {
    nvml_ = std::make_unique<Nvml>(device.has_index() ? device.index() : 0);
    source_ = nvml_->device ? "gpu (NVML)" : "unknown: " + nvml_->error;
    if (!nvml_->device) nvml_.reset();
    return;
  }
  if (!device.is_cpu()) {
    source_ = "unknown on " + device.str();
    return;
  }
  cpu_ = true;
  threads_ = std::max(1, at::get_num_threads());
  source_ = "cpu (" + std::to_string(threads_) + " threads)";
  last_cpu_s_ = process_cpu_seconds();
  last_wall_s_ = wall_seconds();
}

UtilisationMeter::~UtilisationMeter() = default;

double UtilisationMeter::sample() {
  if (nvml_) {
    // NVML averages over its own sample period (1/6 s to 1 s, by GPU): at print steps that is
    // the recent past of a busy run.
    nvmlUtilization_t u{};
    if (nvml_->get_utilization(nvml_->device, &u) != kNvmlSuccess) return -1;
    return u.gpu / 100.0;
  }
  if (!cpu_) return -1;
  const double cpu = process_cpu_seconds(), wall = wall_seconds();
  const double dw = wall - last_wall_s_, dc = cpu - last_cpu_s_;
  last_cpu_s_ = cpu, last_wall_s_ = wall;
  if (dw <= 0) return -1;
  return std::clamp(dc / (dw * threads_), 0.0, 1.0);
}

}  // namespace zero::examples
