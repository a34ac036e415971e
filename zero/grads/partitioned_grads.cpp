// Stage 2, and stage 1 without gradient accumulation: no full-size gradient outlives a
// micro-step. Autograd's gradient of each parameter is copied into its bucket's communication
// buffer and freed; a complete bucket is reduce-scattered at once, overlapping the rest of
// backward, and the rank's part is added to its shard (kept in grad_accum_dtype).
//
// The pool has two buffers of FlatLayout::buffer_numel() elements (at most reduce_bucket_size)
// and never grows. A bucket may take one only while it is among the next two to be released
// (in the release order, BucketTracker::set_order):
// the bucket released next can then always get one (by finishing the oldest reduction if need
// be). A gradient whose bucket is further ahead (gradients out of bucket order, or a bucket held
// back by a parameter that has not delivered yet) is kept as autograd produced it, and copied in
// when its bucket's turn comes: no memory beyond what autograd allocated, where a growing pool
// would add a full bucket pair per stalled bucket. A bucket larger than a buffer (a parameter
// bigger than reduce_bucket_size) always keeps autograd's gradients that way and is reduced in
// chunks through the pool (BucketChunk): the buffers stay bounded by the bucket size, not by
// the largest parameter, and the gradient is held once, as autograd made it.
#include <ATen/ATen.h>

#include <algorithm>

#include "zero/grads/grad_buckets.hpp"
#include "zero/grads/grad_sync.hpp"

namespace zero {
namespace {

constexpr int kPoolBuffers = 2;

class PartitionedGrads final : public GradSync {
 public:
  PartitionedGrads(const FlatLayout& layout, comm::Group& group, const GradSyncOptions& opts,
                   std::unique_ptr<Reducer> reducer, std::unique_ptr<GradSink> sink)
      : GradSync(std::move(reducer), std::move(sink)),
        layout_(layout),
        group_(group),
        opts_(opts),
        tracker_(layout),
        pipeline_(layout.buffer_numel(), layout.chunk_numel(),
                  at::TensorOptions().dtype(opts.comm_dtype).device(opts.device), kPoolBuffers,
                  opts.release_between_steps),
        bucket_buffer_(layout.buckets().size(), -1),
        deferred_(layout.params().size()),
        late_(layout.params().size()) {}

  void begin_backward(bool /*boundary: every pass is reduced*/, const std::vector<int>& expected,
                      bool counting) override {
    // A first pass through checkpointed blocks cannot know how many gradients their parameters
    // deliver: guess one each, so that buckets are released as they fill instead of the whole
    // gradient waiting for the end of backward; a parameter that delivers more (one shared by
    // several blocks) has its later gradients reduced once backward ended (end_backward).
    guessing_ = std::count(expected.begin(), expected.end(), kUnknownArrivals) > 0;
    // Whether this rank guesses depends on its own graph (data-dependent checkpointing can put a
    // checkpointed block in one rank's graph and not another's), so the agreement on late
    // gradients runs on every rank's counting pass, guessing or not: a collective one rank
    // skips would hang the others.
    agree_late_ = counting || guessing_;
    tracker_.reset(expected, /*guess_unknown=*/true);
    std::fill(bucket_buffer_.begin(), bucket_buffer_.end(), -1);
    launch_ready();  // buckets whose parameters the loss does not reach at all
  }

  void on_grad(int param, const at::Tensor& grad) override {
    const ParamSlot& p = layout_.params()[param];
    const int arrived = tracker_.mark(param);
    if (arrived == 0) {  // its bucket was reduced already: see begin_backward
      late_[param] = late_[param].defined() ? late_[param] + grad : grad;
      return;
    }
    const bool first = arrived == 1;
    if (bucket_buffer_[p.bucket] < 0 && fits(p.bucket) &&
        tracker_.position(p.bucket) < tracker_.next() + kPoolBuffers) {
      take_buffer(p.bucket);
    }
    if (bucket_buffer_[p.bucket] >= 0) {
      add_to_bucket(param, grad, first);
    } else if (deferred_[param].defined()) {
      deferred_[param] = deferred_[param] + grad;
    } else {
      deferred_[param] = grad;  // autograd's tensor: the engine drops only its own reference
    }
    launch_ready();
  }

  void end_backward() override {
    // Buckets holding parameters unused in this pass: their missing gradients are zeros.
    for (int b = tracker_.next_unreleased(); b >= 0; b = tracker_.next_unreleased()) {
      launch(b);
      ++counters_.launched_after_backward;
    }
    if (agree_late_) launch_late();
    counters_.wait_seconds += pipeline_.drain();
    sink_->finish();
    // Stage 3 keeps the buffers for the window's next micro-step, as it keeps the shard, and
    // frees both in zero_grad(): once per window, not once per backward, where on CUDA the next
    // forward's activations could split the freed blocks and the next backward's first acquire()
    // make the caching allocator free its cache and retry (review 2026-12-07c L1).
  }

  void set_release_order(const std::vector<int>& order) override { tracker_.set_order(order); }

  void abort() override {
    pipeline_.abort();
    sink_->abort();
    std::fill(bucket_buffer_.begin(), bucket_buffer_.end(), -1);
    for (auto& d : deferred_) d.reset();
    for (auto& d : late_) d.reset();
    tracker_.reset();
    sink_->new_window();
    if (opts_.release_between_steps) pipeline_.free_buffers();  // sink_->abort() waited
  }

  // Stage 3: after the step read the shard, nothing of the gradient path stays (FSDP2's
  // set_to_none). end_backward drained every reduction and finish() waited for the copies to
  // the host that read the buffers under offload, so none is in flight.
  void zero_grad() override {
    sink_->new_window();
    if (opts_.release_between_steps) pipeline_.free_buffers();
  }
  GradPathBytes bytes() const override { return path_bytes(pipeline_, 0); }

  void launch_ready() override {
    for (int b = tracker_.next_ready(gate_); b >= 0; b = tracker_.next_ready(gate_)) {
      launch(b);
      ++counters_.launched_in_backward;
    }
  }

 private:
  // Takes a pool buffer for bucket `b` and zeroes it: padding and parameters without a gradient
  // in this pass contribute zeros.
  void take_buffer(int b) {
    const int buf = pipeline_.acquire();
    if (buf < 0) return;
    bucket_buffer_[b] = buf;
    pipeline_.buffer(buf).in.narrow(0, 0, layout_.buckets()[b].shard.padded_numel()).zero_();
  }

  void add_to_bucket(int param, const at::Tensor& grad, bool first) {
    const ParamSlot& p = layout_.params()[param];
    const BucketSlot& bucket = layout_.buckets()[p.bucket];
    at::Tensor dst = pipeline_.buffer(bucket_buffer_[p.bucket])
                         .in.narrow(0, p.flat_offset - bucket.flat_offset, p.numel);
    if (first) {
      dst.copy_(grad.reshape({-1}));
    } else {
      dst.add_(grad.reshape({-1}).to(dst.scalar_type()));
    }
  }

  bool fits(int b) const {
    return layout_.buckets()[b].shard.shard_numel() <= layout_.chunk_numel();
  }

  void launch(int b) {
    if (!fits(b)) {
      launch_chunked(b);
      return;
    }
    const BucketSlot& bucket = layout_.buckets()[b];
    if (bucket_buffer_[b] < 0) take_buffer(b);
    // The bucket released next always finds a buffer (see the file comment).
    TORCH_INTERNAL_ASSERT(bucket_buffer_[b] >= 0, "zero: no free bucket buffer for bucket ", b);
    for (int param : bucket.params) {
      if (!deferred_[param].defined()) continue;
      at::Tensor g = std::move(deferred_[param]);
      deferred_[param].reset();
      // Gradients that arrived before the buffer did come first; later ones were added in.
      add_to_bucket(param, g, /*first=*/false);
    }
    const int64_t S = bucket.shard.shard_numel();
    const int buf = bucket_buffer_[b];
    reduce(b, slot(b), buf, pipeline_.buffer(buf).in.narrow(0, 0, bucket.shard.padded_numel()),
           sink_->window(bucket.shard_offset, S), "");
    launched(b);
  }

  // The gradients that arrived after their bucket was reduced on a guessing pass, reduced bucket
  // by bucket, in index order, and added to the shard. Ranks need not have the same late
  // gradients (one may have guessed, another not): they agree on the buckets first (one small
  // all-reduce, on the counting pass only, by every rank) and each bucket any rank has late
  // gradients for is reduced by all, with zeros where a rank has none.
  void launch_late() {
    const int64_t n = static_cast<int64_t>(layout_.buckets().size());
    at::Tensor flags = at::zeros({n}, at::TensorOptions().dtype(at::kFloat).device(opts_.device));
    std::vector<float> mine(n, 0.0f);
    for (size_t p = 0; p < late_.size(); ++p) {
      if (late_[p].defined()) mine[layout_.params()[p].bucket] = 1.0f;
    }
    flags.copy_(at::tensor(mine));
    group_.all_reduce_sum(flags, "all_reduce of the buckets with late gradients").wait();
    flags = flags.cpu();
    for (int b = 0; b < n; ++b) {
      if (flags[b].item<float>() == 0.0f) continue;
      if (!fits(b)) {
        launch_chunked(b, late_);
        continue;
      }
      const BucketSlot& bucket = layout_.buckets()[b];
      const int buf = pipeline_.acquire();
      TORCH_INTERNAL_ASSERT(buf >= 0, "zero: no free bucket buffer for bucket ", b);
      at::Tensor in = pipeline_.buffer(buf).in.narrow(0, 0, bucket.shard.padded_numel());
      in.zero_();
      for (int param : bucket.params) {
        if (!late_[param].defined()) continue;
        const ParamSlot& p = layout_.params()[param];
        in.narrow(0, p.flat_offset - bucket.flat_offset, p.numel)
            .add_(late_[param].reshape({-1}).to(in.scalar_type()));
        late_[param].reset();
      }
      reduce(b, slot(b), buf, in, sink_->window(bucket.shard_offset, bucket.shard.shard_numel()),
             " (gradients after its first reduction)");
    }
  }

  // A bucket larger than a buffer: chunk by chunk from autograd's gradients (`grads`, per
  // parameter), each chunk through a pool buffer (acquire finishes the oldest reduction when
  // both are busy).
  void launch_chunked(int b) { launch_chunked(b, deferred_); }
  void launch_chunked(int b, std::vector<at::Tensor>& grads) {
    const BucketSlot& bucket = layout_.buckets()[b];
    const std::vector<BucketChunk> chunks = bucket_chunks(bucket, layout_.chunk_numel());
    for (size_t k = 0; k < chunks.size(); ++k) {
      const BucketChunk& c = chunks[k];
      const int buf = pipeline_.acquire();
      TORCH_INTERNAL_ASSERT(buf >= 0, "zero: no free bucket buffer for bucket ", b);
      at::Tensor in = pipeline_.buffer(buf).in.narrow(0, 0, layout_.world() * c.numel);
      in.zero_();  // padding and parameters without a gradient in this pass
      for (int param : bucket.params) {
        if (!grads[param].defined()) continue;
        pack_chunk(in, bucket, c, layout_.params()[param].flat_offset - bucket.flat_offset,
                   grads[param].reshape({-1}));
      }
      reduce(b, slot(b) + static_cast<int>(k), buf, in,
             sink_->window(bucket.shard_offset + c.offset, c.numel),
             " (chunk " + std::to_string(k) + ")");
    }
    for (int param : bucket.params) grads[param].reset();
    if (&grads == &deferred_) launched(b);
  }

  // The error-feedback slot of bucket b's first reduction (make_quantized_reduce).
  int slot(int b) const { return reducer_->first_slot(b); }

  // Reduces `in` (world x mine.numel() elements, communication dtype) and adds this rank's
  // part to `mine`; `slot`: the reduction's error-feedback slot under compression.
  void reduce(int b, int slot, int buf, at::Tensor in, at::Tensor mine, const std::string& part) {
    const int64_t S = mine.numel();
    at::Tensor out = pipeline_.buffer(buf).out.narrow(0, 0, S);
    const std::string what = "reduce_scatter of gradient bucket " + std::to_string(b) + part;
    comm::Work work = reducer_->reduce(slot, out, in, what);
    // DeepSpeed's stage 2 sums the reduced micro-step gradients in grad_accum_dtype.
    at::Tensor reduced = reducer_->result(out, in);
    pipeline_.push(std::move(work), buf, [this, reduced, mine, buf] {
      sink_->take(reduced, mine, /*add=*/true, pipeline_, buf);
    });
    if (!opts_.overlap) counters_.wait_seconds += pipeline_.drain();
  }

  const FlatLayout& layout_;
  comm::Group& group_;
  GradSyncOptions opts_;
  BucketTracker tracker_;
  BucketPipeline pipeline_;
  std::vector<int> bucket_buffer_;    // pool buffer of each bucket in this pass, or -1
  std::vector<at::Tensor> deferred_;  // gradients waiting for their bucket's buffer
  std::vector<at::Tensor> late_;      // gradients after their bucket's reduction (see on_grad)
  bool guessing_ = false;             // this pass guesses some counts (begin_backward)
  bool agree_late_ = false;           // this pass ends with the late-gradient agreement
};

}  // namespace

std::unique_ptr<GradSync> make_partitioned_grads(const FlatLayout& layout, comm::Group& group,
                                                 const GradSyncOptions& opts,
                                                 std::unique_ptr<Reducer> reducer,
                                                 std::unique_ptr<GradSink> sink) {
  return std::make_unique<PartitionedGrads>(layout, group, opts, std::move(reducer),
                                            std::move(sink));
}

std::unique_ptr<GradSync> make_partitioned_grads(const FlatLayout& layout, comm::Group& group,
                                                 const GradSyncOptions& opts) {
  // The reducer before the sink, as the pieces were built before (neither communicates).
  auto reducer = make_reducer(layout, group, /*sharded=*/true, opts);
  auto sink = make_shard_sink(layout, opts);
  return make_partitioned_grads(layout, group, opts, std::move(reducer), std::move(sink));
}

}  // namespace zero
