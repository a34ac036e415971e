// Where gradients go between autograd and the optimizer: a collector, a Reducer and a GradSink.
// The collector decides when a bucket is reduced and from which buffer: AccumulatedGrads (stage
// 0, and stage 1 under gradient accumulation: a full gradient buffer, reduced once per
// accumulation window) or PartitionedGrads (stage 2, and stage 1 without accumulation: only this
// rank's shard survives a micro-step; buckets are reduced as backward produces them). The
// Reducer (reducer.hpp) launches the collective: all-reduce, reduce-scatter,
// all-reduce-keep-shard or quantized. The GradSink (grad_sink.hpp) keeps the result: a device
// shard, the accumulator in place (stage 0) or a host shard (optimizer offload). Gradients are
// kept in grad_accum_dtype (see GradSyncOptions::accum_dtype).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

#include "comm/group.hpp"
#include "zero/compress/quantized_reduce.hpp"
#include "zero/grads/grad_sink.hpp"
#include "zero/grads/reducer.hpp"
#include "zero/params/shard_info.hpp"

namespace zero {

struct GradSyncOptions {
  at::ScalarType comm_dtype = at::kFloat;  // dtype gradients travel in
  // data_types.grad_accum_dtype: the dtype the accumulator and the reduced shard are kept in,
  // as DeepSpeed keeps them (bf16: 2 bytes per element, not 4). The optimizer step converts
  // one bucket at a time to fp32. Only the host shard of optimizer offload stays fp32 (the CPU
  // optimizer reads fp32); its values are rounded to this dtype after every addition instead.
  at::ScalarType accum_dtype = at::kFloat;
  at::Device device = at::kCPU;
  bool overlap = true;         // launch a bucket's reduction as soon as it is complete
  bool reduce_scatter = true;  // false: all-reduce and keep the own shard (DeepSpeed's option)
  // Optimizer offload (stages 1-3): the fp32 gradient shard lives in host memory (page-locked
  // with pin_memory); each bucket's reduced shard is copied there as its reduction completes.
  bool host_shard = false;
  bool pin_memory = false;
  // Stage 3 (FSDP2's zero_grad(set_to_none=True)): nothing of the gradient path is held between
  // steps. The device gradient shard is allocated (zeros) when the window's first reduction
  // needs it, accumulates the window's micro-steps, and is freed by zero_grad() after the step
  // read it; the bucket buffers are allocated as the window's first backward takes them, kept
  // for its later micro-steps and freed by zero_grad() with the shard (once per window: on CUDA
  // a block freed every micro-step can be split by the next forward's activations, and the
  // next backward's allocation then makes the caching allocator free its cache and retry,
  // review 2026-12-07c L1). Under optimizer offload the host shard and its landing ring stay
  // (page-locked host memory, whose allocation and release cost more than a step's copies);
  // the device's bucket buffers go all the same.
  bool release_between_steps = false;
  // zero_quantized_gradients (stages 1, 2): buckets are reduced by a quantized all-to-all
  // (zero/compress/quantized_reduce.hpp) instead of reduce_scatter / all_reduce; the bucket
  // buffers still hold the gradients in comm_dtype before they are quantized.
  compress::Settings compress;
  // The node of each rank of the group (empty: one node), for the hierarchical exchange.
  std::vector<int> node_of;
};

struct GradSyncCounters {
  int64_t launched_in_backward = 0;
  int64_t launched_after_backward = 0;
  double wait_seconds = 0;
};

// What the gradient path holds, for the memory report.
struct GradPathBytes {
  int64_t grads = 0;         // accumulator and gradient shard
  int64_t comm_buffers = 0;  // bucket pool and error-feedback residuals
  // Optimizer offload: the page-locked ring a reduced shard lands in on its way to the host
  // shard (grad_to_host.hpp); host memory, a declared buffer beside comm_buffers.
  int64_t host_staging = 0;
  // The same as the page-locked allocator holds it (device::host_bytes: page- or
  // power-of-two-rounded).
  int64_t host_staging_pinned = 0;
  int buffers = 0;       // the bucket pool's buffers
  int buffers_peak = 0;  // the most held at once so far
};

class GradSync {
 public:
  GradSync(std::unique_ptr<Reducer> reducer, std::unique_ptr<GradSink> sink)
      : reducer_(std::move(reducer)), sink_(std::move(sink)) {}
  virtual ~GradSync() = default;
  // A micro-step's backward starts; `boundary`: it closes an accumulation window, so this
  // pass's gradients must be fully reduced when it ends. `expected`: gradients each parameter
  // will deliver (layout order; see BucketTracker), empty: one each. `counting`: the pass on
  // which every rank still learns those counts (GradOrder's first), the same on every rank; a
  // rank may guess counts on it (a checkpointed block in its graph) while another does not.
  virtual void begin_backward(bool boundary, const std::vector<int>& expected, bool counting) = 0;
  // From the post-accumulate hook of parameter `param` (layout index) during backward. May be
  // called more than once per pass for a parameter (checkpointed blocks sharing it): the
  // gradients add up.
  virtual void on_grad(int param, const at::Tensor& grad) = 0;
  // After autograd returned: launches what is left and waits for all of it.
  virtual void end_backward() = 0;
  // From the next pass on, buckets are reduced in `order` (a permutation of the bucket indices,
  // the same on every rank) instead of index order; the layout stays as it is.
  virtual void set_release_order(const std::vector<int>& order) = 0;
  // After a backward that failed: waits for the reductions in flight, returns their buffers and
  // forgets every gradient of the current accumulation window (the next pass starts afresh).
  virtual void abort() = 0;
  // Forget the accumulated gradients (after the optimizer step).
  virtual void zero_grad() = 0;
  // This rank's gradient shard (accum_dtype, or fp32 in host memory under offload): the sum
  // over ranks (not yet averaged) once a boundary pass ended. Laid out like the master shard.
  at::Tensor& grad_shard() { return sink_->shard(); }
  virtual GradPathBytes bytes() const = 0;
  // Called with a bucket's index right after its (first) reduction was launched in a pass.
  void set_on_launched(std::function<void(int)> f) { on_launched_ = std::move(f); }
  // Stage 3: a complete bucket is reduced during backward only once may_launch(bucket) says so
  // (its unit's all-gather of this pass was issued), so that no rank reduce-scatters a unit's
  // gradients before it all-gathered the unit (review 06e H1); what it holds back goes when
  // launch_ready() is called after the gate opened, or after backward.
  void set_launch_gate(std::function<bool(int)> may_launch) { gate_ = std::move(may_launch); }
  // Launches what became ready (a gate opened); nothing outside backward.
  virtual void launch_ready() {}
  Reducer& reducer() { return *reducer_; }
  GradSink& sink() { return *sink_; }
  const GradSyncCounters& counters() const { return counters_; }

 protected:
  void launched(int bucket) {
    if (on_launched_) on_launched_(bucket);
  }
  // What every collector reports beside its own bytes.
  GradPathBytes path_bytes(const BucketPipeline& pipeline, int64_t own_grads) const {
    const SinkBytes s = sink_->bytes();
    return {own_grads + s.shard,     pipeline.bytes() + reducer_->bytes(),
            s.host_staging,          s.host_staging_pinned,
            pipeline.buffers(),      pipeline.peak_in_use()};
  }

  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<GradSink> sink_;
  std::function<void(int)> on_launched_;
  std::function<bool(int)> gate_;
  GradSyncCounters counters_;
};

// Stage 0 (`sharded` false: all-reduce, every rank keeps the whole gradient) and stage 1 under
// accumulation (`sharded` true: reduce-scatter into this rank's shard).
// The accumulator is the collector's; with `sharded` the reduced shard goes to `sink`, without
// it `sink` must be make_in_place_sink(accumulator) and `reducer` make_all_reduce (the overload
// below builds them).
std::unique_ptr<GradSync> make_accumulated_grads(const FlatLayout& layout, comm::Group& group,
                                                 bool sharded, const GradSyncOptions& opts,
                                                 std::unique_ptr<Reducer> reducer,
                                                 std::unique_ptr<GradSink> sink);
std::unique_ptr<GradSync> make_accumulated_grads(const FlatLayout& layout, comm::Group& group,
                                                 bool sharded, const GradSyncOptions& opts);
// The dtype gradient storage of `opts` is allocated in: accum_dtype, but fp32 for a shard in
// host memory.
inline at::ScalarType grad_storage_dtype(const GradSyncOptions& opts, bool host) {
  return host ? at::kFloat : opts.accum_dtype;
}

// `acc` += `add` as a sum kept in `accum_dtype`: the addition runs in fp32 and is rounded once
// to the accumulator's dtype; an fp32 accumulator holding a narrower sum (the offload host
// shard) is rounded to `accum_dtype` after it, which gives the same values.
inline void accumulate(at::Tensor& acc, const at::Tensor& add, at::ScalarType accum_dtype) {
  acc.add_(add);
  if (accum_dtype != acc.scalar_type()) acc.copy_(acc.to(accum_dtype));
}

// The compressed reduction of `opts` (null when zero_quantized_gradients is off), with one
// error-feedback slot per reduction a bucket goes through: a bucket no larger than a bucket
// buffer is one, a larger one a slot per chunk (BucketChunk); first_slot[b] is bucket b's first.
std::unique_ptr<compress::QuantizedReduceScatter> make_quantized_reduce(
    const FlatLayout& layout, comm::Group& group, const GradSyncOptions& opts,
    std::vector<int>& first_slot);

// Stage 2, and stage 1 without accumulation. The overload without them builds the reducer and
// sink `opts` asks for (make_reducer, make_shard_sink).
std::unique_ptr<GradSync> make_partitioned_grads(const FlatLayout& layout, comm::Group& group,
                                                 const GradSyncOptions& opts,
                                                 std::unique_ptr<Reducer> reducer,
                                                 std::unique_ptr<GradSink> sink);
std::unique_ptr<GradSync> make_partitioned_grads(const FlatLayout& layout, comm::Group& group,
                                                 const GradSyncOptions& opts);

}  // namespace zero
