#include "tp_trainer.hpp"

#include <stdexcept>

#include "zero/errors.hpp"
#include "zero/models/tp_gpt.hpp"

namespace zero::examples {

tensor_parallel::Groups tensor_parallel_layout(const Config& cfg, std::shared_ptr<Group> world,
                                               const models::GptConfig& mc, int64_t seq_len,
                                               const std::string& source) {
  const int tp = cfg.tensor_parallel.autotp_size;
  // The world size first: a layout that cannot exist says so before the model's shape is
  // checked against it.
  tensor_parallel::Groups groups;
  try {
    groups = tensor_parallel::make_groups(std::move(world), tp);
    models::check_tensor_parallel_shape(mc, tp);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(source + ": " + e.what());
  }
  if (cfg.tensor_parallel.sequence_parallel && seq_len % tp != 0) {
    throw ConfigError(source +
                      ": tensor_parallel.sequence_parallel splits each sequence over the " +
                      std::to_string(tp) + " tensor-parallel ranks: trainer.seq_len = " +
                      std::to_string(seq_len) + " must be a multiple of " + std::to_string(tp));
  }
  return groups;
}

Groups engine_groups(const tensor_parallel::Groups& groups,
                     const std::vector<tensor_parallel::NamedPlacement>& placements) {
  return zero::engine_groups(placements, groups.mesh());
}

}  // namespace zero::examples
