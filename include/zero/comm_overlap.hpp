// The two communication-overlap switches of the config, for an A/B of what each hides (the
// values trained are the same either way):
//   pipeline.overlap_p2p_comm      Megatron-LM's name: each pipeline receive posted one compute
//                                  step before the instruction that needs it
//                                  (pipeline::RuntimeOptions::early_receives)
//   tensor_parallel.overlap_comm   the column-parallel layers' backward starts the input
//                                  gradient's all-reduce (reduce-scatter under SP) and computes
//                                  the weight gradient meanwhile
//                                  (tensor_parallel::ColumnParallelLinearOptions::overlap_comm)
// Both on unless the config says false. The loader keeps them in Config::extra ("true" /
// "false"), as it keeps pipeline.pipe_partitioned.
#pragma once

#include <string>

#include "zero/config.hpp"

namespace zero {

inline bool config_switch_on(const Config& c, const std::string& key) {
  auto it = c.extra.find(key);
  return it == c.extra.end() || it->second != "false";
}
inline bool overlap_p2p_comm(const Config& c) {
  return config_switch_on(c, "pipeline.overlap_p2p_comm");
}
inline bool tensor_parallel_overlap_comm(const Config& c) {
  return config_switch_on(c, "tensor_parallel.overlap_comm");
}

}  // namespace zero
