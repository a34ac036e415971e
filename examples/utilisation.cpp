#include "utilisation.hpp"

#include <ATen/Parallel.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>

namespace zero::examples {
namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * t.tv_usec; };
  return s(u.ru_utime) + s(u.ru_stime);
}

UtilisationMeter::UtilisationMeter(c10::Device device) {
  if (device.is_cuda()) {
    nvml_ = std::make_unique<NvmlUtilisation>(device.has_index() ? device.index() : 0);
    source_ = nvml_->available() ? "gpu (NVML)" : "unknown: " + nvml_->error();
    if (!nvml_->available()) nvml_.reset();
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
    return nvml_->sample();
  }
  if (!cpu_) return -1;
  const double cpu = process_cpu_seconds(), wall = wall_seconds();
  const double dw = wall - last_wall_s_, dc = cpu - last_cpu_s_;
  last_cpu_s_ = cpu, last_wall_s_ = wall;
  if (dw <= 0) return -1;
  return std::clamp(dc / (dw * threads_), 0.0, 1.0);
}

}  // namespace zero::examples
