#include "zero/grads/grad_sink.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <iterator>

#include "device/pinned_host.hpp"
#include "zero/grads/grad_sync.hpp"
#include "zero/grads/grad_to_host.hpp"
#include "zero/host_counting.hpp"

namespace zero {
namespace {

class DeviceShard final : public GradSink {
 public:
  DeviceShard(int64_t numel, const GradSyncOptions& opts,
              const std::vector<std::pair<int64_t, int64_t>>& units)
      : accum_dtype_(opts.accum_dtype),
        numel_(numel),
        // In grad_accum_dtype (bf16: half of an fp32 shard), the values accumulate()'s rounding
        // gives.
        options_(at::TensorOptions().dtype(grad_storage_dtype(opts, false)).device(opts.device)),
        on_demand_(opts.release_between_steps) {
    if (on_demand_ && units.size() > 1) {
      for (const auto& [begin, end] : units) {
        TORCH_INTERNAL_ASSERT(pieces_.empty() || pieces_.back().end <= begin,
                              "zero: the units' shard windows are out of order");
        if (end > begin) pieces_.push_back({begin, end, {}});
      }
    }
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
      for (Piece& p : pieces_) p.values.reset();
    } else {
      shard_.zero_();
    }
  }
  at::Tensor& shard() override {
    TORCH_INTERNAL_ASSERT(pieces_.empty(),
                          "zero: stage 3's gradient shard is one piece per "
                          "unit; read it through window()");
    if (!shard_.defined()) {
      const HostCountingAllocator::Tag tag(HostTag::kGradShard);  // what a CPU peak is made of
      shard_ = at::zeros({numel_}, options_);
    }
    return shard_;
  }
  bool whole() const override { return pieces_.empty(); }
  at::Tensor window(int64_t offset, int64_t numel) override {
    if (pieces_.empty()) return shard().narrow(0, offset, numel);
    // The last piece that begins at or before `offset`.
    auto it = std::upper_bound(pieces_.begin(), pieces_.end(), offset,
                               [](int64_t o, const Piece& p) { return o < p.begin; });
    TORCH_INTERNAL_ASSERT(it != pieces_.begin(), "zero: gradient shard element ", offset,
                          " is in no unit");
    Piece& p = *std::prev(it);
    TORCH_INTERNAL_ASSERT(offset + numel <= p.end, "zero: gradient shard window [", offset, ", ",
                          offset + numel, ") crosses the end of its unit's piece at ", p.end);
    if (!p.values.defined()) {
      const HostCountingAllocator::Tag tag(HostTag::kGradShard);  // what a CPU peak is made of
      p.values = at::zeros({p.end - p.begin}, options_);
    }
    return p.values.narrow(0, offset - p.begin, numel);
  }
  SinkBytes bytes() const override {
    int64_t held = shard_.defined() ? static_cast<int64_t>(shard_.nbytes()) : 0;
    for (const Piece& p : pieces_) {
      if (p.values.defined()) held += static_cast<int64_t>(p.values.nbytes());
    }
    return {held, 0, 0};
  }

 private:
  struct Piece {
    int64_t begin, end;  // the unit's window of the shard
    at::Tensor values;   // undefined until the window's first reduction into it
  };
  at::ScalarType accum_dtype_;
  int64_t numel_;
  at::TensorOptions options_;
  bool on_demand_;
  at::Tensor shard_;
  std::vector<Piece> pieces_;  // stage 3, several units: the shard is these
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

std::unique_ptr<GradSink> make_device_shard(int64_t numel, const GradSyncOptions& opts,
                                            const std::vector<std::pair<int64_t, int64_t>>& units) {
  return std::make_unique<DeviceShard>(numel, opts, units);
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
  std::vector<std::pair<int64_t, int64_t>> units;
  for (const UnitSlot& u : layout.units()) units.emplace_back(u.shard_begin, u.shard_end);
  return make_device_shard(layout.shard_numel(), opts, units);
}

}  // namespace zero
