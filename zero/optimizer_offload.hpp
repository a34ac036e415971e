// ZeRO-Offload's engine side (stages 1 and 2, zero_optimization.offload_optimizer): this rank's
// fp32 master shard, its optimizer states and its fp32 gradient shard live in host memory
// (flat_params, the host optimizer, GradSyncOptions::host_shard put them there); the device
// keeps the compute-dtype parameters and the bucket buffers. This object holds what the step
// adds: the compute-dtype copy of the new weights that the CPU optimizer writes in its own pass,
// and the move of each bucket's piece to the device for the parameter all-gather.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "optim/cpu_adamw.hpp"
#include "zero/config.hpp"
#include "zero/shard_info.hpp"

namespace zero {

class OptimizerOffload {
 public:
  OptimizerOffload(const ZeroOptimizationConfig::OffloadOptimizerConfig& cfg,
                   at::ScalarType param_dtype, at::Device device);

  // The CPU step over bucket `b`'s slice of the shard, writing the compute-dtype copy too; then
  // the slice's new values on the device, ready to be all-gathered. Without `opt` (a publish
  // with no step: after a checkpoint load or a relayout) the copy is made from the master.
  at::Tensor update_bucket(optim::ShardOptimizer* opt, at::Tensor& master, const at::Tensor& grad,
                           double lr, const optim::ShardOptimizer::Scalars& scalars,
                           const BucketSlot& b);

  // Allocates the compute-dtype copy for a shard of `numel` elements (at initialize, so the
  // memory report counts it from the start).
  void reserve(int64_t numel) {
    if (!staging_.defined() || staging_.numel() != numel) {
      staging_ = optim::host_zeros(numel, pin_, param_dtype_);
    }
  }
  // A host copy of `t` (page-locked if asked), e.g. the master after a relayout.
  at::Tensor to_host(const at::Tensor& t) const;
  // Host bytes this object adds (the compute-dtype copy).
  int64_t staging_bytes() const { return staging_.defined() ? staging_.nbytes() : 0; }
  bool pin_memory() const { return pin_; }

 private:
  bool pin_;
  at::ScalarType param_dtype_;
  at::Device device_;
  at::Tensor staging_;  // compute dtype, the shard's size, host
};

}  // namespace zero
