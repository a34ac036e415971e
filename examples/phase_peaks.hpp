// Device memory peaks per phase of a training run (initialize, forward, backward, optimizer
// step, checkpoint save), read from the allocator and set beside the planner's prediction for
// each, for the --summary-json file. A run's peak is decided by its transients, which one
// whole-run peak cannot place; the phases can.
//
// The allocator's peak is reset at each phase's start (reset_peak_memory: CUDA's caching
// allocator, or a registered device's), so the whole run's peak is kept here (overall()), not
// by the allocator. On CPU the host's counting allocator (zero/host_counting.hpp), which the
// trainer installs before it builds the model, gives the same figures; without it nothing is
// measured.
#pragma once

#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <vector>

#include "zero/host_counting.hpp"

namespace zero::examples {

enum class Phase { kInitialize, kForward, kBackward, kStep, kSave };
constexpr int kPhases = 5;
const char* phase_name(Phase p);

class PhasePeaks {
 public:
  // Closes the initialize phase: the allocator's peak since the process started.
  explicit PhasePeaks(c10::Device device);
  bool available() const { return available_; }
  // Starts a phase: a new peak window.
  void begin();
  // Ends phase `p`: its peak joins the most that phase has reached.
  void end(Phase p);
  // Ends a window that holds several phases at once (a pipeline's train_batch interleaves the
  // micro-batches' forward and backward passes and ends with the step): its peak joins the
  // step's and the run's, no single phase's.
  void end_phases();
  // -1 when the allocator keeps no peak (CPU).
  int64_t measured(Phase p) const { return measured_[static_cast<int>(p)]; }
  // The most any phase reached.
  int64_t overall() const { return overall_; }
  // A training step's window: the most its phases reached, kept per step (the first step, the
  // switch to the first pass's bucket order at the second, the steady ones), and the bytes in
  // use once it ended (after the last step: the steady model states).
  void begin_step() { step_peak_ = -1; }
  void end_step();
  const std::vector<int64_t>& step_peaks() const { return step_peaks_; }
  int64_t after_step() const { return after_step_; }
  // CPU: the counting allocator's split by tag (zero/host_counting.hpp) at the last step's
  // peak; zeros elsewhere.
  const HostTagBytes& last_step_split() const { return last_split_; }

 private:
  c10::Device device_;
  bool available_ = false;
  std::array<int64_t, kPhases> measured_;
  int64_t overall_ = -1;
  int64_t step_peak_ = -1;
  std::vector<int64_t> step_peaks_;
  int64_t after_step_ = -1;
  HostTagBytes step_split_{}, last_split_{};
};

}  // namespace zero::examples
