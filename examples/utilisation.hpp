// How busy rank 0's device was between two samples, for the live line, the summary and the
// bottleneck verdict (the guide asks for > 85 % next to MFU).
//  - CUDA: NVML's utilization.gpu (the share of time a kernel ran), libnvidia-ml loaded at run
//    time with dlopen, so builds and machines without it work (utilisation unknown). The NVML
//    device is the CUDA device's: CUDA_VISIBLE_DEVICES's entry (an index or a GPU-UUID) for the
//    local index, NVML's own numbering otherwise (NVML counts in PCI order, as CUDA does with
//    CUDA_DEVICE_ORDER=PCI_BUS_ID or on machines of one GPU model).
//  - CPU: the process's CPU time (getrusage: user + system, every thread) over the wall time
//    times the intra-op threads, at most 1: the share of the compute threads' time spent
//    computing rather than waiting (for communication, data, the host).
#pragma once

#include <c10/core/Device.h>

#include <memory>
#include <string>

#include "nvml.hpp"

namespace zero::examples {

class UtilisationMeter {
 public:
  explicit UtilisationMeter(c10::Device device);
  ~UtilisationMeter();
  UtilisationMeter(const UtilisationMeter&) = delete;
  UtilisationMeter& operator=(const UtilisationMeter&) = delete;

  // The busy fraction since the previous sample (or construction), in [0, 1]; < 0: unknown.
  double sample();
  // "cpu (4 threads)", "gpu (NVML)", or why it is unknown.
  const std::string& source() const { return source_; }

 private:
  std::unique_ptr<NvmlUtilisation> nvml_;
  bool cpu_ = false;
  int threads_ = 1;
  double last_cpu_s_ = 0, last_wall_s_ = 0;
  std::string source_;
};

// CPU seconds (user + system) this process has used.
double process_cpu_seconds();

}  // namespace zero::examples
