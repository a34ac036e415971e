#include "startup_agreement.hpp"

#include <ATen/ATen.h>

#include "zero/config.hpp"
#include "zero/tensor_parallel.hpp"

namespace zero::examples {

void stop_unless_every_rank_passed(const std::string& problem, const c10::Device& device,
                                   const std::shared_ptr<Group>& world) {
  // reduce_from_region is an all-reduce over any group.
  const double failed =
      tensor_parallel::reduce_from_region(
          at::full({1}, problem.empty() ? 0.0 : 1.0, at::TensorOptions().device(device)), world)
          .item<double>();
  if (!problem.empty()) throw ConfigError(problem);
  if (failed > 0) {
    throw ConfigError(
        "another rank refused its start-up checks (its error names the file); stopping");
  }
}

}  // namespace zero::examples
