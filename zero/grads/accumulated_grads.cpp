// Stage 0, and stage 1 under gradient accumulation or without overlap_comm: gradients accumulate in
// a full flat buffer (grad_accum_dtype) across micro-steps (autograd's per-parameter gradients are
// added in and freed at once), and are reduced bucket by bucket during the backward pass that
// closes the accumulation window.
//
// What this costs stage 1 next to stage 2 (which reduce-scatters every micro-step and keeps
// only its shard): a full accumulator (4Ψ bytes in fp32, 2Ψ in bf16) beside the shard, for one
// reduction per window instead of one per micro-step. Without accumulation (and with
// overlap_comm) there is nothing to accumulate, and stage 1 takes stage 2's path
// (partitioned_grads.cpp): the same bytes as stage 2. DeepSpeed 0.19.8's ZeRO-1 makes the same
// trade (runtime/zero/stage_1_and_2.py: reduce_ready_partitions_and_remove_grads reduces in the
// hooks only at the accumulation boundary, and only under overlap_comm (process_gradients);
// param.grad keeps the full gradient in between).
#include <ATen/ATen.h>

#include "zero/grads/grad_buckets.hpp"
#include "zero/grads/grad_sync.hpp"

namespace zero {
namespace {

class AccumulatedGrads final : public GradSync {
 public:
  // `full`: the accumulator (see make_accumulated_grads).
  AccumulatedGrads(const FlatLayout& layout, comm::Group& group, bool sharded,
                   const GradSyncOptions& opts, at::Tensor full, std::unique_ptr<Reducer> reducer,
                   std::unique_ptr<GradSink> sink)
      : GradSync(std::move(reducer), std::move(sink)),
        layout_(layout),
        group_(group),
        sharded_(sharded),
        opts_(opts),
        tracker_(layout),
        // Stage 0 all-reduces in place in `in`: no `out` shard buffer.
        pipeline_(layout.buffer_numel(), sharded ? layout.chunk_numel() : 0,
                  at::TensorOptions().dtype(opts.comm_dtype).device(opts.device),
                  in_place(opts) ? 0 : 2),
        full_(std::move(full)) {
    // Stage 0's shard is the whole buffer (the layout was built for one shard), so the reduced
    // gradient stays in place; stage 1 reduces into a separate 1/N shard.
    TORCH_INTERNAL_ASSERT(sharded_ || grad_shard().is_same(full_),
                          "zero: stage 0's gradient sink is the accumulator itself");
  }

  void begin_backward(bool boundary, const std::vector<int>& expected,
                      bool /*counting: nothing is guessed*/) override {
    boundary_ = boundary;
    tracker_.reset(expected);
    launch_ready();  // buckets whose parameters the loss does not reach at all
  }

  void on_grad(int param, const at::Tensor& grad) override {
    const ParamSlot& p = layout_.params()[param];
    // DeepSpeed sums a rank's micro-step gradients (autograd's .grad) in grad_accum_dtype.
    at::Tensor acc = full_.narrow(0, p.flat_offset, p.numel);
    accumulate(acc, grad.reshape({-1}), opts_.accum_dtype);
    tracker_.mark(param);
    launch_ready();
  }

  void end_backward() override {
    if (!boundary_) return;
    for (int b = tracker_.next_unreleased(); b >= 0; b = tracker_.next_unreleased()) {
      launch(b);
      ++counters_.launched_after_backward;
    }
    counters_.wait_seconds += pipeline_.drain();
    sink_->finish();
  }

  void set_release_order(const std::vector<int>& order) override { tracker_.set_order(order); }

  void abort() override {
    pipeline_.abort();
    sink_->abort();
    tracker_.reset();
    zero_grad();
  }

  void zero_grad() override {
    full_.zero_();
    sink_->new_window();
  }

  GradPathBytes bytes() const override {
    return path_bytes(pipeline_, static_cast<int64_t>(full_.nbytes()));
  }

 private:
  // fp32 gradients in an fp32 accumulator are reduced in place; other dtypes travel through a
  // copy, and so do gradients whose shard is in host memory (offload) and compressed ones
  // (their reduction lands in a buffer of its own).
  static bool in_place(const GradSyncOptions& o) {
    return o.comm_dtype == at::kFloat && o.accum_dtype == at::kFloat && !o.host_shard &&
           !o.compress.enabled;
  }

  void launch_ready() {
    if (!boundary_ || !opts_.overlap) return;
    for (int b = tracker_.next_ready(); b >= 0; b = tracker_.next_ready()) {
      launch(b);
      ++counters_.launched_in_backward;
    }
  }

  // fp32 gradients are reduced in place in the accumulator, a bucket at a time. Other
  // communication dtypes travel through the pool's buffers, chunk by chunk (BucketChunk), so
  // that a buffer never exceeds the bucket size whatever the largest parameter.
  void launch(int b) {
    const BucketSlot& bucket = layout_.buckets()[b];
    const int64_t padded = bucket.shard.padded_numel();
    const int64_t S = bucket.shard.shard_numel();
    at::Tensor grads = full_.narrow(0, bucket.flat_offset, padded);
    // The reduced shard lands in a device buffer first when it is then copied to the host.
    const bool cast = !in_place(opts_);
    const std::vector<BucketChunk> chunks =
        cast ? bucket_chunks(bucket, layout_.chunk_numel()) : std::vector<BucketChunk>{{0, S}};
    const int world = layout_.world();
    for (size_t k = 0; k < chunks.size(); ++k) {
      const BucketChunk c = chunks[k];
      at::Tensor mine = grad_shard().narrow(0, bucket.shard_offset + c.offset, c.numel);
      const std::string what = std::string(sharded_ ? "reduce_scatter" : "all_reduce") +
                               " of gradient bucket " + std::to_string(b) +
                               (chunks.size() > 1 ? " (chunk " + std::to_string(k) + ")" : "");
      int buf = -1;
      at::Tensor in = grads;
      if (cast) {
        buf = pipeline_.acquire();
        // Buckets take a buffer only when released, in order: one is always free or in flight.
        TORCH_INTERNAL_ASSERT(buf >= 0, "zero: no free buffer for gradient bucket ", b);
        in = pipeline_.buffer(buf).in.narrow(0, 0, world * c.numel);
        pack_chunk(in, bucket, c, 0, grads);
      }
      if (!sharded_) {
        auto work = reducer_->reduce(-1, in, in, what);
        const BucketSlot* bp = &bucket;
        pipeline_.push(std::move(work), buf, [in, grads, bp, c, cast] {
          if (cast) unpack_chunk(in, *bp, c, 0, grads);
        });
        if (k == 0) launched(b);
        continue;
      }
      // The in-place fp32 reduce-scatter writes the shard itself.
      at::Tensor out = reducer_->writes_out() && cast
                           ? pipeline_.buffer(buf).out.narrow(0, 0, c.numel)
                           : mine;
      comm::Work work = reducer_->reduce(reducer_->first_slot(b) + static_cast<int>(k), out, in,
                                         what);
      at::Tensor reduced = reducer_->result(out, in);
      // The window's sum was accumulated before the reduction: the reduced shard is copied into
      // the (zeroed) shard, not added, so no second rounding to grad_accum_dtype.
      pipeline_.push(std::move(work), buf, [this, reduced, mine, buf] {
        sink_->take(reduced, mine, /*add=*/false, pipeline_, buf);
      });
      if (k == 0) launched(b);
    }
  }

  const FlatLayout& layout_;
  comm::Group& group_;
  bool sharded_;
  GradSyncOptions opts_;
  BucketTracker tracker_;
  BucketPipeline pipeline_;
  at::Tensor full_;
  bool boundary_ = false;
};

at::Tensor make_accumulator(const FlatLayout& layout, const GradSyncOptions& opts) {
  return at::zeros({layout.total_numel()},
                   at::TensorOptions().dtype(opts.accum_dtype).device(opts.device));
}

}  // namespace

std::unique_ptr<GradSync> make_accumulated_grads(const FlatLayout& layout, comm::Group& group,
                                                 bool sharded, const GradSyncOptions& opts,
                                                 std::unique_ptr<Reducer> reducer,
                                                 std::unique_ptr<GradSink> sink) {
  TORCH_CHECK(sharded, "zero: make_accumulated_grads with a sink is for a sharded gradient; "
                       "stage 0's sink is its accumulator (the overload without one)");
  return std::make_unique<AccumulatedGrads>(layout, group, sharded, opts,
                                            make_accumulator(layout, opts), std::move(reducer),
                                            std::move(sink));
}

std::unique_ptr<GradSync> make_accumulated_grads(const FlatLayout& layout, comm::Group& group,
                                                 bool sharded, const GradSyncOptions& opts) {
  auto reducer = make_reducer(layout, group, sharded, opts);
  at::Tensor full = make_accumulator(layout, opts);
  auto sink = sharded ? make_shard_sink(layout, opts) : make_in_place_sink(full);
  return std::make_unique<AccumulatedGrads>(layout, group, sharded, opts, std::move(full),
                                            std::move(reducer), std::move(sink));
}

}  // namespace zero
