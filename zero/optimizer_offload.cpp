#include "zero/optimizer_offload.hpp"

#include <ATen/ATen.h>

namespace zero {

OptimizerOffload::OptimizerOffload(const ZeroOptimizationConfig::OffloadOptimizerConfig& cfg,
                                   at::ScalarType param_dtype, at::Device device)
    : pin_(cfg.pin_memory), param_dtype_(param_dtype), device_(device) {}

at::Tensor OptimizerOffload::update_bucket(optim::ShardOptimizer* opt, at::Tensor& master,
                                           const at::Tensor& grad, double lr,
                                           const optim::ShardOptimizer::Scalars& scalars,
                                           const BucketSlot& b) {
  // Sized by the master: a relayout may change the shard's size.
  reserve(master.numel());
  const int64_t begin = b.shard_offset, S = b.shard.shard_numel();
  at::Tensor out = staging_.narrow(0, begin, S);
  if (auto* host = dynamic_cast<optim::HostShardOptimizer*>(opt)) {
    host->update_to(master, grad, lr, scalars, {begin, begin + S}, out);
  } else {
    TORCH_INTERNAL_ASSERT(opt == nullptr, "zero: optimizer offload needs a host optimizer");
    out.copy_(master.narrow(0, begin, S));
  }
  // On a CPU run the device is the host: the copy is the all-gather's input as it is. From
  // page-locked memory the upload is asynchronous on the current stream, which the gather
  // (NCCL) is ordered after. staging_ is next written by the next step's update, after the
  // host has read that step's found_inf from the device (a sync that the upload precedes).
  return out.to(device_, /*non_blocking=*/pin_);
}

at::Tensor OptimizerOffload::to_host(const at::Tensor& t) const {
  at::Tensor h = optim::host_zeros(t.numel(), pin_, t.scalar_type());
  h.copy_(t.reshape({-1}));
  return h;
}

}  // namespace zero
