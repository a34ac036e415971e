// ZeRO-Offload's engine side (stages 1-3, zero_optimization.offload_optimizer): this rank's
// fp32 master shard, its optimizer states and its fp32 gradient shard live in host memory
// (flat_params, the host optimizer, GradSyncOptions::host_shard put them there); the device
// keeps the compute-dtype parameters and the bucket buffers. This object holds what the step
// adds: the compute-dtype copy of the new weights that the CPU optimizer writes in its own pass,
// and the move of each bucket's piece to the device for the parameter all-gather.
//
// One step, bucket after bucket, with no host wait between buckets (the README's optimizer
// offload section lists every host sync of the step):
//  - host_scalars(): the step's grad_scale and found_inf reach the host once (DeepSpeed reads
//    its overflow verdict once a step too); the CPU optimizer then never reads the device;
//  - update_bucket(b): the CPU step over b's slice writes the master, the states and the
//    compute-dtype copy in staging; the copy engine's stream uploads that slice straight into
//    this rank's part of b's flat buffer (stage 3: b's window of the unit's compute shard,
//    which the unit's next gather sends; device/copy_engine.hpp), and the current stream,
//    which the all-gather is ordered after, waits for the upload on the device. The host goes
//    on to bucket b+1 while b uploads and gathers;
//  - begin_publish(): staging is rewritten only after every earlier upload from it finished
//    (the host waits on their events; long finished by the next step).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "device/copy_engine.hpp"
#include "optim/cpu_adamw.hpp"
#include "zero/config.hpp"
#include "zero/params/shard_info.hpp"

namespace zero {

// The host step's threads for zero_optimization.offload_optimizer.threads = `configured`: that
// count when > 0; for 0, this rank's share of the cores this process may run on
// (sched_getaffinity) among the ranks of its node (LOCAL_WORLD_SIZE from torchrun,
// OMPI_COMM_WORLD_LOCAL_SIZE from Open MPI, else 1), at least 1. Not OMP_NUM_THREADS: torchrun
// sets it to 1, which would run every rank's step on one core.
int host_step_threads(int configured);

class OptimizerOffload {
 public:
  OptimizerOffload(const ZeroOptimizationConfig::OffloadOptimizerConfig& cfg,
                   at::ScalarType param_dtype, at::Device device);
  ~OptimizerOffload();

  // The step's scalars in host memory: one device-to-host read of grad_scale and found_inf
  // together (none when they are host tensors already). grad_mul is passed through.
  static optim::ShardOptimizer::Scalars host_scalars(const optim::ShardOptimizer::Scalars& s);

  // Before a round of update_bucket calls: waits until the previous round's uploads have read
  // staging (on a GPU they finished before the forward that used their parameters).
  void begin_publish();

  // The CPU step over bucket `b`'s slice of the shard (scalars from host_scalars), writing the
  // compute-dtype copy too; then that copy uploaded into `dst` (this rank's part of b's
  // all-gather output, on the device), which is returned as the gather's input. Without `opt`
  // (a publish with no step: after a checkpoint load or a relayout) the copy is made from the
  // master.
  at::Tensor update_bucket(optim::ShardOptimizer* opt, at::Tensor& master, const at::Tensor& grad,
                           double lr, const optim::ShardOptimizer::Scalars& scalars,
                           const BucketSlot& b, const at::Tensor& dst);

  // Allocates the compute-dtype copy for a shard of `numel` elements (at initialize, so the
  // memory report counts it from the start).
  void reserve(int64_t numel) {
    if (!staging_.defined() || staging_.numel() != numel) {
      begin_publish();  // no upload may still read the buffer being replaced
      staging_ = device::host_zeros(numel, pin_, param_dtype_);
    }
  }
  // A host copy of `t` (page-locked if asked), e.g. the master after a relayout.
  at::Tensor to_host(const at::Tensor& t) const;
  // Host bytes this object adds (the compute-dtype copy).
  int64_t staging_bytes() const { return staging_.defined() ? staging_.nbytes() : 0; }
  const at::Tensor& staging() const { return staging_; }
  bool pin_memory() const { return pin_; }

 private:
  bool pin_;
  at::ScalarType param_dtype_;
  at::Device device_;
  std::unique_ptr<device::CopyEngine> engine_;
  at::Tensor staging_;                   // compute dtype, the shard's size, host
  std::vector<device::Ticket> uploads_;  // this round's uploads from staging_
};

}  // namespace zero
