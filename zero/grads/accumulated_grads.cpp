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

#include "optim/cpu_adamw.hpp"
#include "zero/grads/grad_buckets.hpp"
#include "zero/grads/grad_sync.hpp"
#include "zero/grads/grad_to_host.hpp"

namespace zero {
namespace {

class AccumulatedGrads final : public GradSync {
 public:
  AccumulatedGrads(const FlatLayout& layout, comm::Group& group, bool sharded,
                   const GradSyncOptions& opts)
      : layout_(layout),
        group_(group),
        sharded_(sharded),
        opts_(opts),
        tracker_(layout),
        // Stage 0 all-reduces in place in `in`: no `out` shard buffer.
        pipeline_(layout.buffer_numel(), sharded ? layout.chunk_numel() : 0,
                  at::TensorOptions().dtype(opts.comm_dtype).device(opts.device),
                  in_place(opts) ? 0 : 2),
        quant_(make_quantized_reduce(layout, group, opts, first_slot_)) {
    TORCH_CHECK(sharded || !opts.compress.enabled,
                "zero: zero_quantized_gradients compresses the reduce-scatter of ZeRO stages 1 "
                "and 2; stage 0 all-reduces full gradients. Set zero_optimization.stage: 1 or 2, "
                "or zero_quantized_gradients: false");
    const auto acc = at::TensorOptions().dtype(opts.accum_dtype).device(opts.device);
    full_ = at::zeros({layout.total_numel()}, acc);
    // Stage 0's shard is the whole buffer (the layout was built for one shard), so the reduced
    // gradient stays in place; stage 1 reduces into a separate 1/N shard.
    shard_ = !sharded_         ? full_
             : opts.host_shard ? device::host_zeros(layout.shard_numel(), opts.pin_memory)
                               : at::zeros({layout.shard_numel()}, acc);
    if (opts.host_shard) {
      to_host_ = std::make_unique<GradToHost>(opts.device, layout.chunk_numel(), opts.comm_dtype,
                                              opts.accum_dtype);
    }
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
    // Offload: the host shard is read by the step from now on, so every copy lands here.
    if (to_host_ && sharded_) to_host_->finish(shard_);
  }

  void set_release_order(const std::vector<int>& order) override { tracker_.set_order(order); }

  void abort() override {
    pipeline_.abort();
    if (to_host_) to_host_->abort();
    tracker_.reset();
    zero_grad();
  }

  at::Tensor& grad_shard() override { return shard_; }

  void zero_grad() override {
    full_.zero_();
    // Offload: the host shard is not touched; the next window's pieces overwrite it.
    if (sharded_ && to_host_) {
      to_host_->new_window();
    } else if (sharded_) {
      shard_.zero_();
    }
  }

  int64_t grad_bytes() const override { return full_.nbytes() + (sharded_ ? shard_.nbytes() : 0); }
  // The error-feedback residuals are declared with the bucket buffers (partitioned_grads.cpp).
  int64_t comm_buffer_bytes() const override {
    return pipeline_.bytes() + (quant_ ? quant_->bytes() : 0);
  }
  compress::ErrorFeedback* error_feedback() override {
    return quant_ ? quant_->feedback() : nullptr;
  }
  int64_t host_staging_bytes() const override { return to_host_ ? to_host_->bytes() : 0; }
  int64_t host_staging_pinned_bytes() const override {
    return to_host_ ? to_host_->pinned_bytes() : 0;
  }
  at::Tensor device_squared_norm() const override {
    return to_host_ ? to_host_->squared_norm() : at::Tensor();
  }
  int bucket_buffers() const override { return pipeline_.buffers(); }
  int bucket_buffers_peak() const override { return pipeline_.peak_in_use(); }

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
    const int rank = group_.rank();
    for (size_t k = 0; k < chunks.size(); ++k) {
      const BucketChunk c = chunks[k];
      at::Tensor mine = shard_.narrow(0, bucket.shard_offset + c.offset, c.numel);
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
        auto work = group_.all_reduce_sum(in, what);
        const BucketSlot* bp = &bucket;
        pipeline_.push(std::move(work), buf, [in, grads, bp, c, cast] {
          if (cast) unpack_chunk(in, *bp, c, 0, grads);
        });
        continue;
      }
      at::Tensor reduced;
      comm::Work work;
      if (quant_) {
        // zero_quantized_gradients: int8/int4 codes over one all-to-all, summed in fp32.
        reduced = pipeline_.buffer(buf).out.narrow(0, 0, c.numel);
        work = quant_->reduce_scatter(first_slot_[b] + k, reduced, in, what);
      } else if (!opts_.reduce_scatter) {
        work = group_.all_reduce_sum(in, what);
        reduced = in.narrow(0, rank * c.numel, c.numel);
      } else {
        reduced = cast ? pipeline_.buffer(buf).out.narrow(0, 0, c.numel) : mine;
        work = group_.reduce_scatter_sum(reduced, in, what);
      }
      // The window's sum was accumulated before the reduction: the reduced shard is copied into
      // the (zeroed) shard, not added, so no second rounding to grad_accum_dtype.
      pipeline_.push(std::move(work), buf, [this, reduced, mine, buf] {
        if (reduced.is_same(mine)) return;  // reduced in place
        if (!to_host_) {
          mine.copy_(reduced);
          return;
        }
        // Offload: the shard leaves for the host now (the collective's wait() ordered the
        // current stream after it), and the buffer is reused only after the copy read it.
        GradToHost::Ticket t = to_host_->send(reduced, mine, /*add=*/false);
        pipeline_.before_reuse(buf, [this, t] { to_host_->wait(t); });
      });
    }
  }

  const FlatLayout& layout_;
  comm::Group& group_;
  bool sharded_;
  GradSyncOptions opts_;
  BucketTracker tracker_;
  BucketPipeline pipeline_;
  at::Tensor full_;
  at::Tensor shard_;
  std::unique_ptr<GradToHost> to_host_;  // optimizer offload only
  bool boundary_ = false;
  std::vector<int> first_slot_;  // per bucket, its first error-feedback slot
  std::unique_ptr<compress::QuantizedReduceScatter> quant_;  // zero_quantized_gradients only
};

}  // namespace

std::unique_ptr<GradSync> make_accumulated_grads(const FlatLayout& layout, comm::Group& group,
                                                 bool sharded, const GradSyncOptions& opts) {
  return std::make_unique<AccumulatedGrads>(layout, group, sharded, opts);
}

}  // namespace zero
