// The memory figures every --summary-json carries, whatever the layout (plain, tensor-parallel,
// pipelined): each rank's peak RSS and device peak (over the whole world), their maxima, the
// start-up peaks, and the allocator's peak per phase beside the planner's prediction. One writer
// for both summaries (train_summary.cpp, pp_summary.cpp), so their keys are the same.
#pragma once

#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "phase_peaks.hpp"
#include "zero/group.hpp"

namespace zero::examples {

struct MemoryFigures {
  int64_t peak_rss_bytes = 0;  // max over ranks (each rank's in the per-rank lists)
  std::vector<int64_t> peak_rss_per_rank, device_peak_per_rank;
  int64_t device_peak_allocated_bytes = 0;  // the allocator's, max over ranks; 0 where none
  int64_t startup_peak_rss_bytes = 0, rss_after_initialize_bytes = 0;
  // Per phase: the most any rank's allocator reached (-1: not measured) and the planner's
  // prediction (-1: none). A pipeline's forward, backward and step interleave within a step:
  // they are not measured apart (its step peaks are).
  std::array<int64_t, kPhases> phase_measured{-1, -1, -1, -1, -1};
  std::array<int64_t, kPhases> phase_predicted{-1, -1, -1, -1, -1};
  std::vector<int64_t> step_peaks;  // per training step, the most any rank's allocator reached
  int64_t steady_states = -1, phase_bound = -1;
  // CPU runs: what the last step's peak was made of on the rank where it was highest, by the
  // counting allocator's tags (zero/host_counting.hpp); empty elsewhere.
  std::vector<int64_t> last_step_split;

  // {"initialize": {"measured": 1, "predicted": 2}, ...}; null where not measured or predicted.
  std::string phase_json() const;
  // The keys, each as ",\n  \"key\": value", in the order both summaries write them.
  std::string json_fields() const;
};

// Every rank's `value` over `world`, in rank order (an all-gather on `device`; a collective).
std::vector<int64_t> gather_over(const std::shared_ptr<Group>& world, int64_t value,
                                 const c10::Device& device);
int64_t max_over(const std::shared_ptr<Group>& world, int64_t value, const c10::Device& device);

}  // namespace zero::examples
