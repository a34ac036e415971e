// Where a reduced gradient bucket ends up: the storage half of the gradient path (grad_sync.hpp
// composes a collector, a Reducer and a GradSink). The collectors hand over each reduced part
// with its destination, a window of shard(); the sink adds or copies it there.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>
#include <vector>

#include "zero/grads/grad_buckets.hpp"

namespace zero {

struct GradSyncOptions;

struct SinkBytes {
  int64_t shard = 0;                // the gradient shard the sink keeps
  int64_t host_staging = 0;         // offload: the page-locked landing ring (grad_to_host.hpp)
  int64_t host_staging_pinned = 0;  // the same as the page-locked allocator holds it
};

class GradSink {
 public:
  virtual ~GradSink() = default;
  // `reduced` (this rank's part, finished) into `dst`, a window of shard(): added (rounded to
  // grad_accum_dtype) when `add`, else copied. `buf`: the pool buffer `reduced` lives in, which
  // the sink may keep from reuse until it read it (BucketPipeline::before_reuse); -1 for none.
  virtual void take(const at::Tensor& reduced, const at::Tensor& dst, bool add,
                    BucketPipeline& pipeline, int buf) = 0;
  // After the last take of a backward pass: shard() is complete when this returns.
  virtual void finish() {}
  // A new accumulation window: the shard counts as zeros from now on.
  virtual void new_window() = 0;
  // After a failed backward: waits for what the sink has in flight and drops it.
  virtual void abort() {}
  // The whole shard as one tensor; only where whole() (stage 3 on the device keeps one piece per
  // unit: read it through window()).
  virtual at::Tensor& shard() = 0;
  virtual bool whole() const { return true; }
  // Elements [offset, offset + numel) of the shard, inside one unit's part of it (a bucket's
  // window or a piece of one): a view of shard(), or of the unit's own piece, allocated (zeros)
  // by its first use in the window.
  virtual at::Tensor window(int64_t offset, int64_t numel) {
    return shard().narrow(0, offset, numel);
  }
  virtual SinkBytes bytes() const = 0;
  // Offload: the squared norm of the host shard, summed on the device as its pieces left;
  // undefined when only the host has it (GradToHost::squared_norm).
  virtual at::Tensor device_squared_norm() const { return {}; }
};

// The gradient shard on the device, in grad_accum_dtype (stages 1, 2). Under
// opts.release_between_steps (stage 3) with several units (`units`: each one's [shard_begin,
// shard_end), in shard order) it is one tensor per unit, each allocated by the first reduction
// into it and all freed by new_window(): the shard grows as backward reaches the units, which
// release their gathered parameters (N times its bytes) as it does, instead of the whole shard
// standing beside every gathered unit from backward's first reduction (FSDP2's sharded
// gradients appear per unit so too).
std::unique_ptr<GradSink> make_device_shard(
    int64_t numel, const GradSyncOptions& opts,
    const std::vector<std::pair<int64_t, int64_t>>& units = {});
// Stage 0: the shard is the all-reduced accumulator itself (`acc`, kept by the collector); the
// reduction wrote into it, there is nothing to take and no bytes of its own.
std::unique_ptr<GradSink> make_in_place_sink(const at::Tensor& acc);
// Optimizer offload (stages 1, 2): an fp32 shard in host memory, each part copied there on the
// copy engine as it arrives (GradToHost).
std::unique_ptr<GradSink> make_host_shard(int64_t numel, int64_t chunk_numel,
                                          const GradSyncOptions& opts);
// The host bytes make_host_shard allocates (the fp32 shard and GradToHost's landing ring), known
// before it runs: what the error-feedback host-memory check counts (compress/host_room.hpp).
int64_t host_shard_bytes(int64_t numel, int64_t chunk_numel, const GradSyncOptions& opts);
// The sink `opts` asks for: host shard under offload, else a device shard.
std::unique_ptr<GradSink> make_shard_sink(const FlatLayout& layout, const GradSyncOptions& opts);

}  // namespace zero
