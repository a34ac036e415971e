#include "phase_peaks.hpp"

#include <algorithm>

#include "zero/device.hpp"

namespace zero::examples {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::kInitialize:
      return "initialize";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kStep:
      return "step";
    case Phase::kSave:
      return "save";
  }
  return "?";
}

PhasePeaks::PhasePeaks(c10::Device device) : device_(device) {
  measured_.fill(-1);
  available_ = !device.is_cpu() && device_memory(device).available;
  if (available_) end(Phase::kInitialize);
}

void PhasePeaks::begin() {
  if (available_) reset_peak_memory(device_);
}

void PhasePeaks::end(Phase p) {
  if (!available_) return;
  const int64_t peak = device_memory(device_).peak_allocated;
  int64_t& m = measured_[static_cast<int>(p)];
  m = std::max(m, peak);
  overall_ = std::max(overall_, peak);
}

}  // namespace zero::examples
