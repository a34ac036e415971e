#include "memory_figures.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <sstream>

#include "zero/tensor_parallel.hpp"

namespace zero::examples {
namespace {

std::string list(const std::vector<int64_t>& v) {
  std::string j = "[";
  for (size_t i = 0; i < v.size(); ++i) j += (i ? ", " : "") + std::to_string(v[i]);
  return j + "]";
}

std::string or_null(int64_t v) { return v >= 0 ? std::to_string(v) : "null"; }

}  // namespace

std::string MemoryFigures::phase_json() const {
  // Predicted: the planner's model states on the device plus the activations alive in that
  // phase (initialize: plan_startup_peak); the step's and backward's transients are not
  // modelled, so a measured phase above its prediction by about a bucket is expected.
  std::string j = "{";
  for (int i = 0; i < kPhases; ++i) {
    j += std::string(i ? ", " : "") + "\"" + phase_name(static_cast<Phase>(i)) +
         "\": {\"measured\": " + or_null(phase_measured[i]) +
         ", \"predicted\": " + or_null(phase_predicted[i]) + "}";
  }
  return j + "}";
}

std::string MemoryFigures::json_fields() const {
  std::ostringstream out;
  out << ",\n  \"device_peak_allocated_bytes\": " << device_peak_allocated_bytes
      << ",\n  \"peak_rss_bytes\": " << peak_rss_bytes
      << ",\n  \"startup_peak_rss_bytes\": " << startup_peak_rss_bytes
      << ",\n  \"rss_after_initialize_bytes\": " << rss_after_initialize_bytes
      << ",\n  \"peak_rss_bytes_per_rank\": " << list(peak_rss_per_rank)
      << ",\n  \"device_peak_allocated_bytes_per_rank\": " << list(device_peak_per_rank)
      << ",\n  \"phase_peaks\": " << phase_json()
      << ",\n  \"phase_step_peaks\": " << list(step_peaks)
      << ",\n  \"steady_states_bytes\": " << steady_states
      << ",\n  \"phase_bound_bytes\": " << phase_bound;
  if (!last_step_split.empty()) {
    out << ",\n  \"phase_last_step_split\": {";
    for (size_t t = 0; t < last_step_split.size(); ++t) {
      out << (t ? ", " : "") << "\"" << host_tag_name(static_cast<HostTag>(t))
          << "\": " << last_step_split[t];
    }
    out << "}";
  }
  return out.str();
}

std::vector<int64_t> gather_over(const std::shared_ptr<Group>& world, int64_t value,
                                 const c10::Device& device) {
  if (!world || world->size() == 1) return {value};
  at::NoGradGuard no_grad;
  const at::Tensor mine = at::full({1}, value, at::TensorOptions().dtype(at::kLong).device(device));
  // gather_from_region: an all-gather over any group, rank order along the last dimension.
  const at::Tensor all = tensor_parallel::gather_from_region(mine, world).cpu();
  return {all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel()};
}

int64_t max_over(const std::shared_ptr<Group>& world, int64_t value, const c10::Device& device) {
  const auto all = gather_over(world, value, device);
  return *std::max_element(all.begin(), all.end());
}

}  // namespace zero::examples
