#include "phase_peaks.hpp"

#include <algorithm>

#include "zero/device.hpp"
#include "zero/host_counting.hpp"

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

namespace {

// The allocator's bytes in use now and their peak since the last reset.
struct Reading {
  int64_t allocated, peak;
};

Reading read(c10::Device device) {
  if (device.is_cpu()) {
    const HostCountingAllocator& a = HostCountingAllocator::get();
    return {a.in_use(), a.peak()};
  }
  const DeviceMemory m = device_memory(device);
  return {m.allocated, m.peak_allocated};
}

}  // namespace

PhasePeaks::PhasePeaks(c10::Device device) : device_(device) {
  measured_.fill(-1);
  available_ =
      device.is_cpu() ? HostCountingAllocator::installed() : device_memory(device).available;
  if (available_) end(Phase::kInitialize);
}

void PhasePeaks::begin() {
  if (!available_) return;
  if (device_.is_cpu()) {
    HostCountingAllocator::get().reset_peak();
  } else {
    reset_peak_memory(device_);
  }
}

void PhasePeaks::end(Phase p) {
  if (!available_) return;
  const int64_t peak = read(device_).peak;
  int64_t& m = measured_[static_cast<int>(p)];
  m = std::max(m, peak);
  overall_ = std::max(overall_, peak);
  if (p != Phase::kInitialize && p != Phase::kSave && peak > step_peak_) {
    step_peak_ = peak;
    if (device_.is_cpu()) step_split_ = HostCountingAllocator::get().peak_by_tag();
  }
}

void PhasePeaks::end_phases() {
  if (!available_) return;
  const int64_t peak = read(device_).peak;
  overall_ = std::max(overall_, peak);
  step_peak_ = std::max(step_peak_, peak);
}

void PhasePeaks::end_step() {
  if (!available_) return;
  step_peaks_.push_back(step_peak_);
  last_split_ = step_split_;
  after_step_ = read(device_).allocated;
}

}  // namespace zero::examples
