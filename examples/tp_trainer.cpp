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

Groups engine_groups(const tensor_parallel::Groups& groups,
                     const std::vector<tensor_parallel::NamedPlacement>& placements) {
  // The norm sums over dp and then over tp; a replicated parameter (the norms) is the same on
  // every tp rank and counts once (Megatron's get_grad_norm_fp32 and DeepSpeed count it on
  // tensor-parallel rank 0 only).
  // Under sequence parallelism the norms (and the row-parallel biases) see this rank's part of
  // the sequence only: the engine sums their gradients over tp once per step, after its dp
  // reduction (Megatron's _allreduce_layernorm_grads).
  NormGroup tp_norm{groups.tp, {}, {}};
  for (const auto& p : placements) {
    if (p.placement.sharded) continue;
    auto& list = p.placement.grad_needs_all_reduce ? tp_norm.partial : tp_norm.replicated;
    list.push_back(p.name);
  }
  // Checkpoints record each rank's block of the split weights: a save of one autotp_size loads
  // under another and consolidates into whole tensors.
  return Groups{
      groups.dp, {std::move(tp_norm)}, tensor_parallel::checkpoint_parts(placements, *groups.tp)};
}

}  // namespace zero::examples
