// Optimizer offload's gradient path (stages 1 and 2): each reduced bucket shard leaves the device
// as soon as the pipeline hands it over, on the copy engine's stream (device/copy_engine.hpp).
//
// As DeepSpeed's offload does it (async_inplace_copy_grad_to_fp32_buffer_from_gpu): the first
// piece of an accumulation window that reaches a range of the fp32 host shard is converted to
// fp32 on the device and copied straight into the (page-locked) shard; the host does no work on
// it, and the shard is not zeroed between steps (every range is written before it is read, and
// finish() zeroes what no piece covered). Only a piece that adds to a range already written in
// this window (stage 2 with gradient accumulation, a late gradient) goes through a small ring of
// page-locked slots in the communication dtype, and the host adds the slot into the shard when
// it needs the slot back or at the end of backward. So the copies overlap the rest of backward,
// and the host blocks on a copy only when its data is needed.
//
// Who waits on whom:
//  - the copy stream waits for the current stream (CopyEngine::copy_into_host), which the
//    bucket's collective wait() ordered after the reduction: the copy reads a finished shard;
//  - the bucket buffer the shard came from is written again (the next bucket's reduction) only
//    after the copy read it: the caller makes the current stream wait on the ticket before
//    reusing it (BucketPipeline::before_reuse), a device-side wait that costs the host nothing;
//  - the host waits for a copy (CopyEngine::synchronize) only to add its slot into the shard:
//    when the ring is full and the slot is needed for a new copy, or in finish().
// On a CPU run the engine is the host copy: the copy is a plain copy_ and the tickets are null.
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "device/copy_engine.hpp"

namespace zero {

class GradToHost {
 public:
  using Ticket = device::Ticket;

  // `slot_numel`: the largest reduced piece (a bucket buffer's shard, FlatLayout::chunk_numel),
  // in `comm_dtype`, the dtype it is reduced in (bf16 moves half fp32's bytes over PCIe).
  GradToHost(at::Device device, int64_t slot_numel, at::ScalarType comm_dtype,
             at::ScalarType accum_dtype);

  // Starts copying `reduced` (on the device, comm dtype) to the host; its values reach `dst` (a
  // slice of the host fp32 shard `shard`) later: added in (accumulation, rounded to accum_dtype)
  // when `add`, else copied. Returns the ticket to pass to wait() before `reduced` is written
  // again. A `dst` not written since new_window() is written directly, without the host.
  Ticket send(const at::Tensor& reduced, const at::Tensor& dst, bool add);
  // A new accumulation window: the shard's old values count as zeros (zero_grad, without
  // touching the shard).
  void new_window() {
    written_.clear();
    squared_norm_ = at::Tensor();
    norm_complete_ = true;
  }
  // The squared L2 norm of the window's gradient shard, in fp32, summed on the device piece by
  // piece as the pieces leave (as DeepSpeed's offload computes its norms from the device
  // gradients): the step then reads no host memory for it. Undefined when the device cannot
  // know it: a range received a second piece (the sum is on the host), or the pieces were host
  // tensors (a CPU run, whose norm stays the host's).
  at::Tensor squared_norm() const { return norm_complete_ ? squared_norm_ : at::Tensor(); }
  // Orders the current stream after the copy (no host wait).
  void wait(const Ticket& ticket) { engine_->wait(ticket); }
  // Lands every copy in flight and zeroes what no piece of this window wrote: the host fp32
  // shard `shard` is complete when this returns.
  void finish(const at::Tensor& shard);
  // After a failed backward: waits for the copies in flight (their slots may be written until
  // then) and drops them without touching the shard.
  void abort();
  // The page-locked staging ring: its tensors' bytes, and what the pinned allocator holds for them.
  int64_t bytes() const;
  int64_t pinned_bytes() const;
  // bytes() of a GradToHost made with these arguments, before it is made.
  static int64_t ring_bytes(int64_t slot_numel, at::ScalarType comm_dtype);

 private:
  Ticket send_direct(const at::Tensor& reduced, const at::Tensor& dst, bool add);
  void land_oldest();

  struct Pending {
    int slot;  // -1: a direct copy into dst (nothing to land)
    int64_t numel;
    at::Tensor dst;
    bool add;
    Ticket ticket;
    at::Tensor src;  // a direct copy's fp32 source on the device, alive until the copy ran
  };
  std::unique_ptr<device::CopyEngine> engine_;
  at::ScalarType accum_dtype_;
  std::vector<at::Tensor> slots_;
  std::vector<int> free_;
  std::deque<Pending> pending_;  // oldest first, the order the copy stream finishes them in
  // Ranges of the shard written in this window: element offset -> numel.
  std::map<int64_t, int64_t> written_;
  at::Tensor squared_norm_;    // on the device, this window's direct pieces
  bool norm_complete_ = true;  // every piece of the window is in squared_norm_
};

}  // namespace zero
