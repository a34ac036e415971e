#include "zero/grads/grad_sink.hpp"

#include <ATen/ATen.h>

#include "device/pinned_host.hpp"
#include "zero/grads/grad_sync.hpp"
#include "zero/grads/grad_to_host.hpp"

namespace zero {
namespace {

class DeviceShard final : public GradSink {
 public:
  DeviceShard(int64_t numel, const GradSyncOptions& opts)
      : accum_dtype_(opts.accum_dtype),
        numel_(numel),
        // In grad_accum_dtype (bf16: half of an fp32 shard), the values accumulate()'s rounding
        // gives.
        options_(at::TensorOptions().dtype(grad_storage_dtype(opts, false)).device(opts.device)),
        on_demand_(opts.release_between_steps) {
    if (!on_demand_) shard_ = at::zeros({numel_}, options_);
  }
  void take(const at::Tensor& reduced, const at::Tensor& dst, bool add, BucketPipeline&,
            int) override {
    if (add) {
      at::Tensor d = dst;
      accumulate(d, reduced, accum_dtype_);
    } else if (!reduced.is_same(dst)) {  // else reduced in place
      const_cast<at::Tensor&>(dst).copy_(reduced);
    }
  }
  // On demand (stage 3) the shard's bytes go back until the next window's first reduction: the
  // zeros it starts from then are the ones zero_() gave, so the sums are the same bit for bit.
  void new_window() override {
    if (on_demand_) {
      shard_.reset();
    } else {
      shard_.zero_();
    }
  }
  at::Tensor& shard() override {
    if (!shard_.defined()) shard_ = at::zeros({numel_}, options_);
    return shard_;
  }
  SinkBytes bytes() const override {
    return {shard_.defined() ? static_cast<int64_t>(shard_.nbytes()) : 0, 0, 0};
  }

 private:
  at::ScalarType accum_dtype_;
  int64_t numel_;
  at::TensorOptions options_;
  bool on_demand_;
  at::Tensor shard_;
};

class InPlace final : public GradSink {
 public:
  explicit InPlace(const at::Tensor& acc) : acc_(acc) {}
  void take(const at::Tensor&, const at::Tensor&, bool, BucketPipeline&, int) override {}
  // The collector zeroes its accumulator.
  void new_window() override {}
  at::Tensor& shard() override { return acc_; }
  SinkBytes bytes() const override { return {}; }

 private:
  at::Tensor acc_;
};

class HostShard final : public GradSink {
 public:
  HostShard(int64_t numel, int64_t chunk_numel, const GradSyncOptions& opts)
      : shard_(device::host_zeros(numel, opts.pin_memory)),
        to_host_(opts.device, chunk_numel, opts.comm_dtype, opts.accum_dtype) {}
  void take(const at::Tensor& reduced, const at::Tensor& dst, bool add, BucketPipeline& pipeline,
            int buf) override {
    // The shard leaves for the host now (the collective's wait() ordered the current stream
    // after it), and the buffer is reused only after the copy read it.
    GradToHost::Ticket t = to_host_.send(reduced, dst, add);
    pipeline.before_reuse(buf, [this, t] { to_host_.wait(t); });
  }
  // The host shard is read by the step from now on, so every copy lands here.
  void finish() override { to_host_.finish(shard_); }
  // The host shard is not touched; the next window's first pieces overwrite it.
  void new_window() override { to_host_.new_window(); }
  void abort() override { to_host_.abort(); }
  at::Tensor& shard() override { return shard_; }
  SinkBytes bytes() const override {
    return {static_cast<int64_t>(shard_.nbytes()), to_host_.bytes(), to_host_.pinned_bytes()};
  }
  at::Tensor device_squared_norm() const override { return to_host_.squared_norm(); }

 private:
  at::Tensor shard_;
  GradToHost to_host_;
};

}  // namespace

std::unique_ptr<GradSink> make_device_shard(int64_t numel, const GradSyncOptions& opts) {
  return std::make_unique<DeviceShard>(numel, opts);
}
std::unique_ptr<GradSink> make_in_place_sink(const at::Tensor& acc) {
  return std::make_unique<InPlace>(acc);
}
std::unique_ptr<GradSink> make_host_shard(int64_t numel, int64_t chunk_numel,
                                          const GradSyncOptions& opts) {
  return std::make_unique<HostShard>(numel, chunk_numel, opts);
}
int64_t host_shard_bytes(int64_t numel, int64_t chunk_numel, const GradSyncOptions& opts) {
  return 4 * numel + GradToHost::ring_bytes(chunk_numel, opts.comm_dtype);
}
std::unique_ptr<GradSink> make_shard_sink(const FlatLayout& layout, const GradSyncOptions& opts) {
  if (opts.host_shard) return make_host_shard(layout.shard_numel(), layout.chunk_numel(), opts);
  return make_device_shard(layout.shard_numel(), opts);
}

}  // namespace zero
