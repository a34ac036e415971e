// Turning a module's parameters into views of one flat buffer.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "comm/group.hpp"
#include "zero/shard_info.hpp"

namespace torch::nn {
class Module;
}

namespace zero {

struct FlatParams {
  FlatLayout layout;
  std::vector<at::Tensor> params;    // the module's trainable parameters, in layout order
  std::vector<int> layout_of_named;  // layout index of the i-th distinct named parameter
  at::Tensor flat;    // compute dtype, layout.total_numel(); params are views into it
  at::Tensor master;  // fp32, this rank's shard (aliases `flat` when no copy is needed)
  bool master_aliases_flat = false;
};

struct FlattenOptions {
  at::ScalarType param_dtype = at::kFloat;
  int64_t bucket_numel = 500'000'000;
  int shards = 1;      // 1 for stage 0, the world size otherwise
  int64_t align = 64;  // elements: keeps every shard 256-byte aligned for fp32
  // Optimizer offload: the master shard lives in host memory (page-locked with pin_memory) and
  // never aliases the flat buffer.
  bool host_master = false;
  bool pin_memory = false;
};

// Broadcasts rank 0's parameters and buffers, builds the flat layout (parameters in reverse
// registration order, the order backward usually produces their gradients), takes this rank's
// fp32 master shard from the broadcast values, and re-points each parameter at its slot of the
// flat compute-dtype buffer. Works bucket by bucket, freeing the user's tensors as it goes: the
// start-up peak is the final buffers plus one fp32 bucket, not a whole-model staging copy.
FlatParams flatten_parameters(torch::nn::Module& module, comm::Group& group,
                              const FlattenOptions& opts);

}  // namespace zero
