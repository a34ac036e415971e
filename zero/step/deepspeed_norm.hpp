// The global gradient norm as DeepSpeed's ZeRO-1/2 optimizer takes it
// (stage_1_and_2.get_grad_norm_direct), for the torch_adam path, whose point is DeepSpeed's
// arithmetic to the last bit. DeepSpeed squares and sums each rank's gradients in fp64, rounds
// that sum to fp32 and all-reduces the fp32 values. Its ranks hold contiguous 1/N partitions of
// the flat parameters in registration order; zero's ranks hold their shard of every bucket, so
// rounding zero's own per-rank sums would round different numbers (one fp32 ulp apart in the
// norm on the parity bench's stage-1 transformer row). Here each rank sums its elements into
// DeepSpeed's partitions in fp64, the partial sums are all-reduced in fp64, and each partition's
// sum is rounded to fp32 and added as DeepSpeed's all-reduce adds them.
#pragma once

#include <ATen/core/Tensor.h>

#include "comm/group.hpp"
#include "zero/params/flat_params.hpp"
#include "zero/params/sharding.hpp"

namespace zero {

// The squared norm of the whole gradient (all ranks), a one-element fp32 tensor on g's device.
// `g`: this rank's gradient shard (stages 1/2), or the whole reduced gradient on every rank at
// stage 0 (nothing to combine: one fp64 sum rounded to fp32). A collective over `group` (the
// data-parallel one) when the gradient is sharded. `counted`: per layout parameter, whether
// this rank counts it (Groups::norm's replicated parameters); empty: all of them. The caller
// sums the result over the norm groups.
at::Tensor deepspeed_squared_norm(const at::Tensor& g, const FlatParams& fp,
                                  const Sharding& sharding, comm::Group& group,
                                  const std::vector<char>& counted = {});

}  // namespace zero
