// Stage 2: no full-size gradient outlives a micro-step. Autograd's gradient of each parameter is
// copied into its bucket's communication buffer and freed; a complete bucket is reduce-scattered
// at once, overlapping the rest of backward, and the rank's part is added to its fp32 shard.
#include <ATen/ATen.h>

#include "zero/grad_buckets.hpp"
#include "zero/grad_sync.hpp"

namespace zero {
namespace {

class PartitionedGrads final : public GradSync {
 public:
  PartitionedGrads(const FlatLayout& layout, comm::Group& group, const GradSyncOptions& opts)
      : layout_(layout),
        group_(group),
        opts_(opts),
        tracker_(layout),
        pipeline_(layout.max_bucket_numel(), layout.max_bucket_numel() / layout.world(),
                  at::TensorOptions().dtype(opts.comm_dtype).device(opts.device), /*buffers=*/2),
        bucket_buffer_(layout.buckets().size(), -1) {
    shard_ = at::zeros({layout.shard_numel()},
                       at::TensorOptions().dtype(at::kFloat).device(opts.device));
  }

  void begin_backward(bool /*boundary: every pass is reduced*/) override {
    tracker_.reset();
    std::fill(bucket_buffer_.begin(), bucket_buffer_.end(), -1);
  }

  void on_grad(int param, const at::Tensor& grad) override {
    const ParamSlot& p = layout_.params()[param];
    tracker_.mark(param);
    at::Tensor in = bucket_input(p.bucket);
    in.narrow(0, p.flat_offset - layout_.buckets()[p.bucket].flat_offset, p.numel)
        .copy_(grad.reshape({-1}));
    for (int b = tracker_.next_ready(); b >= 0; b = tracker_.next_ready()) {
      launch(b);
      ++counters_.launched_in_backward;
    }
  }

  void end_backward() override {
    // Buckets holding parameters unused in this pass: their missing gradients are zeros.
    for (int b = tracker_.next_unreleased(); b >= 0; b = tracker_.next_unreleased()) {
      launch(b);
      ++counters_.launched_after_backward;
    }
    counters_.wait_seconds += pipeline_.drain();
  }

  at::Tensor& grad_shard() override { return shard_; }
  void zero_grad() override { shard_.zero_(); }
  int64_t grad_bytes() const override { return shard_.nbytes(); }
  int64_t comm_buffer_bytes() const override { return pipeline_.bytes(); }

 private:
  // The bucket's buffer, taken from the pool (and zeroed: padding and parameters without a
  // gradient in this pass contribute zeros) on its first gradient.
  at::Tensor bucket_input(int b) {
    const int64_t padded = layout_.buckets()[b].shard.padded_numel();
    if (bucket_buffer_[b] < 0) {
      bucket_buffer_[b] = pipeline_.acquire();
      pipeline_.buffer(bucket_buffer_[b]).in.narrow(0, 0, padded).zero_();
    }
    return pipeline_.buffer(bucket_buffer_[b]).in.narrow(0, 0, padded);
  }

  void launch(int b) {
    const BucketSlot& bucket = layout_.buckets()[b];
    const int64_t S = bucket.shard.shard_numel();
    at::Tensor in = bucket_input(b);
    const int buf = bucket_buffer_[b];
    at::Tensor out = pipeline_.buffer(buf).out.narrow(0, 0, S);
    at::Tensor mine = shard_.narrow(0, bucket.shard_offset, S);
    const std::string what = "reduce_scatter of gradient bucket " + std::to_string(b);
    if (opts_.reduce_scatter) {
      auto work = group_.reduce_scatter_sum(out, in, what);
      pipeline_.push(std::move(work), buf, [out, mine] { mine.add_(out); });
    } else {
      auto work = group_.all_reduce_sum(in, what);
      const int rank = group_.rank();
      pipeline_.push(std::move(work), buf,
                     [in, mine, rank, S] { mine.add_(in.narrow(0, rank * S, S)); });
    }
    if (!opts_.overlap) counters_.wait_seconds += pipeline_.drain();
  }

  const FlatLayout& layout_;
  comm::Group& group_;
  GradSyncOptions opts_;
  BucketTracker tracker_;
  BucketPipeline pipeline_;
  std::vector<int> bucket_buffer_;  // pool buffer of each bucket in this pass, or -1
  at::Tensor shard_;
};

}  // namespace

std::unique_ptr<GradSync> make_partitioned_grads(const FlatLayout& layout, comm::Group& group,
                                                 const GradSyncOptions& opts) {
  return std::make_unique<PartitionedGrads>(layout, group, opts);
}

}  // namespace zero
