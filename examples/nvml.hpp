// NVML's GPU utilisation, libnvidia-ml loaded at run time with dlopen (so builds and machines
// without the NVIDIA driver work: available() is false and error() says why). Torch-free.
#pragma once

#include <string>

namespace zero::examples {

class NvmlUtilisation {
 public:
  // The NVML device of CUDA device `local_index`: CUDA_VISIBLE_DEVICES's entry for it (an index,
  // or a GPU-/MIG- UUID) when set, else the same index (NVML counts in PCI order, as CUDA does
  // with CUDA_DEVICE_ORDER=PCI_BUS_ID or on machines of one GPU model).
  explicit NvmlUtilisation(int local_index);
  ~NvmlUtilisation();
  NvmlUtilisation(const NvmlUtilisation&) = delete;
  NvmlUtilisation& operator=(const NvmlUtilisation&) = delete;

  bool available() const { return device_ != nullptr; }
  const std::string& error() const { return error_; }
  // utilization.gpu / 100: the share of NVML's last sample period (1/6 s to 1 s) in which a
  // kernel ran; < 0 when unavailable.
  double sample() const;

 private:
  void* lib_ = nullptr;
  void* device_ = nullptr;
  int (*get_utilization_)(void*, void*) = nullptr;
  int (*shutdown_)() = nullptr;
  std::string error_;
};

}  // namespace zero::examples
