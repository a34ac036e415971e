#include "tp_trainer.hpp"

#include <stdexcept>

#include "tp_gpt.hpp"
#include "zero/errors.hpp"

namespace zero::examples {

tensor_parallel::Groups tensor_parallel_layout(const Config& cfg, std::shared_ptr<Group> world,
                                               const GptConfig& mc, int64_t seq_len,
                                               const std::string& source) {
  const int tp = cfg.tensor_parallel.autotp_size;
  // The world size first: a layout that cannot exist says so before the model's shape is
  // checked against it.
  tensor_parallel::Groups groups;
  try {
    groups = tensor_parallel::make_groups(std::move(world), tp);
    check_tensor_parallel_shape(mc, tp);
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

std::shared_ptr<Group> engine_groups(const Config& cfg, const tensor_parallel::Groups& groups,
                                     const std::string& source) {
  const std::string tp = std::to_string(groups.tp->size());
  if (cfg.tensor_parallel.sequence_parallel) {
    throw ConfigError(source +
                      ": tensor_parallel.sequence_parallel needs the engine to all-reduce "
                      "the norms' gradients over the tensor-parallel group, which it does not "
                      "yet; set tensor_parallel.sequence_parallel: false");
  }
  if (cfg.gradient_clipping > 0) {
    throw ConfigError(source + ": gradient_clipping = " + std::to_string(cfg.gradient_clipping) +
                      " with tensor_parallel.autotp_size = " + tp +
                      ": the engine's gradient norm does not count the other tensor-parallel "
                      "ranks' shards yet (each rank would clip by another factor); set "
                      "gradient_clipping: 0 (DeepSpeed's default is 1.0)");
  }
  if (cfg.fp16.enabled) {
    throw ConfigError(source + ": fp16 with tensor_parallel.autotp_size = " + tp +
                      ": the engine's overflow check does not span the tensor-parallel ranks "
                      "yet (one could skip a step another takes); use bf16");
  }
  return groups.dp;
}

}  // namespace zero::examples
