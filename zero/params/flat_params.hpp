// Turning a module's parameters into views of one flat buffer.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "comm/group.hpp"
#include "zero/deferred_init.hpp"
#include "zero/params/shard_info.hpp"

namespace torch::nn {
class Module;
}

namespace zero {

struct FlatParams {
  FlatLayout layout;
  std::vector<at::Tensor> params;    // the module's trainable parameters, in layout order
  std::vector<int> layout_of_named;  // layout index of the i-th distinct named parameter
  at::Tensor flat;  // compute dtype, layout.total_numel(); params are views into it
  // Stage 3 (FlattenOptions::unit_buffers): no `flat`; one buffer per layout unit instead,
  // each its own storage over the unit's [flat_begin, flat_end), so that a unit's bytes can be
  // freed alone (units::UnitStorage). Indexed like layout.units().
  std::vector<at::Tensor> unit_buffers;
  // Stage 3: this rank's shard in the compute dtype (layout.shard_numel() elements, addressed
  // like the master): what a unit's all-gather sends. fp32: the master itself (kShard); under
  // optimizer offload a tensor of its own; bf16/fp16 with the master on the device: undefined
  // (each gather rounds the master into its output, ShardedUnit::gather).
  at::Tensor shard;
  // The parameters' compute dtype and device (`flat`'s options). Kept apart from `flat` so that
  // what only needs the device or dtype does not read the buffer: at stage 3 there is no one
  // flat buffer but one per unit (docs/design/sharded-units.md §7, part 3), and the buffer's
  // values are read through the units (ShardedUnit::buffer).
  at::TensorOptions compute_options;
  const at::TensorOptions& options() const { return compute_options; }
  at::Device device() const { return compute_options.device(); }
  // Where this rank's fp32 master shard lives (the accessors below hide which it is).
  enum class MasterStorage {
    // A device tensor of its own: bf16/fp16 parameters (the optimizer steps fp32 masters).
    kOwnTensor,
    // `flat` itself: fp32 parameters and one shard (stage 0, or one rank) - no second copy.
    kAliasesFlat,
    // fp32 parameters sharded over ranks: the master is this rank's shard of each bucket of
    // `flat`, stepped in place by the optimizer and published by the all-gather (in place too:
    // the input is the output's own slot), so no second fp32 copy of the shard exists;
    // `master` is undefined.
    kInFlat,
    // Optimizer offload: host memory (page-locked with pin_memory), never aliasing `flat`.
    kHost,
    // Stage 3 with fp32 parameters: `shard`, the gather source, is the master (no second copy).
    kShard,
  };
  MasterStorage storage = MasterStorage::kOwnTensor;
  at::Tensor master;  // undefined under kInFlat
  bool master_aliases_flat() const { return storage == MasterStorage::kAliasesFlat; }
  bool master_in_flat() const { return storage == MasterStorage::kInFlat; }
  int shard_rank = 0;  // whose shard of each bucket is the master (0 when unsharded)

  // Bucket b's part of the master (its shard_numel() elements).
  at::Tensor bucket_master(const BucketSlot& b) const;
  // A contiguous view of layout.shard_numel() elements, addressed like the master shard, whose
  // elements are the real master over bucket b's window [b.shard_offset, + shard_numel()) (what
  // the optimizer updates for that bucket; elsewhere it reads other parts of `flat`, which the
  // update does not touch). The master itself when that is one tensor.
  at::Tensor master_window(const BucketSlot& b) const;
  // The whole master shard as one contiguous tensor (a copy under kInFlat: checkpoints
  // and the layout rebuild read it) and the way back.
  at::Tensor master_shard() const;
  void set_master_shard(const at::Tensor& shard);
  // Bytes of fp32 master held beside the parameters (0 when the parameters are the master).
  int64_t master_bytes() const;
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
  // Stage 3: the unit of each trainable parameter (by TensorImpl; absent: unit 0). The layout
  // takes the units one after another, ordered by their first parameter in reverse registration
  // order, each in reverse registration order inside.
  std::unordered_map<const void*, int> unit_of;
  // Stage 3: one buffer per unit (FlatParams::unit_buffers) and the compute-dtype shard.
  bool unit_buffers = false;
  // A deferred model's source (deferred_init.hpp): each rank fills what it keeps from it and
  // nothing is broadcast; every parameter must then be deferred. Null: broadcast rank 0's.
  const InitialValues* values = nullptr;
};

// Broadcasts rank 0's parameters and buffers, builds the flat layout (parameters in reverse
// registration order, the order backward usually produces their gradients), takes this rank's
// fp32 master shard from the broadcast values, and re-points each parameter at its slot of the
// flat compute-dtype buffer. Works bucket by bucket, freeing the user's tensors as it goes: the
// start-up peak is the final buffers plus one fp32 bucket, not a whole-model staging copy.
FlatParams flatten_parameters(torch::nn::Module& module, comm::Group& group,
                              const FlattenOptions& opts);

}  // namespace zero
