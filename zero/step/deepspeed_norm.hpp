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
#include "optim/shard_optimizer.hpp"
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

// DeepSpeed's ZeRO-3 (stage3.get_grad_norm_direct) takes each gradient slice's norm in fp64,
// sums their squares in fp64, all-reduces that fp64 sum and clips with the fp64 norm; its
// ZeRO-2 rounds each rank's partition sum to fp32 first (above), so the two stages clip with
// coefficients one fp32 ulp apart now and then, and every gradient with them. Stage 3 under
// torch_adam takes this route. Nothing is rounded below fp64 before the total, so which
// elements a rank holds does not matter. This rank's part over `pieces` of `g`, a one-element
// fp64 tensor on g's device; the caller all-reduces it over dp.
at::Tensor deepspeed3_squared_norm(const at::Tensor& g, const std::vector<optim::Range>& pieces);
// The same over the pieces themselves (stage 3's per-unit gradient pieces); `options`: the
// result's device.
at::Tensor deepspeed3_squared_norm(const std::vector<at::Tensor>& pieces,
                                   const at::TensorOptions& options);

}  // namespace zero
